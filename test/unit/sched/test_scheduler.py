"""SegmentScheduler end to end on the simulated engine (virtual time) with fake robots."""

from __future__ import annotations

import heapq
import math
import re
from pathlib import Path

import pytest

from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.lifecycle import TaskLifecycle
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.core.sched.interface import TaskRejected
from timelyllm_ros.core.skills.skillset import load_skillsets
from timelyllm_ros.core.task import SegmentRecord, TaskRecord, TaskSpec
from timelyllm_ros.core.tuf import load_tuf_levels
from timelyllm_ros.lrtrace.traces import load_traces

from fakes import (LATENCY, LEVELS, POLICIES, REPO, SEGMENTED, SKILL_SETS, TRACES,  # noqa: F401
                   Listener, Robots, assert_no_leaks, drive, make, spec, states)


# ------------------------------------------------------------------ segments, per dispatch mode

@pytest.mark.parametrize("policy", POLICIES)
def test_plans_arrive_as_ordered_segments(policy):
    sch, eng, lis = make(policy)
    for tid, trace in (("d1", 1), ("u6", 6), ("a9", 9), ("d2", 2)):
        sch.submit(spec(tid, trace, eng))
    drive(sch, eng, lis)
    for tid, trace in (("d1", 1), ("u6", 6), ("a9", 9), ("d2", 2)):
        task = sch.tasks[tid]
        assert task.state == "done", task.lifecycle.reason
        segs = [s for t, s in lis.segments if t == tid]
        assert [s.sequence for s in segs] == list(range(len(segs)))
        assert [s.is_last for s in segs] == [False] * (len(segs) - 1) + [True]
        assert "".join(s.text for s in segs) == TRACES[trace].plan
        # Every dispatched segment was reported back as executed.
        assert len(task.segments) == len(segs)
        assert all(s.reported and s.success for s in task.segments)
        assert math.isfinite(task.response_time_s) and task.response_time_s > 0
        assert task.waiting_time_s >= 0
        if policy in SEGMENTED:
            assert task.resumes == len(segs) - 1 > 0
            assert task.cached_tokens_total > 0 and task.cached_tokens_last_resume > 0
            # Every resume reuses at least the prompt's full blocks.
            assert task.cached_tokens_total >= task.resumes * (len(task.prompt_ids) // 16 * 16)
        else:
            assert task.resumes == 0 and task.engine_requests == 1
    # Segments of one plan: text per statement (drone) or per call (arm).
    assert lis.texts("d1") == ["_1=s,cat;", "?_1==True{o,cat;a};", "p;"]
    assert lis.texts("a9")[:2] == ["check(green_box)->", "pick(green_box)->"]
    assert_no_leaks(sch, eng)


@pytest.mark.parametrize("policy", ["edf-seg", "fcfs-seg", "timelyllm"])
def test_lifecycle_history_of_a_segmented_plan(policy):
    sch, eng, lis = make(policy)
    sch.submit(spec("t", 6, eng))
    drive(sch, eng, lis)
    task = sch.tasks["t"]
    hist = states(task)
    assert hist[:3] == ["received", "queued", "generating"]
    assert hist[-2:] == ["awaiting_robot", "done"]
    assert re.fullmatch(r"received queued generating( suspended generating)+ awaiting_robot done",
                        " ".join(hist))
    assert hist.count("suspended") == task.resumes == 3
    times = [t for _, t in task.lifecycle.history]
    assert times == sorted(times)
    # The status listener saw the same story.
    seen = [s.state for s in lis.statuses if s.task_id == "t"]
    assert seen[0] == "queued" and seen[-1] == "done" and "suspended" in seen


def test_whole_plan_dispatch_never_suspends():
    sch, eng, lis = make("vllm")
    sch.submit(spec("t", 6, eng))
    drive(sch, eng, lis)
    assert states(sch.tasks["t"]) == ["received", "queued", "generating", "awaiting_robot", "done"]
    segs = [s for _, s in lis.segments]
    # All segments were dispatched at the same moment, queued one behind the other on the robot.
    assert len({s.dispatched_s for s in segs}) == 1
    done = [s.estimated_done_s for s in segs]
    assert done == sorted(done)


# ------------------------------------------------------------------ bad input

def test_unknown_skill_set_is_rejected_with_field():
    sch, eng, lis = make()
    bad = TaskSpec("x", "r1", "submarine", "dive", LEVELS.get("normal"), eng.now(), "normal")
    with pytest.raises(TaskRejected) as err:
        sch.submit(bad)
    assert err.value.field == "skill_set" and "submarine" in err.value.reason
    assert sch.tasks["x"].state == "rejected"
    assert lis.statuses[-1].state == "rejected" and lis.statuses[-1].reason.startswith("skill_set")
    assert_no_leaks(sch, eng)


def test_an_engine_that_cannot_tokenize_rejects_the_goal_not_the_planner(monkeypatch):
    sch, eng, lis = make()

    def refuse(messages):  # a server's EngineRefused is a ValueError
        raise ValueError("router: Backend request failed")
    monkeypatch.setattr(eng, "render_chat", refuse)
    bad = TaskSpec("x", "r1", "drone", "fly up", LEVELS.get("normal"), eng.now(), "normal")
    with pytest.raises(TaskRejected) as err:
        sch.submit(bad)
    assert err.value.field == "instruction" and "Backend request failed" in err.value.reason
    assert lis.statuses[-1].state == "rejected"
    assert_no_leaks(sch, eng)
    monkeypatch.undo()
    ok = TaskSpec("y", "r1", "drone", "fly up", LEVELS.get("normal"), eng.now(), "normal")
    sch.submit(ok)
    assert sch.tasks["y"].state != "rejected"


def test_over_long_instruction_is_rejected_at_exactly_the_budget():
    sch, eng, lis = make()
    drone = SKILL_SETS["drone"]
    budget = eng.max_model_len() - drone.max_plan_tokens
    base = len(sch.book.prompt_ids(drone, "go"))
    # The simulated tokenizer makes every " x" one token.
    fits = "go" + " x" * (budget - base)
    assert len(sch.book.prompt_ids(drone, fits)) == budget
    task = sch.submit(TaskSpec("fits", "r1", "drone", fits, LEVELS.get("normal"), eng.now(),
                               "normal", scripted_plan="tk;mf,100;ld;"))
    assert task.state == "queued"
    with pytest.raises(TaskRejected) as err:
        sch.submit(TaskSpec("long", "r2", "drone", fits + " x", LEVELS.get("normal"), eng.now(),
                            "normal", scripted_plan="tk;"))
    assert err.value.field == "instruction"
    assert str(budget) in err.value.reason
    assert sch.tasks["long"].state == "rejected"
    assert sch.tasks["long"].lifecycle.reason.startswith("instruction")
    # A prompt of exactly the budget still runs to the end, resumes included.
    drive(sch, eng, lis)
    assert sch.tasks["fits"].state == "done"
    assert lis.texts("fits") == ["tk;", "mf,100;", "ld;"]
    assert_no_leaks(sch, eng)


def test_prompt_that_can_never_fit_the_kv_cache_is_rejected():
    from timelyllm_ros.core.engine.cost_model import EngineProfile

    # 28 blocks of 16 tokens: a drone prompt (~420 tokens) + 64 plan tokens needs 31, an arm
    # prompt (~260 tokens) + 160 plan tokens needs 27.
    eng = SimulatedEngine(EngineProfile(kv_total_blocks=28, kv_block_size=16))
    sch, eng, lis = make(engine=eng)
    with pytest.raises(TaskRejected) as err:
        sch.submit(spec("big", 1, eng))
    assert err.value.field == "instruction" and "KV blocks" in err.value.reason
    # ... instead of waiting at the head of the queue forever, blocking the rest.
    sch.submit(spec("small", 9, eng))
    drive(sch, eng, lis)
    assert sch.tasks["small"].state == "done"
    assert_no_leaks(sch, eng)


def test_duplicate_task_id_is_rejected_and_original_untouched():
    sch, eng, lis = make()
    original = sch.submit(spec("t", 1, eng, robot="drone_1"))
    sch.tick()
    before = (original.state, original.spec, len(original.generated.token_ids))
    with pytest.raises(TaskRejected) as err:
        sch.submit(spec("t", 6, eng, robot="drone_9"))
    assert err.value.field == "task_id"
    assert sch.tasks["t"] is original
    assert (original.state, original.spec, len(original.generated.token_ids)) == before
    assert lis.statuses[-1].state == "rejected" and lis.statuses[-1].robot_id == "drone_9"
    drive(sch, eng, lis)
    assert original.state == "done"
    assert "".join(lis.texts("t")) == TRACES[1].plan
    assert_no_leaks(sch, eng)


# ------------------------------------------------------------------ robots that misbehave

@pytest.mark.parametrize("policy", POLICIES)
def test_robot_that_never_reports_fails_after_timeout_without_leaks(policy):
    sch, eng, lis = make(policy, report_timeout_factor=3.0, report_timeout_min_s=5.0)
    sch.submit(spec("silent", 9, eng))
    sch.submit(spec("fine", 1, eng))
    robots = Robots(lambda tid, seg: None if tid == "silent" else seg.estimated_execution_s)
    drive(sch, eng, lis, robots)
    task = sch.tasks["silent"]
    assert task.state == "failed"
    assert "did not report segment 0" in task.lifecycle.reason
    seg0 = task.segments[0]
    # From its estimated start, the longest plausible execution (not the minimum the
    # priorities use), then the margin.
    start = seg0.estimated_done_s - seg0.estimated_execution_s
    longest = sch.exec_model.estimate_segment_max(seg0.calls)
    assert longest > seg0.estimated_execution_s   # the arm's calls have jitter
    expected_deadline = start + longest + LATENCY + max(3.0 * seg0.estimated_execution_s, 5.0)
    assert seg0.report_deadline_s == pytest.approx(expected_deadline)
    failed_at = task.lifecycle.time_of("failed")
    assert expected_deadline <= failed_at <= expected_deadline + 0.5
    assert sch.tasks["fine"].state == "done"
    assert_no_leaks(sch, eng)


def test_timeout_waits_for_earlier_segment_of_a_slow_robot():
    # Segment 0 is long (check: 10 s estimated); segment 1 short. The robot needs 30 s for
    # segment 0, within its 10 + 30 s allowance. Segment 1's own deadline (estimated from the
    # *estimated* end of segment 0) passes meanwhile; that must not fail the task.
    exec_model = ExecutionTimeModel.from_mapping({"skills": {
        "default": {"kind": "constant", "seconds": 0.1},
        "check": {"kind": "constant", "seconds": 10.0}}})
    sch, eng, lis = make("vllm-stream", exec_model=exec_model)
    sch.submit(spec("arm", 9, eng))
    robots = Robots(lambda tid, seg: 30.0 if seg.sequence == 0 else 0.1)
    drive(sch, eng, lis, robots, until=lambda s: s.tasks["arm"].state == "awaiting_robot")
    task = sch.tasks["arm"]
    seg0, seg1 = task.segments[:2]
    assert seg1.report_deadline_s < 20.0 < seg0.report_deadline_s
    eng.advance_idle(20.0)
    sch.tick()
    assert task.state == "awaiting_robot", task.lifecycle.reason
    assert sch.next_timer_s() == pytest.approx(seg0.report_deadline_s)
    drive(sch, eng, lis)
    assert task.state == "done", task.lifecycle.reason
    # Reported finish of segment 0 moved the later estimates and deadlines.
    assert seg1.estimated_done_s == pytest.approx(seg0.finished_s + 0.1)
    assert_no_leaks(sch, eng)


def test_robot_reporting_failure_fails_task_and_frees_everything():
    sch, eng, lis = make("timelyllm")
    sch.submit(spec("t", 9, eng))
    sch.submit(spec("other", 2, eng))
    robots = Robots(lambda tid, seg: ("fail", "gripper jammed") if (tid, seg.sequence) == ("t", 1)
                    else seg.estimated_execution_s)
    drive(sch, eng, lis, robots)
    task = sch.tasks["t"]
    assert task.state == "failed"
    assert "segment 1" in task.lifecycle.reason and "gripper jammed" in task.lifecycle.reason
    assert task.segments[1].success is False
    assert sch.tasks["other"].state == "done"
    assert_no_leaks(sch, eng)


@pytest.mark.parametrize("when", ["queued", "generating", "suspended", "awaiting_robot"])
def test_cancel_frees_everything(when):
    sch, eng, lis = make("timelyllm")
    sch.submit(spec("t", 9, eng))
    sch.submit(spec("other", 6, eng))
    drive(sch, eng, lis, until=lambda s: s.tasks["t"].state == when)
    sch.cancel("t", "operator abort")
    task = sch.tasks["t"]
    assert task.state == "cancelled" and task.lifecycle.reason == "operator abort"
    assert "t" not in {s.spec.task_id for s in sch.active_tasks()}
    sch.cancel("t", "again")  # idempotent
    sch.cancel("nope", "unknown ids are ignored")
    assert task.lifecycle.reason == "operator abort"
    drive(sch, eng, lis)
    assert sch.tasks["other"].state == "done"
    # A late report for the cancelled task is ignored.
    if task.segments:
        sch.on_report("t", 0, eng.now(), eng.now() + 1, True)
    assert task.state == "cancelled"
    assert_no_leaks(sch, eng)


def test_shutdown_cancels_all_and_frees_everything():
    sch, eng, lis = make("edf-seg")
    for i, trace in enumerate((1, 6, 9)):
        sch.submit(spec(f"t{i}", trace, eng))
    for _ in range(5):
        sch.tick()
    sch.shutdown("bye")
    assert {t.state for t in sch.tasks.values()} == {"cancelled"}
    assert_no_leaks(sch, eng)


# ------------------------------------------------------------------ reports

def test_bad_reports_raise_naming_the_field_and_leave_others_alone():
    sch, eng, lis = make("timelyllm")
    sch.submit(spec("a", 1, eng))
    sch.submit(spec("b", 6, eng))
    drive(sch, eng, lis, until=lambda s: len(s.tasks["a"].segments) >= 1)
    snap_before = sch.snapshots(["b"])
    now = eng.now()
    with pytest.raises(KeyError, match="task_id"):
        sch.on_report("zzz", 0, now, now + 1, True)
    with pytest.raises(ValueError, match="sequence"):
        sch.on_report("a", 7, now, now + 1, True)
    with pytest.raises(ValueError, match="sequence"):
        sch.on_report("a", -1, now, now + 1, True)
    with pytest.raises(ValueError, match="finished"):
        sch.on_report("a", 0, now, now - 1, True)
    with pytest.raises(ValueError, match="started"):
        sch.on_report("a", 0, float("nan"), now, True)
    with pytest.raises(ValueError, match="finished"):
        sch.on_report("a", 0, now, float("inf"), True)
    assert not sch.tasks["a"].segments[0].reported
    assert sch.snapshots(["b"]) == snap_before
    drive(sch, eng, lis)
    assert sch.tasks["a"].state == sch.tasks["b"].state == "done"
    # A duplicate report is ignored; a malformed one is still an error after the task ended.
    seg = sch.tasks["a"].segments[0]
    finished = seg.finished_s
    sch.on_report("a", 0, seg.started_s, finished + 5, True)
    assert seg.finished_s == finished
    with pytest.raises(ValueError, match="finished"):
        sch.on_report("a", 0, 2.0, 1.0, True)
    assert_no_leaks(sch, eng)


def test_rejected_task_has_no_segments_to_report():
    sch, eng, lis = make()
    with pytest.raises(TaskRejected):
        sch.submit(TaskSpec("x", "r", "nope", "i", LEVELS.get("normal"), eng.now()))
    with pytest.raises(ValueError, match="sequence"):
        sch.on_report("x", 0, 0.0, 1.0, True)


@pytest.mark.parametrize("policy", ["timelyllm", "vllm-stream", "fcfs-seg"])
def test_early_reports_keep_things_consistent(policy):
    # The robot finishes each segment 1 ms after it arrives, long before the planner's estimate
    # and, for most segments, before the generation has ended.
    sch, eng, lis = make(policy)
    sch.submit(spec("t", 10, eng))
    sch.submit(spec("u", 7, eng))
    seen_reference = []

    class Eager(Robots):
        def take(self, sch, listener):
            while listener.new:
                tid, seg = listener.new.pop(0)
                t = seg.dispatched_s + LATENCY + 0.001
                eng.advance_idle(t)
                sch.on_report(tid, seg.sequence, t - 0.001, t, True)
                task = sch.tasks[tid]
                if task.queue_slot is not None:
                    seen_reference.append((sch.state.queue.get(task.queue_slot)["reference_s"], t))

    drive(sch, eng, lis, Eager())
    for tid, trace in (("t", 10), ("u", 7)):
        task = sch.tasks[tid]
        assert task.state == "done", task.lifecycle.reason
        assert "".join(lis.texts(tid)) == TRACES[trace].plan
        assert all(s.reported for s in task.segments)
        assert task.waiting_time_s >= 0
    # The report replaced the estimate as the suspended generation's reference time.
    for ref, reported in seen_reference:
        assert ref == pytest.approx(reported)
    if policy != "vllm-stream":
        assert seen_reference
    assert_no_leaks(sch, eng)


def test_report_at_time_zero_is_a_real_time():
    task = TaskRecord(spec=TaskSpec("t", "r", "drone", "i", LEVELS.get("normal"), 0.0),
                      lifecycle=TaskLifecycle(0.0))
    assert task.robot_free_at(7.0) == 7.0
    task.segments.append(SegmentRecord(0, "tk;", (), False, 3.0, 0.0, 3.0, 10.0))
    assert task.robot_free_at(7.0) == 3.0
    task.segments[0].started_s, task.segments[0].finished_s = 0.0, 0.0
    assert task.robot_free_at(7.0) == 0.0


# ------------------------------------------------------------------ admission order

def _first_admitted(policy, gap_s):
    sch, eng, lis = make(policy, batch_cap=1)
    sch.submit(spec("normal", 1, eng))
    eng.advance_idle(eng.now() + gap_s)
    sch.submit(spec("urgent", 6, eng))
    drive(sch, eng, lis)
    starts = {tid: sch.tasks[tid].lifecycle.history[2][1] for tid in ("normal", "urgent")}
    assert all(sch.tasks[t].state == "done" for t in starts)
    assert_no_leaks(sch, eng)
    return min(starts, key=starts.get), sch


@pytest.mark.parametrize("gap_s", [0.0, 0.01])
@pytest.mark.parametrize("policy", ["timelyllm", "edf-seg"])
def test_urgent_task_admitted_first_under_deadline_aware_policies(policy, gap_s):
    first, sch = _first_admitted(policy, gap_s)
    assert first == "urgent"


@pytest.mark.parametrize("policy", ["vllm", "vllm-stream", "fcfs-seg"])
def test_fcfs_admits_in_arrival_order(policy):
    first, _ = _first_admitted(policy, 0.01)
    assert first == "normal"


def test_fcfs_ties_are_served_in_submission_order():
    # Same arrival time: FCFS must keep submission order (ties used to go last-row first).
    sch, eng, lis = make("vllm", batch_cap=1)
    ids = [f"t{i}" for i in range(5)]
    for i, tid in enumerate(ids):
        sch.submit(spec(tid, 1 + i % 5, eng))
    drive(sch, eng, lis)
    starts = [sch.tasks[t].lifecycle.time_of("generating") for t in ids]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)


