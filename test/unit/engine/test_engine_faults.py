"""An engine that fails mid-run: every task in flight ends `failed` with the cause, the engine
thread tells its sink once, and nothing more is accepted (issue 20, engine faults).

The planner's engine thread (ros/engine_loop.py, no rclpy in it) runs here in-process with a
fake sink: once on the wall-clock simulated engine with a fault injected on command through the
fence (core/engine/fault_fence.py), and once on the real vLLM engine with vLLM's own
`LLMEngine.step` raising, as a CUDA out-of-memory error would."""

from __future__ import annotations

import threading
import time

import pytest

from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.fault_fence import EngineFault, FencedEngine, InjectedFault
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.validation import GoalFields, validate_goal
from timelyllm_ros.lrtrace.traces import load_traces

pytest.importorskip("rcl_interfaces")  # planner_params builds ROS parameter descriptors

from timelyllm_ros.ros import planner_params  # noqa: E402
from timelyllm_ros.ros.engine_loop import EngineLoop, Refused  # noqa: E402

TRACES = load_traces()


class Sink:
    """The node's side of the engine thread; its robots execute every segment at once."""

    def __init__(self):
        self.loop = None
        self.statuses = {}
        self.segments = []
        self.failures = []
        self.lock = threading.Lock()

    def engine_started(self, engine):
        pass

    def on_segment(self, dispatch):
        with self.lock:
            self.segments.append(dispatch)

        def report(scheduler):
            now = scheduler.engine.now()
            try:
                scheduler.on_report(dispatch.task_id, dispatch.sequence, now, now, True, "ok")
            except (KeyError, ValueError):
                pass  # the task has ended meanwhile

        self.loop.post(report)

    def on_status(self, snapshot):
        with self.lock:
            self.statuses[snapshot.task_id] = snapshot

    def engine_failed(self, reason):
        self.failures.append(reason)


class Log:
    def __getattr__(self, level):
        return lambda message: None


def _settings(**overrides):
    p = {name: spec[0] for name, spec in planner_params.PARAMETERS.items()}
    p.update({name: default for name, (_f, default) in planner_params.ENGINE_PARAMS.items()})
    p.update({"robots": [], "scenes": [], "engine.replicas": [], "warm_prefix_cache": False,
              "report_timeout_min_s": 3600.0})
    p.update(overrides)
    return planner_params.PlannerSettings.from_parameters(p)


def _submit(loop, settings, task_id, trace=9):
    spec = validate_goal(GoalFields(task_id=task_id, robot_id=f"robot_{task_id}", skill_set=TRACES[trace].skill_set,
                                    instruction=TRACES[trace].instruction, urgency="normal",
                                    expected_response_time_s=0.0, decline_slope_per_s=0.0,
                                    initial_utility=0.0),
                         levels=settings.levels, known_robots=None, now_s=loop.engine.now())
    if settings.engine_kind == "sim":
        from dataclasses import replace
        spec = replace(spec, scripted_plan=settings.scripted_plans[spec.instruction])
    assert loop.post(lambda scheduler: scheduler.submit(spec))


