"""validate_goal: every bad field is rejected with its name."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from timelyllm_ros.core.tuf import MAX_ERT_S, MAX_INITIAL_UTILITY, MAX_SLOPE_PER_S, load_tuf_levels
from timelyllm_ros.core.validation import MAX_STAMP_SKEW_S, GoalError, GoalFields, validate_goal

LEVELS = load_tuf_levels(Path(__file__).resolve().parents[3] / "config" / "tuf_levels.yaml")
ROBOTS = {"drone_1": "drone", "arm_1": "arm"}
NOW = 1000.0


def goal(**kw):
    base = dict(task_id="t-1", robot_id="drone_1", skill_set="drone", instruction="  find the cat ",
                urgency="normal", expected_response_time_s=0.0, decline_slope_per_s=0.0,
                initial_utility=0.0, stamp_s=None)
    base.update(kw)
    return GoalFields(**base)


def check(g, robots=ROBOTS, now=NOW):
    return validate_goal(g, levels=LEVELS, known_robots=robots, now_s=now)


def rejected(g, field, robots=ROBOTS, now=NOW, match=None):
    with pytest.raises(GoalError) as err:
        check(g, robots, now)
    assert err.value.field == field, str(err.value)
    assert str(err.value).startswith(f"{field}: ")
    if match:
        assert match in err.value.reason, err.value.reason
    return err.value


def test_valid_goal_with_level():
    spec = check(goal())
    assert spec.task_id == "t-1" and spec.robot_id == "drone_1" and spec.skill_set == "drone"
    assert spec.instruction == "find the cat"
    assert spec.tuf == LEVELS.get("normal") and spec.urgency == "normal"
    assert spec.arrival_s == NOW and not spec.is_urgent
    assert check(goal(urgency="urgent")).is_urgent


def test_valid_goal_with_values():
    spec = check(goal(urgency="", expected_response_time_s=0.5, decline_slope_per_s=3.0,
                      initial_utility=1.5))
    assert (spec.tuf.ert_s, spec.tuf.slope_per_s, spec.tuf.initial_utility) == (0.5, 3.0, 1.5)
    assert spec.urgency == "custom"


def test_skill_set_taken_from_known_robot():
    assert check(goal(skill_set="")).skill_set == "drone"
    assert check(goal(robot_id="arm_1", skill_set="")).skill_set == "arm"


@pytest.mark.parametrize("instruction", ["", "   ", "\n\t", None])
def test_empty_instruction(instruction):
    rejected(goal(instruction=instruction), "instruction", match="empty")


@pytest.mark.parametrize("task_id", ["", "a b", "x" * 129, "semi;colon", "hash#1", None])
def test_bad_task_id(task_id):
    rejected(goal(task_id=task_id), "task_id")


@pytest.mark.parametrize("robot_id", ["", "1drone", "drone-1", "drone/1", "drone 1", "d" * 64,
                                      "_drone", None])
def test_bad_robot_id(robot_id):
    rejected(goal(robot_id=robot_id), "robot_id")


def test_unknown_robot_names_known_ones():
    err = rejected(goal(robot_id="drone_7"), "robot_id", match="unknown robot 'drone_7'")
    assert "arm_1" in err.reason and "drone_1" in err.reason
    rejected(goal(robot_id="drone_7"), "robot_id", robots={}, match="none")


def test_any_well_formed_robot_without_a_registry():
    assert check(goal(robot_id="drone_7"), robots=None).robot_id == "drone_7"
    rejected(goal(robot_id="drone_7", skill_set=""), "skill_set", robots=None)


def test_skill_set_must_match_the_robot():
    rejected(goal(skill_set="arm"), "skill_set", match="speaks 'drone'")


@pytest.mark.parametrize("field", ["expected_response_time_s", "decline_slope_per_s",
                                   "initial_utility"])
@pytest.mark.parametrize("value,why", [
    (math.nan, "NaN"), (math.inf, "infinite"), (-math.inf, "infinite"), (-0.5, "negative")])
def test_bad_tuf_values_name_their_field(field, value, why):
    values = dict(expected_response_time_s=1.0, decline_slope_per_s=2.0, initial_utility=1.0)
    values[field] = value
    rejected(goal(urgency="", **values), field, match=why)


@pytest.mark.parametrize("field,value", [
    ("expected_response_time_s", MAX_ERT_S * 10),
    ("decline_slope_per_s", MAX_SLOPE_PER_S * 10),
    ("initial_utility", MAX_INITIAL_UTILITY * 10),
])
def test_absurd_tuf_values(field, value):
    values = dict(expected_response_time_s=1.0, decline_slope_per_s=2.0, initial_utility=1.0)
    values[field] = value
    rejected(goal(urgency="", **values), field, match="plausible maximum")


def test_zero_slope_is_rejected_but_zero_ert_and_utility_are_fine():
    rejected(goal(urgency="", expected_response_time_s=1.0, decline_slope_per_s=0.0,
                  initial_utility=1.0), "decline_slope_per_s", match="zero")
    spec = check(goal(urgency="", expected_response_time_s=0.0, decline_slope_per_s=1.0,
                      initial_utility=0.0))
    assert spec.tuf.ert_s == 0.0


def test_non_numeric_tuf_value():
    rejected(goal(urgency="", expected_response_time_s="1", decline_slope_per_s=1.0,
                  initial_utility=1.0), "expected_response_time_s", match="number")
    rejected(goal(urgency="", expected_response_time_s=1.0, decline_slope_per_s=True,
                  initial_utility=1.0), "decline_slope_per_s", match="number")


def test_no_level_and_no_values_says_what_is_missing():
    err = rejected(goal(urgency=""), "urgency", match="no TUF values")
    assert "normal" in err.reason and "urgent" in err.reason


def test_unknown_level():
    rejected(goal(urgency="asap"), "urgency", match="unknown TUF level 'asap'")


@pytest.mark.parametrize("field", ["expected_response_time_s", "decline_slope_per_s",
                                   "initial_utility"])
@pytest.mark.parametrize("value", [0.5, math.nan, -1.0])
def test_level_and_values_conflict(field, value):
    err = rejected(goal(urgency="urgent", **{field: value}), "urgency", match="not both")
    assert field in err.reason


def test_stamp_within_skew_sets_arrival():
    assert check(goal(stamp_s=NOW - 2.5)).arrival_s == NOW - 2.5
    # A stamp slightly in the future (clock skew) is taken as "now", never later.
    assert check(goal(stamp_s=NOW + 1.0)).arrival_s == NOW
    assert check(goal(stamp_s=NOW - MAX_STAMP_SKEW_S)).arrival_s == NOW - MAX_STAMP_SKEW_S


@pytest.mark.parametrize("stamp", [NOW - MAX_STAMP_SKEW_S - 1, NOW + MAX_STAMP_SKEW_S + 1,
                                   math.nan, math.inf, -math.inf])
def test_stamp_skew_rejected(stamp):
    rejected(goal(stamp_s=stamp), "stamp", match="planner's clock")


def test_checks_run_in_field_order():
    # Several bad fields: the first in message order is reported.
    bad = goal(task_id="", robot_id="", instruction="", urgency="asap")
    rejected(bad, "task_id")
    rejected(dataclasses.replace(bad, task_id="ok"), "robot_id")
    rejected(dataclasses.replace(bad, task_id="ok", robot_id="drone_1"), "instruction")
    rejected(dataclasses.replace(bad, task_id="ok", robot_id="drone_1", instruction="x"), "urgency")
