"""The processes of a vLLM deployment (bench/vllm_deployment.py) leave nothing behind, without
vLLM: a stand-in server runs a child that, like vLLM's `VLLM::EngineCore`, shrugs off SIGTERM
and does not watch for its parent's death. Killing the server alone would orphan that child (the
leak `test_openai_server.py` had: a 2 GB engine core left running after every test run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from timelyllm_ros.bench.vllm_deployment import ServerProcess, group_pids

# The stand-in `vllm serve`: starts an engine child that ignores SIGTERM, writes its pid, and on
# SIGTERM shuts the child down itself, as vllm serve does.
SERVER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    def term(*_):
        child.kill(); child.wait(); sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    open(sys.argv[1] + ".tmp", "w").write(str(child.pid))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(600)
""")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_for(path: Path, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.02)
    return int(path.read_text())


def stand_in(tmp_path: Path) -> tuple[ServerProcess, Path]:
    pid_file = tmp_path / "engine.pid"
    server = ServerProcess("stand-in", "http://127.0.0.1:9", [sys.executable, "-c", SERVER,
                                                              str(pid_file)],
                           tmp_path / "server.log")
    return server, pid_file


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_the_engine_child_does_not_outlive_its_server(tmp_path, how):
    server, pid_file = stand_in(tmp_path)
    server.start()
    try:
        engine = wait_for(pid_file)
        assert alive(engine) and engine in group_pids(server.proc.pid)
        getattr(server, how)()
        assert not server.alive()
        assert not alive(engine), f"the engine child outlived its server's {how}()"
        assert not group_pids(server.proc.pid)
    finally:
        os.killpg(server.proc.pid, signal.SIGKILL) if group_pids(server.proc.pid) else None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_goes_down_with_an_owner_killed_without_stopping_it(tmp_path):
    # The owner (a `timelyllm router-compare`, a test run) is SIGKILLed: it cannot stop its
    # servers, which live in sessions of their own; they get SIGTERM from the kernel instead.
    pid_file = tmp_path / "engine.pid"
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from timelyllm_ros.bench.vllm_deployment import ServerProcess
        s = ServerProcess("stand-in", "http://127.0.0.1:9",
                          [sys.executable, "-c", {SERVER!r}, {str(pid_file)!r}],
                          __import__("pathlib").Path({str(tmp_path / "server.log")!r}))
        s.start()
        print(s.proc.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        server = int(owner.stdout.readline())
        engine = wait_for(pid_file)
        assert alive(server) and alive(engine)
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 20
    while (alive(server) or alive(engine)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in (server, engine) if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the server or its engine child outlived the owner that started them"