def test_batch_cap_is_respected():
    sch, eng, lis = make("fcfs-seg", batch_cap=2)
    for i in range(6):
        sch.submit(spec(f"t{i}", 1 + i % 8, eng))
    running = []
    drive(sch, eng, lis, until=lambda s: running.append(len(s.running_request_ids())) and False)
    assert max(running) == 2
    assert all(t.state == "done" for t in sch.tasks.values())
    assert_no_leaks(sch, eng)


# ------------------------------------------------------------------ engine trouble, housekeeping

class RefusingEngine(SimulatedEngine):
    def add_request(self, request):
        if request.request_id.startswith("bad#"):
            raise ValueError("no room for you")
        super().add_request(request)


def test_engine_refusing_a_request_fails_that_task_only():
    eng = RefusingEngine()
    sch, eng, lis = make("timelyllm", engine=eng)
    sch.submit(spec("bad", 1, eng))
    sch.submit(spec("good", 2, eng))
    drive(sch, eng, lis)
    assert sch.tasks["bad"].state == "failed"
    assert "no room for you" in sch.tasks["bad"].lifecycle.reason
    assert sch.tasks["good"].state == "done"
    assert_no_leaks(sch, eng)


def test_warm_prefix_cache_with_running_plans_loses_no_tokens():
    sch, eng, lis = make("vllm-stream")
    sch.submit(spec("t", 2, eng))
    for _ in range(4):
        sch.tick()
    assert sch.tasks["t"].generated.token_ids
    sch.warm_prefix_cache()
    drive(sch, eng, lis)
    assert "".join(lis.texts("t")) == TRACES[2].plan
    assert_no_leaks(sch, eng)


