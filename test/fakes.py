"""Shared fakes for scheduler tests: fake robots, a recording listener, and a driver loop
that runs a `SegmentScheduler` on the simulated engine in virtual time."""

from __future__ import annotations

import dataclasses

import heapq
import math
from pathlib import Path

from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.core.skills.skillset import load_skillsets
from timelyllm_ros.core.sched.interface import SegmentDispatch
from timelyllm_ros.core.task import TaskSpec
from timelyllm_ros.core.tuf import load_tuf_levels
from timelyllm_ros.lrtrace.traces import load_traces

REPO = Path(__file__).resolve().parents[1]
SKILL_SETS = load_skillsets(REPO / "config" / "skillsets")
LEVELS = load_tuf_levels(REPO / "config" / "tuf_levels.yaml")
TRACES = load_traces(REPO / "lrtrace" / "traces.yaml")
EXEC_MODEL_PATH = REPO / "config" / "exec_model.yaml"
POLICIES = ["vllm", "vllm-stream", "edf-seg", "fcfs-seg", "timelyllm"]
SEGMENTED = {"edf-seg", "fcfs-seg", "timelyllm"}
LATENCY = 0.008


class Listener:
    def __init__(self):
        self.segments: list[tuple[str, SegmentDispatch]] = []
        self.new: list[tuple[str, SegmentDispatch]] = []
        self.statuses = []
        self.robots = Robots()

    def on_segment(self, dispatch):
        self.segments.append((dispatch.task_id, dispatch))
        self.new.append((dispatch.task_id, dispatch))

    def on_status(self, snapshot):
        self.statuses.append(snapshot)

    def texts(self, task_id):
        return [s.text for t, s in self.segments if t == task_id]


class Robots:
    """Fake robots: execute segments in order, one robot at a time, and report.

    `behaviour(task_id, segment)` returns the execution time in seconds, or None to never
    report, or ("fail", message) to report failure. `values(task_id, segment)`: what the
    segment's skills returned, reported with it (default none).
    """

    def __init__(self, behaviour=None, values=None):
        self.behaviour = behaviour or (lambda tid, seg: seg.estimated_execution_s)
        self.values = values or (lambda tid, seg: None)
        self.free_at: dict[str, float] = {}
        self.events: list = []

    def take(self, sch, listener):
        while listener.new:
            tid, seg = listener.new.pop(0)
            action = self.behaviour(tid, seg)
            if action is None:
                continue
            robot = sch.tasks[tid].spec.robot_id
            start = max(seg.dispatched_s + LATENCY, self.free_at.get(robot, -math.inf))
            if isinstance(action, tuple):
                heapq.heappush(self.events, (start + 0.01, tid, seg.sequence, start, False,
                                             action[1], None))
                continue
            finish = start + action
            self.free_at[robot] = finish
            heapq.heappush(self.events, (finish, tid, seg.sequence, start, True, "",
                                         self.values(tid, seg)))


# The skill sets without robot reports fed back (`observations`): what the scheduling tests
# measure; test_observations.py covers the option.
NO_OBSERVATIONS = {n: dataclasses.replace(s, observations=False) for n, s in SKILL_SETS.items()}


def make(policy="timelyllm", engine=None, exec_model=None, skill_sets=None, **config):
    engine = engine or SimulatedEngine()
    listener = Listener()
    cfg = SchedulerConfig(network_latency_s=LATENCY, **config)
    # A policy name, or a policy instance (one built with parameters).
    policy = get_policy(policy) if isinstance(policy, str) else policy
    sch = SegmentScheduler(engine, policy, skill_sets or NO_OBSERVATIONS,
                           exec_model or ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH),
                           listener, cfg)
    sch.warm_prefix_cache()
    return sch, engine, listener


def spec(task_id, trace_id, engine, robot=None, level=None, **kw):
    t = TRACES[trace_id]
    level = level or t.tuf_level
    return TaskSpec(task_id, robot or f"robot_{task_id}", t.skill_set, t.instruction,
                    LEVELS.get(level), engine.now(), level, scripted_plan=t.plan, **kw)


def drive(sch, eng, lis, robots=None, until=None, max_iter=200_000):
    """Run until every task is terminal (or `until(sch)` is true); returns the robots."""
    # The listener keeps one set of robots across calls, so a run can be driven in phases.
    if robots is not None:
        lis.robots = robots
    robots = lis.robots
    for _ in range(max_iter):
        robots.take(sch, lis)
        if not sch.active_tasks() or (until is not None and until(sch)):
            return robots
        worked = sch.tick()
        robots.take(sch, lis)
        if not sch.active_tasks():
            continue
        events = robots.events
        due = bool(events) and events[0][0] <= eng.now()
        if worked and not due:
            continue
        # Idle (or a report is due): like the planner, wake at the next report or timer.
        timer = sch.next_timer_s()
        if not due and timer is not None and (not events or timer < events[0][0]):
            eng.advance_idle(max(timer, eng.now()) + 1e-6)
            continue
        assert events, "scheduler idle with active tasks and nothing to wait for"
        t, tid, seq, start, ok, msg, values = heapq.heappop(events)
        eng.advance_idle(t)
        sch.on_report(tid, seq, start, t, ok, msg, values=values)
    raise AssertionError("did not finish")


def assert_no_leaks(sch, eng):
    assert sch.queue_length() == 0
    assert sch.running_request_ids() == []
    assert not sch.has_work()
    assert sch.active_tasks() == []
    assert not eng.has_unfinished_requests()
    kv = eng.kv_usage()
    assert kv.free_blocks == kv.total_blocks


def states(task):
    return [s for s, _ in task.lifecycle.history]


def urgent_beside_two_scenes(policy):
    """One event after a warm-up task: an urgent drone (trace 1) and two normal tasks (trace 2),
    each with a long scene of its own, under `policy` (a name or a Policy). Every task ends done
    and nothing leaks; returns (the urgent task's response time, the normal ones')."""
    scene = " ".join(f"object{i} at {i % 7} {i % 5} on the shelf" for i in range(250))
    sch, eng, lis = make(policy)
    # A planner that has run a while (holding a prefill needs a measured step time).
    sch.submit(spec("warm", 1, eng))
    drive(sch, eng, lis)
    urgent = sch.submit(spec("u", 1, eng, level="urgent"))
    normal = [sch.submit(spec(f"n{i}", 2, eng, scene=scene)) for i in range(2)]
    drive(sch, eng, lis)
    assert all(t.state == "done" for t in [urgent, *normal])
    assert_no_leaks(sch, eng)
    return urgent.response_time_s, [t.response_time_s for t in normal]
