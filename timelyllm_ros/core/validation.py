"""Checking a task goal field by field before it reaches the scheduler.

Transport-neutral: the ROS node converts a TaskGoal message into `GoalFields`, and any other
front end can do the same. Every rejection names the field and the reason.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from timelyllm_ros.core.errors import FieldError
from timelyllm_ros.core.task import TaskSpec
from timelyllm_ros.core.tuf import TUF, TufError, TufLevels

# ROS names allow [A-Za-z0-9_] segments; robot ids become topic namespaces.
_ROBOT_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")
_TASK_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
# A robot's clock may be off by a little; a stamp further in the future or past is absurd.
MAX_STAMP_SKEW_S = 300.0


class GoalError(FieldError):
    """A task goal field that is missing, malformed or absurd."""


@dataclass(frozen=True)
class GoalFields:
    task_id: str
    robot_id: str
    skill_set: str
    instruction: str
    urgency: str
    expected_response_time_s: float
    decline_slope_per_s: float
    initial_utility: float
    # Seconds in the scheduler's clock when the goal was issued, or None for "on receipt".
    stamp_s: float | None = None


def validate_goal(goal: GoalFields, *, levels: TufLevels, known_robots: dict[str, str] | None,
                  now_s: float) -> TaskSpec:
    """Return a TaskSpec or raise GoalError. `known_robots` maps robot id -> skill set; None
    accepts any well-formed robot id."""
    if not _TASK_ID.match(goal.task_id or ""):
        raise GoalError("task_id", "must be 1-128 characters of letters, digits, '_', '.', ':' or '-'")
    if not _ROBOT_ID.match(goal.robot_id or ""):
        raise GoalError("robot_id", f"{goal.robot_id!r} is not a valid ROS name segment")
    if known_robots is not None:
        if goal.robot_id not in known_robots:
            raise GoalError("robot_id", f"unknown robot {goal.robot_id!r}; known: "
                                        f"{', '.join(sorted(known_robots)) or 'none'}")
        expected = known_robots[goal.robot_id]
        if goal.skill_set and goal.skill_set != expected:
            raise GoalError("skill_set", f"robot {goal.robot_id!r} speaks {expected!r}, "
                                         f"not {goal.skill_set!r}")
    skill_set = goal.skill_set or (known_robots or {}).get(goal.robot_id, "")
    if not skill_set:
        raise GoalError("skill_set", "must name the robot kind (e.g. 'drone')")
    if not goal.instruction or not goal.instruction.strip():
        raise GoalError("instruction", "must not be empty")
    tuf = goal_tuf(goal, levels)
    arrival = now_s
    if goal.stamp_s is not None:
        if not math.isfinite(goal.stamp_s) or abs(goal.stamp_s - now_s) > MAX_STAMP_SKEW_S:
            raise GoalError("stamp", f"more than {MAX_STAMP_SKEW_S:.0f} s away from the planner's "
                                     "clock; leave it zero to use the receive time")
        arrival = min(goal.stamp_s, now_s)
    return TaskSpec(task_id=goal.task_id, robot_id=goal.robot_id, skill_set=skill_set,
                    instruction=goal.instruction.strip(), tuf=tuf, arrival_s=arrival,
                    urgency=goal.urgency or "custom")


_TUF_FIELDS = ("expected_response_time_s", "decline_slope_per_s", "initial_utility")


def goal_tuf(goal: GoalFields, levels: TufLevels) -> TUF:
    """A goal's TUF: its urgency level's, or its explicit (ERT, slope, U0) triple when the
    urgency is empty; GoalError names the field that is wrong."""
    values = (goal.expected_response_time_s, goal.decline_slope_per_s, goal.initial_utility)
    if goal.urgency:
        try:
            level = levels.get(goal.urgency)
        except KeyError as err:
            raise GoalError("urgency", str(err.args[0]) if err.args else "unknown level") from None
        # NaN != 0 too: any value that is not exactly zero counts as "given".
        given = [f"{name}={v!r}" for name, v in zip(_TUF_FIELDS, values) if v != 0.0]
        if given:
            raise GoalError("urgency", f"names the level {goal.urgency!r} but {', '.join(given)} "
                                       "is set too; name a level or give TUF values, not both")
        return level
    numbers = []
    for name, v in zip(_TUF_FIELDS, values):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise GoalError(name, f"must be a number, got {type(v).__name__}")
        numbers.append(float(v))
    if not any(numbers):
        # What an all-default message looks like: say what is missing, not "slope is zero".
        raise GoalError("urgency", f"empty, and no TUF values given: name a level "
                                   f"({', '.join(levels.names())}) or set {', '.join(_TUF_FIELDS)}")
    tuf = TUF(*numbers)
    try:
        tuf.validate()
    except TufError as err:
        field = {"ert_s": "expected_response_time_s", "slope_per_s": "decline_slope_per_s",
                 "initial_utility": "initial_utility"}.get(err.field, err.field)
        raise GoalError(field, err.reason) from None
    return tuf
