"""A robot's report that the plan returned ends the task at once; a live task's TUF can change
(SegmentScheduler.on_report(returned=True), .update_tuf)."""

from __future__ import annotations

import pytest

from fakes import LEVELS, assert_no_leaks, drive, make, spec, states


def test_a_returned_plan_stops_generating_and_ends_done_with_the_reason():
    sch, eng, lis = make("timelyllm")  # suspends at every boundary: segments are still to come
    task = sch.submit(spec("a", 1, eng))
    drive(sch, eng, lis, until=lambda s: task.segments)
    first = task.segments[0]
    assert not task.generation_finished
    sch.on_report("a", 0, first.dispatched_s, first.dispatched_s + 0.5, True, "->True",
                  returned=True)
    assert task.state == "done" and task.lifecycle.reason.startswith("returned")
    assert "->True" in task.lifecycle.reason
    assert len(task.segments) == 1  # nothing more was dispatched
    assert [s.state for s in lis.statuses if s.task_id == "a"][-1] == "done"
    assert_no_leaks(sch, eng)


def test_update_tuf_to_urgent_lets_a_queued_task_overtake():
    sch, eng, lis = make("timelyllm", batch_cap=1)
    sch.submit(spec("busy", 1, eng))
    sch.tick()  # the only slot
    early = sch.submit(spec("early", 2, eng, level="normal"))
    late = sch.submit(spec("late", 3, eng, level="normal"))
    new = sch.update_tuf("late", LEVELS.get("urgent"), "urgent")
    assert new.urgency == "urgent" and sch.tasks["late"].spec.tuf == LEVELS.get("urgent")
    drive(sch, eng, lis)
    assert late.segments[0].dispatched_s < early.segments[0].dispatched_s
    assert_no_leaks(sch, eng)
    with pytest.raises(ValueError, match="task_id"):
        sch.update_tuf("late", LEVELS.get("normal"), "normal")  # finished
    with pytest.raises(KeyError, match="task_id"):
        sch.update_tuf("nobody", LEVELS.get("normal"), "normal")


def test_without_the_update_the_earlier_task_goes_first():
    sch, eng, lis = make("timelyllm", batch_cap=1)
    sch.submit(spec("busy", 1, eng))
    sch.tick()
    early = sch.submit(spec("early", 2, eng, level="normal"))
    late = sch.submit(spec("late", 3, eng, level="normal"))
    drive(sch, eng, lis)
    assert early.segments[0].dispatched_s < late.segments[0].dispatched_s
