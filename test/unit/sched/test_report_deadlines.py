"""The scheduler's report deadlines are kept in a lazy heap (core/sched/report_deadlines.py)
instead of a scan of every active task per tick; its answers must be the scan's."""

from __future__ import annotations

from fakes import LEVELS, Robots, drive, make, spec
from timelyllm_ros.core.lifecycle import TaskLifecycle
from timelyllm_ros.core.sched.report_deadlines import ReportDeadlines
from timelyllm_ros.core.sched.sizes import first_unreported
from timelyllm_ros.core.task import SegmentRecord, TaskRecord, TaskSpec


def _scan(sch):
    """The scan the heap replaces: (earliest deadline, tasks overdue at `now`, in order)."""
    now = sch.engine.now()
    deadlines, overdue = [], []
    for task in sch.state.active.values():
        s = first_unreported(task)
        if s is not None:
            deadlines.append(s.report_deadline_s)
            if s.report_deadline_s < now:
                overdue.append(task.task_id)
    return (min(deadlines) if deadlines else None), overdue


def test_heap_answers_as_the_scan_does_through_a_run_with_slow_and_silent_robots():
    # Two robots shared by several tasks (robot timelines reschedule each other's deadlines),
    # one robot that never reports (its tasks time out), slow and fast executions.
    sch, eng, lis = make("timelyllm", report_timeout_factor=3.0, report_timeout_min_s=2.0)
    traces = [1, 6, 9, 2, 7, 3, 10, 8]
    for i, trace in enumerate(traces):
        sch.submit(spec(f"t{i}", trace, eng, robot=("r_silent", "r_a", "r_b")[i % 3]))

    def behaviour(tid, seg):
        if sch.tasks[tid].spec.robot_id == "r_silent":
            return None
        return seg.estimated_execution_s * (0.5 if seg.sequence % 2 else 1.5)

    checks = {"n": 0}

    def check(s):
        earliest, overdue = _scan(s)
        assert s.next_timer_s() == earliest
        assert [t.task_id for t in s.state.deadlines.overdue(s.engine.now())] == overdue
        checks["n"] += 1
        return False

    drive(sch, eng, lis, Robots(behaviour), until=check)
    assert checks["n"] > 100
    states = {tid: t.state for tid, t in sch.tasks.items()}
    assert {states[f"t{i}"] for i in range(0, len(traces), 3)} == {"failed"}
    assert "done" in states.values()
    assert sch.next_timer_s() is None and sch.active_tasks() == []


def _task(task_id, index, *deadlines):
    task = TaskRecord(spec=TaskSpec(task_id, "r", "drone", "go", LEVELS.get("normal"), 0.0),
                      lifecycle=TaskLifecycle(0.0, task_id), submit_index=index)
    for seq, deadline in enumerate(deadlines):
        task.segments.append(SegmentRecord(seq, "x;", (), False, 1.0, 0.0, deadline - 1.0,
                                           deadline))
    return task


def test_moved_reported_and_ended_tasks_keep_the_heap_right():
    active = {}
    heap = ReportDeadlines(active)
    a, b, c = _task("a", 0, 10.0, 20.0), _task("b", 1, 5.0), _task("c", 2, 5.0)
    for t in (a, b, c):
        active[t.task_id] = t
        heap.note(t)
    assert heap.earliest() == 5.0
    # Equal deadlines come out in submission order; a task is listed once however often noted.
    heap.note(c)
    assert [t.task_id for t in heap.overdue(6.0)] == ["b", "c"]
    assert heap.overdue(5.0) == []  # a deadline is overdue only once passed
    # A deadline moved earlier (a report rescheduled the robot) is seen once noted.
    a.segments[0].report_deadline_s = 2.0
    heap.note(a)
    assert heap.earliest() == 2.0
    # ... and one moved later: the stale earlier entry no longer counts.
    a.segments[0].report_deadline_s = 30.0
    heap.note(a)
    del active["b"], active["c"]  # ended tasks drop out
    assert heap.earliest() == 30.0
    # Segment 0 reported: segment 1 is the one to wait for.
    a.segments[0].finished_s = 1.0
    heap.note(a)
    assert heap.earliest() == 20.0 and heap.overdue(25.0) == [a]
    a.segments[1].finished_s = 2.0
    heap.note(a)
    assert heap.earliest() is None and heap.overdue(100.0) == []
