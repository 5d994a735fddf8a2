"""A robot with a deep backlog (issue 20, docs/overload.md): the scheduler's per-robot timeline and
its report-deadline heap must give the answers of a plain scan, without a cost per report that
grows with every task queued on the robot."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from fakes import LEVELS
from timelyllm_ros.core.lifecycle import TaskLifecycle
from timelyllm_ros.core.sched.report_deadlines import ReportDeadlines
from timelyllm_ros.core.sched.robot_timeline import RobotTimelines
from timelyllm_ros.core.sched.sizes import first_unreported
from timelyllm_ros.core.task import SegmentRecord, TaskRecord, TaskSpec

LATENCY = 0.008


def _segment(seq, dispatched, estimate, done, deadline=None):
    return SegmentRecord(seq, "x;", (), False, estimate, dispatched, done,
                         done + 5.0 if deadline is None else deadline)


class _ScanTimeline:
    """The reference: a list scanned on every call, both chains recomputed from scratch."""

    def __init__(self):
        self.pending: list[tuple[SegmentRecord, float]] = []  # (segment, longest)
        self.latest_start: dict[int, float] = {}

    def free_at(self, earliest):
        return max([earliest] + [s.estimated_done_s for s, _ in self.pending])

    def latest_free_at(self, earliest):
        return max([earliest] + [self.latest_start[id(s)] + longest
                                 for s, longest in self.pending])


SLACK = 5.0  # report deadline = latest start + longest + SLACK


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["dispatch", "report_oldest", "report_any", "end"]),
                          st.floats(0.0, 3.0), st.integers(0, 1000)),
                min_size=1, max_size=60))
def test_timeline_answers_as_a_scan_through_dispatches_reports_and_ends(ops):
    timeline, scan = RobotTimelines(), _ScanTimeline()
    now, seq = 0.0, 0
    for op, dt, pick in ops:
        now += dt
        if op == "dispatch":
            # As the scheduler dispatches: after whatever the robot is expected to finish, the
            # deadline after whatever it may take at the longest.
            arrive = now + LATENCY
            start = timeline.free_at("r", arrive)
            latest = max(start, timeline.latest_free_at("r", arrive))
            longest = 2.0 * dt
            seg = _segment(seq, now, dt, start + dt, latest + longest + SLACK)
            seq += 1
            timeline.dispatched("r", seg, latest_start=latest, longest_s=longest)
            scan.pending.append((seg, longest))
            scan.latest_start[id(seg)] = latest
        elif scan.pending:
            if op == "report_oldest":
                entry = scan.pending[0]
            else:  # a robot serving tasks in arrival order reports out of dispatch order
                entry = scan.pending[pick % len(scan.pending)]
            scan.pending.remove(entry)
            if op == "end":
                timeline.settled("r", [entry[0], _segment(99, 0.0, 0.0, 0.0)])  # + one not queued
            else:
                timeline.settled("r", [entry[0]])
                timeline.reschedule("r", now, LATENCY)
                free = latest = now  # the reference recurrences
                for s, longest in scan.pending:
                    ready = s.dispatched_s + LATENCY
                    start, latest_start = max(ready, free), max(ready, latest)
                    assert s.estimated_done_s == pytest.approx(start + s.estimated_execution_s)
                    assert s.report_deadline_s == pytest.approx(latest_start + longest + SLACK)
                    scan.latest_start[id(s)] = latest_start
                    free, latest = s.estimated_done_s, latest_start + longest
        assert timeline.free_at("r", now) == pytest.approx(scan.free_at(now))
        assert timeline.latest_free_at("r", now) == pytest.approx(scan.latest_free_at(now))
        assert timeline.pending_count("r") == len(scan.pending)


def _task(task_id, index):
    return TaskRecord(spec=TaskSpec(task_id, "r", "drone", "go", LEVELS.get("normal"), 0.0),
                      lifecycle=TaskLifecycle(0.0, task_id), submit_index=index)


def _scan(active, now):
    deadlines = {t.task_id: first_unreported(t).report_deadline_s for t in active.values()
                 if first_unreported(t) is not None}
    earliest = min(deadlines.values()) if deadlines else None
    overdue = [t.task_id for t in sorted(active.values(), key=lambda t: t.submit_index)
               if t.task_id in deadlines and deadlines[t.task_id] < now]
    return earliest, overdue


def test_postponed_deadlines_push_nothing_and_still_expire_in_order():
    # 300 tasks queued on one robot; every report moves each of their deadlines later, as the
    # robot runs slower than estimated. The heap must not grow by a task per report.
    active: dict[str, TaskRecord] = {}
    heap = ReportDeadlines(active)
    rng = random.Random(7)
    tasks = []
    for i in range(300):
        task = _task(f"t{i}", i)
        task.segments.append(_segment(0, 0.0, 1.0, 10.0 + i))
        active[task.task_id] = task
        heap.note(task)
        tasks.append(task)
    for report in range(200):
        for task in tasks:
            task.segments[0].report_deadline_s += rng.uniform(0.0, 0.5)
            heap.note(task)
        now = 10.0 + report
        assert heap.earliest() == _scan(active, now)[0]
        assert [t.task_id for t in heap.overdue(now)] == _scan(active, now)[1]
    assert len(heap._heap) < 2 * len(tasks)


def test_a_deadline_moved_earlier_is_seen_and_an_ended_task_leaves():
    active: dict[str, TaskRecord] = {}
    heap = ReportDeadlines(active)
    a, b = _task("a", 0), _task("b", 1)
    a.segments.append(_segment(0, 0.0, 1.0, 10.0))
    b.segments.append(_segment(0, 0.0, 1.0, 20.0))
    for t in (a, b):
        active[t.task_id] = t
        heap.note(t)
    assert heap.earliest() == 15.0
    a.segments[0].report_deadline_s = 40.0  # later: no push needed, re-keyed at the top
    heap.note(a)
    assert heap.earliest() == 25.0
    a.segments[0].report_deadline_s = 3.0   # earlier than its entry: pushed
    heap.note(a)
    assert heap.earliest() == 3.0 and [t.task_id for t in heap.overdue(4.0)] == ["a"]
    del active["a"]
    assert heap.earliest() == 25.0 and "a" not in heap._lowest
    b.segments[0].finished_s = 1.0
    assert heap.earliest() is None and heap._lowest == {}