def _wait(predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def _check_everything_failed_and_refused(loop, sink, tasks, operation):
    assert _wait(lambda: loop.ended.is_set(), 60), "engine thread did not end after the fault"
    assert len(sink.failures) == 1 and f"engine {operation} failed" in sink.failures[0], sink.failures
    states = {t: (sink.statuses[t].state, sink.statuses[t].reason) for t in tasks}
    assert all(state == "failed" and f"engine {operation} failed" in reason
               for state, reason in states.values()), states
    assert loop.error == sink.failures[0]
    with pytest.raises(Refused, match=f"engine {operation} failed"):
        loop.call(lambda scheduler: None)
    assert loop.post(lambda scheduler: None) is False
    assert not loop.scheduler.active_tasks() and loop.scheduler.queue_length() == 0
    assert not loop.scheduler.running_request_ids()


@pytest.mark.parametrize("operation", ["step", "add_request", "abort_request"])
def test_a_fault_on_command_fails_every_task_with_the_cause(operation):
    settings = _settings(**{"engine.kind": "sim"})
    sink = Sink()
    loop = sink.loop = EngineLoop(settings, sink, Log()).start()
    try:
        assert loop.wait_ready(30), loop.error
        tasks = [f"t{i}" for i in range(3)]
        for task in tasks:
            _submit(loop, settings, task)
        assert _wait(lambda: len(sink.segments) >= 1, 30)
        loop.inject_fault(operation)
        if operation == "add_request":
            _submit(loop, settings, "t_late")
            tasks.append("t_late")
        elif operation == "abort_request":
            # The cancel's abort is what fails: t0 fails with the others, not cancelled.
            loop.post(lambda scheduler: scheduler.cancel("t0", "by the test"))
        _check_everything_failed_and_refused(loop, sink, tasks, operation)
    finally:
        loop.stop(5)


def test_stop_ends_every_task_cancelled_before_the_engine_goes():
    settings = _settings(**{"engine.kind": "sim"})
    sink = Sink()
    loop = sink.loop = EngineLoop(settings, sink, Log()).start()
    assert loop.wait_ready(30), loop.error
    for task in ("a", "b"):
        _submit(loop, settings, task)
    assert _wait(lambda: len(sink.segments) >= 1, 30)
    assert loop.stop(5, reason="planner shutting down")
    assert {s.state for s in sink.statuses.values()} == {"cancelled"}
    assert {s.reason for s in sink.statuses.values()} == {"planner shutting down"}
    assert not sink.failures and loop.error is None


def test_the_fence_turns_any_engine_exception_into_one_fault_and_stays_dead():
    engine = FencedEngine(SimulatedEngine())
    engine.add_request(EngineRequest("r1", list(range(50)), max_tokens=4, scripted_text="tk;ld;"))
    engine.step()
    engine.inject("step")
    with pytest.raises(EngineFault) as info:
        engine.step()
    assert info.value.operation == "step" and isinstance(info.value.cause, InjectedFault)
    with pytest.raises(EngineFault):   # dead: every operation raises the same fault
        engine.add_request(EngineRequest("r2", [1, 2], max_tokens=1, scripted_text="x"))
    engine.abort_request("r1")         # ... but releasing what a task holds still works
    assert engine.evict_paused("r1") == 0 and not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="engine.inject_fault"):
        FencedEngine(SimulatedEngine()).inject("tokenize")


@pytest.mark.vllm
def test_a_fault_inside_vllm_step_fails_every_task_with_the_cause(monkeypatch):
    pytest.importorskip("vllm")
    from timelyllm_ros.core.engine.model_prep import DEFAULT_MODEL_DIR

    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip("bundled model not prepared (run scripts/bootstrap.sh)")
    settings = _settings(**{"engine.kind": "vllm", "model": str(DEFAULT_MODEL_DIR),
                            "engine.kv_cache_bytes": 256 << 20, "engine.max_model_len": 1024,
                            "engine.max_num_seqs": 4})
    sink = Sink()
    loop = sink.loop = EngineLoop(settings, sink, Log()).start()
    try:
        assert loop.wait_ready(300), loop.error
        tasks = ["v0", "v1"]
        for task in tasks:
            _submit(loop, settings, task)
        assert _wait(lambda: loop.stats.get("running", 0) >= 1, 120), loop.stats
        llm_engine = loop.engine.inner._engine   # vLLM's LLMEngine inside our adapter

        def out_of_memory():
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")

        monkeypatch.setattr(llm_engine, "step", out_of_memory)
        _check_everything_failed_and_refused(loop, sink, tasks, "step")
        assert "CUDA out of memory" in sink.failures[0]
    finally:
        loop.stop(30)