def test_max_finished_tasks_bounds_memory():
    sch, eng, lis = make("timelyllm", max_finished_tasks=2)
    for i in range(5):
        sch.submit(spec(f"t{i}", 1 + i, eng))
    drive(sch, eng, lis)
    assert len(sch.tasks) == 2
    assert all(t.state == "done" for t in sch.tasks.values())
    # The kept ones keep their plan, not their token lists.
    for t in sch.tasks.values():
        assert t.generated.text and not t.prompt_ids and not t.generated.token_ids


def test_fetch_overhead_history_is_bounded():
    sch, eng, lis = make("timelyllm", overhead_history=10)
    for i in range(4):
        sch.submit(spec(f"t{i}", 9 + i % 3, eng))
    drive(sch, eng, lis)
    assert 0 < len(sch.fetch_overhead_s) <= 20


def test_next_timer_is_the_first_pending_report_deadline():
    sch, eng, lis = make("vllm-stream")
    assert sch.next_timer_s() is None
    sch.submit(spec("t", 9, eng))
    drive(sch, eng, lis, Robots(lambda tid, seg: None),
          until=lambda s: s.tasks["t"].state == "awaiting_robot")
    segs = sch.tasks["t"].segments
    assert sch.next_timer_s() == pytest.approx(segs[0].report_deadline_s)


def test_robot_serving_two_tasks_is_not_declared_dead_for_the_second():
    # One robot, two long tasks at once: the second task's segments queue behind the first's on
    # the robot. Its report deadlines must include that queue, or the tight timeout below would
    # fail it although the robot is alive and busy.
    sch, eng, lis = make("timelyllm", report_timeout_factor=1.0, report_timeout_min_s=0.5)
    sch.submit(spec("first", 9, eng, robot="arm_1"))
    sch.submit(spec("second", 10, eng, robot="arm_1"))
    drive(sch, eng, lis)
    for task_id in ("first", "second"):
        assert sch.tasks[task_id].state == "done", sch.tasks[task_id].lifecycle.reason
    # The fake robot runs exactly the estimates, so the planner's robot-wide timeline must
    # predict every finish, including segments that waited behind the other task's.
    segments = sch.tasks["first"].segments + sch.tasks["second"].segments
    assert all(abs(s.estimated_done_s - s.finished_s) < 1e-6 for s in segments)
    assert_no_leaks(sch, eng)
