"""A vLLM deployment on loopback for measurements and tests: N `vllm serve` workers (CPU, the
bundled model, KV sized in bytes) and one `vllm-router` in front of them (docs/router.md).

Every process is started here and stopped by `Deployment.stop()` (also on exit of the `with`
block), so nothing outlives the run. Workers start concurrently: on a 2-core machine one start
takes about a minute.

A `vllm serve` runs its engine in a child process (`VLLM::EngineCore`, a multiprocessing child
that vLLM shuts down from the server's exit path only: it does not watch for the server's death).
A SIGKILL to the server alone therefore orphans the engine, with its model and KV cache (GBs).
So every server gets a process group of its own, every signal goes to the whole group, and a
stop or kill returns only once no process of the group is left (`group_pids`). A server also
gets SIGTERM when the thread that started it dies (Linux `PR_SET_PDEATHSIG`), so an owner killed
without a chance to stop it (a SIGTERM'd or SIGKILL'd `timelyllm router-compare`, a test run
killed) does not leave its servers and their engines running: `vllm serve` shuts its engine
core down on SIGTERM. Start servers from a thread that lives as long as they should.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import httpx

from timelyllm_ros.core.engine.worker_metrics import parse_worker_list

# vllm-router's runtime health check, set so a dead worker leaves the ring within about a
# second and a restarted one rejoins as soon as it answers: interval 1 s, one failure marks it
# unhealthy, one success healthy again (the router's defaults: 60 s, 3 and 2).
ROUTER_HEALTH_FLAGS = ("--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                       "--health-success-threshold", "1", "--health-check-timeout-secs", "2",
                       "--worker-startup-check-interval", "1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PR_SET_PDEATHSIG = 1
try:  # resolved here, not in the forked child (preexec_fn runs between fork and exec)
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _term_with_parent(parent: int):
    """A preexec_fn: the child gets SIGTERM when the thread that started it dies."""
    def preexec() -> None:
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
            if os.getppid() != parent:   # the parent died before prctl took effect
                os.kill(os.getpid(), signal.SIGTERM)
    return preexec


def group_pids(pgid: int) -> list[int]:
    """The live processes (zombies left out) of process group `pgid`, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            found.append(int(name))
    return found


def kill_group(pgid: int, timeout_s: float = 30.0) -> None:
    """SIGKILL to every process of group `pgid`, then wait until none is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if not group_pids(pgid):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"process group {pgid} still has {group_pids(pgid)} after SIGKILL")
        time.sleep(0.05)


def router_binary() -> str:
    """The `vllm-router` launcher of this Python environment (requirements/project.txt)."""
    beside = Path(sys.executable).with_name("vllm-router")
    found = str(beside) if beside.is_file() else shutil.which("vllm-router")
    if not found:
        raise FileNotFoundError("vllm-router is not installed (pip install vllm-router==0.1.17; "
                                "scripts/bootstrap.sh installs it)")
    return found


@dataclass
class ServerProcess:
    """One process of the deployment and its log."""

    name: str
    url: str
    argv: list[str]
    log_path: Path
    health_path: str = "/health"
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        with self.log_path.open("a") as log:
            # A session of its own: vllm serve runs its engine core in a child process, and
            # killing the group takes both down (a crash of the server machine, and no orphan).
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True,
                                         preexec_fn=_term_with_parent(os.getpid()))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}{self.health_path}", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_up(self, deadline: float) -> None:
        while not self.answers():
            if not self.alive() or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"{self.name} ({' '.join(self.argv[:4])} ...) did not come "
                                   f"up:\n{tail}")
            time.sleep(0.5)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL to the server and its children (its engine core), as a crash would; returns
        once none of them is left."""
        if self.proc is not None:
            kill_group(self.proc.pid)
            self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM to the group (the server shuts its engine core down), then SIGKILL to
        whatever of it is left; returns once none of it is left."""
        if self.proc is None:
            return
        if self.alive():
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.proc.pid)  # whatever is left: the engine core may outlive the server
        self.proc.wait(30)


@dataclass
class Deployment:
    """`workers` vLLM CPU servers and one vllm-router (`policy`) over them, on loopback."""

    model_dir: Path
    log_dir: Path
    workers: int = 2
    kv_cache_bytes: int = 512 << 20
    max_num_seqs: int = 8
    max_model_len: int = 2048
    policy: str = "consistent_hash"
    worker_flags: Sequence[str] = ()
    servers: list[ServerProcess] = field(default_factory=list)
    router: ServerProcess | None = None

    def worker_argv(self, port: int) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(self.model_dir), "--host", "127.0.0.1", "--port", str(port),
                "--dtype", "float32", "--max-model-len", str(self.max_model_len),
                "--kv-cache-memory-bytes", str(self.kv_cache_bytes), "--enforce-eager",
                "--enable-prompt-tokens-details", "--max-num-seqs", str(self.max_num_seqs),
                *self.worker_flags]

    def start(self, timeout_s: float = 600.0) -> "Deployment":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for i in range(self.workers):
                port = free_port()
                self.servers.append(ServerProcess(f"worker{i}", f"http://127.0.0.1:{port}",
                                                  self.worker_argv(port),
                                                  self.log_dir / f"worker{i}.log"))
            for server in self.servers:
                server.start()
            port = free_port()
            self.router = ServerProcess(
                "vllm-router", f"http://127.0.0.1:{port}",
                [router_binary(), "--host", "127.0.0.1", "--port", str(port),
                 "--worker-urls", *[s.url for s in self.servers], "--policy", self.policy,
                 "--prometheus-port", str(free_port()), "--log-level", "warning",
                 *ROUTER_HEALTH_FLAGS],
                self.log_dir / "router.log", health_path="/workers")
            self.router.start()
            deadline = time.monotonic() + timeout_s
            for server in self.servers:
                server.wait_up(deadline)
            self.router.wait_up(deadline)
            self.wait_router_sees(set(range(self.workers)), deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def worker_urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def healthy_in_router(self) -> set[int]:
        answer = httpx.get(f"{self.router.url}/workers", timeout=5.0).json()
        healthy = {w.url for w in parse_worker_list(answer) if w.healthy}
        return {i for i, s in enumerate(self.servers) if s.url in healthy}

    def wait_router_sees(self, healthy: set[int], deadline: float) -> float:
        """Waits until the router's health check says exactly `healthy`; returns the wait."""
        start = time.monotonic()
        while self.healthy_in_router() != healthy:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the router did not see workers {sorted(healthy)} healthy "
                                   f"in time (it sees {sorted(self.healthy_in_router())})")
            time.sleep(0.2)
        return time.monotonic() - start

    def restart(self, index: int, timeout_s: float = 600.0) -> None:
        server = self.servers[index]
        server.stop()
        server.start()
        server.wait_up(time.monotonic() + timeout_s)

    def stop(self) -> None:
        """Stops every process, also when stopping one of them fails (the first error is
        raised once all were tried)."""
        error: BaseException | None = None
        for server in [self.router, *self.servers]:
            if server is not None:
                try:
                    server.stop()
                except BaseException as err:  # noqa: BLE001 - stop the others first
                    error = error or err
        if error is not None:
            raise error

    def __enter__(self) -> "Deployment":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def prefix_counters(url: str) -> tuple[float, float]:
    """A worker's prefix-cache counters (tokens queried, tokens hit) from its /metrics."""
    queries = hits = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=5.0).text.splitlines():
        if line.startswith("vllm:prefix_cache_queries_total"):
            queries += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
    return queries, hits
