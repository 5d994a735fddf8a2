"""A plan whose token budget ends inside a statement (`mf` without its distance) ends before
that statement; it does not fail the task for text the model was not allowed to finish."""

from __future__ import annotations

import pytest

from timelyllm_ros.core.task import TaskSpec

from fakes import LEVELS, assert_no_leaks, drive, make


@pytest.mark.parametrize("budget, cut", [(3, "tk;mf"), (4, "tk;mf,")])
def test_a_statement_cut_by_the_plan_budget_is_dropped(budget, cut):
    sch, eng, lis = make("timelyllm")
    task = sch.submit(TaskSpec("cut", "r", "drone", "take off and fly", LEVELS.get("normal"),
                               eng.now(), "normal", scripted_plan="tk;mf,100;ld;",
                               max_plan_tokens=budget))
    drive(sch, eng, lis)
    assert task.generated.text == cut
    assert task.state == "done", task.lifecycle.reason
    # Only `tk;` carries a skill call; the plan's end reaches the robot without the cut text.
    assert [s.text for _, s in lis.segments if s.text.strip()] == ["tk;"]
    assert all("mf" not in s.text for _, s in lis.segments)
    assert_no_leaks(sch, eng)


def test_a_complete_statement_at_the_budget_still_runs():
    sch, eng, lis = make("timelyllm")
    task = sch.submit(TaskSpec("whole", "r", "drone", "take off and fly", LEVELS.get("normal"),
                               eng.now(), "normal", scripted_plan="tk;mf,100;ld;",
                               max_plan_tokens=5))
    drive(sch, eng, lis)
    assert task.state == "done" and lis.texts("whole") == ["tk;", "mf,100"]
