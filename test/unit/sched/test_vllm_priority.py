"""`vllm-priority`: vLLM's own priority scheduling with each task's urgency class as the request
priority, streamed dispatch, no segmentation. Under load, urgent requests are admitted first, by
the engine (slots) and by the scheduler's queue in front of it (KV cache full)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from timelyllm_ros.core.engine.base import engine_priority
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import NoPrefixCacheEngine, SimulatedEngine
from timelyllm_ros.core.policies import DEFAULT_POLICY, QueueView, get_policy, initial_row
from timelyllm_ros.core.policies.registry import policy_names
from timelyllm_ros.core.sched.interface import GenerationInfo
from timelyllm_ros.core.tuf import TUF

from fakes import assert_no_leaks, drive, make, spec

NORMAL = TUF(1.0, 2.0, 1.0)
URGENT = TUF(0.2, 6.67, 2.0)
NORMAL_TRACES = (1, 2, 3, 4, 5, 1)
URGENT_TRACE = 6


def test_vllm_priority_is_streamed_fcfs_with_engine_priority():
    p = get_policy("vllm-priority")
    assert p.name == "vllm-priority"
    assert p.dispatch == "stream" and not p.segmented and not p.latency_guided_admission
    assert p.engine_needs().scheduling_policy == "priority"
    assert p.engine_needs().simulated_engine is None  # the plain simulated engine


def test_service_class_gives_urgent_tasks_the_higher_vllm_priority():
    p = get_policy("vllm-priority")

    def gen(urgent: bool) -> GenerationInfo:
        return GenerationInfo("t", urgent, 1.0, 10, 400, "drone")

    assert engine_priority(p.service_class(gen(True), 0.0)) < \
        engine_priority(p.service_class(gen(False), 0.0))


def test_queue_order_is_class_then_arrival():
    view = QueueView.from_rows([
        initial_row(NORMAL, arrival_s=1.0),
        initial_row(URGENT, arrival_s=5.0, is_urgent=True),
        initial_row(NORMAL, arrival_s=0.5),
        initial_row(URGENT, arrival_s=3.0, is_urgent=True),
    ])
    order = list(np.argsort(-get_policy("vllm-priority").priorities(view, 10.0)))
    assert order == [3, 1, 2, 0]  # urgent by arrival, then normal by arrival
    # vllm-stream is plain FCFS over the same queue.
    assert list(np.argsort(-get_policy("vllm-stream").priorities(view, 10.0))) == [2, 0, 3, 1]


def _burst(policy: str, engine: SimulatedEngine):
    """Six normal drone tasks at t = 0, already in the engine (one step has run), then one urgent
    task; returns (scheduler, the normal tasks' ids, the urgent task's id)."""
    sch, eng, lis = make(policy, engine=engine)
    normal = [f"n{i}" for i in range(len(NORMAL_TRACES))]
    for task_id, trace in zip(normal, NORMAL_TRACES):
        sch.submit(spec(task_id, trace, eng))
    sch.tick()
    sch.submit(spec("u", URGENT_TRACE, eng))
    drive(sch, eng, lis)
    assert_no_leaks(sch, eng)
    assert all(sch.tasks[t].state == "done" for t in [*normal, "u"])
    return sch, normal, "u"


def _engines():
    # Two slots, KV for everything: requests wait in the engine's own queue.
    slots = lambda policy: SimulatedEngine(  # noqa: E731
        max_num_seqs=2, scheduling_policy=get_policy(policy).engine_scheduling)
    # KV for two requests (no prefix cache to share the prompts' fixed part), many slots.
    kv = lambda policy: NoPrefixCacheEngine(  # noqa: E731
        dataclasses.replace(EngineProfile(), kv_total_blocks=60),
        scheduling_policy=get_policy(policy).engine_scheduling)
    return {"slots": slots, "kv": kv}


def _first_dispatch(sch, task_id: str) -> float:
    return sch.tasks[task_id].segments[0].dispatched_s


@pytest.mark.parametrize("bottleneck", ["slots", "kv"])
def test_urgent_request_is_admitted_first_under_load(bottleneck):
    build = _engines()[bottleneck]
    prio, normal, urgent = _burst("vllm-priority", build("vllm-priority"))
    fcfs, _, _ = _burst("vllm-stream", build("vllm-stream"))

    def served_before(sch) -> int:
        """Normal tasks (all in the engine before the urgent one came) whose first segment went
        out before the urgent task's."""
        u = _first_dispatch(sch, urgent)
        return sum(1 for t in normal if _first_dispatch(sch, t) < u)

    # The burst overloads the engine: under FCFS the urgent task waits behind all of it...
    assert served_before(fcfs) == len(normal)
    # ...under vLLM's priority scheduling it overtakes every normal task still waiting (only
    # the two that were already running when it arrived answer before it).
    assert served_before(prio) <= 2
    assert prio.tasks[urgent].response_time_s < 0.5 * fcfs.tasks[urgent].response_time_s


def test_without_contention_vllm_priority_equals_vllm_stream():
    out = {}
    for policy in ("vllm-stream", "vllm-priority"):
        sch, eng, lis = make(policy, engine=SimulatedEngine(
            scheduling_policy=get_policy(policy).engine_scheduling))
        sch.submit(spec("a", 1, eng))
        sch.submit(spec("b", URGENT_TRACE, eng))
        drive(sch, eng, lis)
        out[policy] = {t: (r.response_time_s, r.utility) for t, r in sch.tasks.items()}
    assert out["vllm-stream"] == out["vllm-priority"]


def test_default_policy_is_a_known_policy():
    assert DEFAULT_POLICY in policy_names()
    assert get_policy(DEFAULT_POLICY).name == DEFAULT_POLICY
