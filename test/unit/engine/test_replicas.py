"""The replica router (core/engine/replicas.py) over simulated engines sharing one clock:
affinity (a task's runs stay on one replica), balance (new plans go where capacity is free), and
faults (a replica down at start, a replica that dies with plans on it)."""

from __future__ import annotations

import pytest

from fakes import EXEC_MODEL_PATH, LEVELS, SKILL_SETS, TRACES, Listener, Robots, drive
from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.replicas import (NoReplicaAvailable, Replica, ReplicaEngine,
                                                affinity_key)
from timelyllm_ros.core.engine.sim.realtime import realtime
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.core.task import TaskSpec


class Clock:
    """One virtual wall clock for every replica: sleeping advances it."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def sleep(self, d):
        self.t += max(0.0, d)


def _replicas(clock, n=2, health=None, broken=()):
    engine_cls = realtime(SimulatedEngine)

    def build(i):
        if i in broken:
            raise ConnectionError(f"server {i} refused the connection")
        return engine_cls(clock=clock, sleep=clock.sleep)

    return [Replica(f"r{i}", build=lambda i=i: build(i), health=health) for i in range(n)]


def _scheduler(engine):
    return SegmentScheduler(engine, get_policy("timelyllm"), SKILL_SETS,
                            ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH), Listener(),
                            SchedulerConfig(network_latency_s=0.008))


def _spec(engine, task_id, i):
    trace = list(TRACES.values())[i % 8]  # drone traces
    return TaskSpec(task_id, f"robot_{task_id}", trace.skill_set, trace.instruction,
                    LEVELS.get(trace.tuf_level), engine.now(), trace.tuf_level,
                    scripted_plan=trace.plan)


class Placement:
    """Records which replica every run (engine request) went to."""

    def __init__(self, engine):
        self.runs: dict[str, list[str]] = {}
        original = engine.add_request

        def add(request):
            original(request)
            self.runs.setdefault(affinity_key(request.request_id), []).append(
                engine.replica_of(request.request_id))

        engine.add_request = add


def test_resumes_stay_on_their_replica_and_new_plans_are_balanced():
    clock = Clock()
    engine = ReplicaEngine(_replicas(clock))
    placement = Placement(engine)
    sch = _scheduler(engine)
    sch.warm_prefix_cache()
    ids = [f"t{i}" for i in range(8)]
    for i, tid in enumerate(ids):
        sch.submit(_spec(engine, tid, i))
    drive(sch, engine, sch.listener, robots=Robots(lambda tid, seg: 0.3))
    assert all(sch.tasks[t].state == "done" for t in ids)
    for tid in ids:
        runs = placement.runs[tid]
        assert len(runs) == sch.tasks[tid].engine_requests >= 2, (tid, runs)
        assert len(set(runs)) == 1, f"{tid} moved between replicas: {runs}"
    homes = [placement.runs[t][0] for t in ids]
    assert abs(homes.count("r0") - homes.count("r1")) <= 1, homes
    assert engine.stats.moved == 0 and not engine.has_unfinished_requests()
    assert engine._task_home == {} and engine._where == {}


def test_new_plans_go_to_the_replica_with_free_capacity():
    clock = Clock()
    engine = ReplicaEngine(_replicas(clock))
    busy = engine.replicas[0]
    # Fill some of r0's KV with long running requests.
    for i in range(4):
        busy.engine.add_request(EngineRequest(f"hog{i}#0", list(range(i * 9000, i * 9000 + 8000)),
                                              10, scripted_text="a b c d e f g h i j"))
    busy.engine.step()
    assert busy.engine.kv_usage().free_blocks < engine.replicas[1].engine.kv_usage().free_blocks
    engine.add_request(EngineRequest("fresh#0", [1, 2, 3], 4, scripted_text="a b"))
    assert engine.replica_of("fresh#0") == "r1"


def test_a_replica_down_at_start_is_left_out_and_probed_again():
    clock = Clock()
    replicas = _replicas(clock, broken={0})
    engine = ReplicaEngine(replicas, reprobe_s=0.0)
    assert replicas[0].engine is None and "refused the connection" in replicas[0].down_reason
    engine.add_request(EngineRequest("a#0", [1, 2], 2, scripted_text="x y"))
    assert engine.replica_of("a#0") == "r1"
    with pytest.raises(NoReplicaAvailable, match="refused the connection"):
        ReplicaEngine(_replicas(clock, n=1, broken={0}))


def test_plans_of_a_dead_replica_move_and_others_keep_being_served():
    clock = Clock()
    dead: set[str] = set()
    replicas = _replicas(clock, health=None)
    for r in replicas:
        r.health = (lambda e, name=r.name: name not in dead)
    engine = ReplicaEngine(replicas)
    placement = Placement(engine)
    sch = _scheduler(engine)
    ids = [f"t{i}" for i in range(4)]
    for i, tid in enumerate(ids):
        sch.submit(_spec(engine, tid, i))
    # Run until every task has dispatched a segment (all suspended or running).
    drive(sch, engine, sch.listener, robots=Robots(lambda tid, seg: 0.5),
          until=lambda s: all(s.tasks[t].segments for t in ids))
    dead.add("r0")
    on_r0 = [t for t in ids if placement.runs[t][0] == "r0"]
    assert on_r0
    before = {t: len(placement.runs[t]) for t in ids}
    drive(sch, engine, sch.listener)
    assert all(sch.tasks[t].state == "done" for t in ids), {t: sch.tasks[t].state for t in ids}
    for tid in on_r0:
        later = placement.runs[tid][before[tid]:]
        assert later and set(later) == {"r1"}, (tid, placement.runs[tid])
    assert engine.stats.moved >= len(on_r0)
    assert not engine.has_unfinished_requests()
