"""Changing a live task's time-utility function (TUF) from outside the loop, for front ends
(the ROS planner's UpdateTask service): parse the request as a goal's TUF is parsed, then apply
it with `SegmentScheduler.update_tuf`. The caller owns the scheduler's thread, as for every
other scheduler call. Cancelling needs nothing new (`SegmentScheduler.cancel` releases the
engine request, KV blocks and queue entry).
"""

from __future__ import annotations

from timelyllm_ros.core.errors import FieldError
from timelyllm_ros.core.task import TaskSpec
from timelyllm_ros.core.tuf import TUF, TufLevels
from timelyllm_ros.core.validation import GoalFields, goal_tuf


class UpdateError(FieldError):
    """An update that cannot apply: unknown or finished task."""


def tuf_from_fields(levels: TufLevels, urgency: str, expected_response_time_s: float,
                    decline_slope_per_s: float, initial_utility: float) -> TUF:
    """A level name or an explicit triple -> TUF, checked exactly as a goal's TUF is (the
    GoalError names the field)."""
    fields = GoalFields(task_id="", robot_id="", skill_set="", instruction="", urgency=urgency,
                        expected_response_time_s=expected_response_time_s,
                        decline_slope_per_s=decline_slope_per_s, initial_utility=initial_utility)
    return goal_tuf(fields, levels)


def update_tuf(scheduler, task_id: str, tuf: TUF, urgency: str) -> TaskSpec:
    """`scheduler.update_tuf` with its KeyError / ValueError turned into UpdateError (field
    `task_id`); the scheduler publishes the task's new status."""
    try:
        return scheduler.update_tuf(task_id, tuf, urgency)
    except (KeyError, ValueError) as err:
        text = str(err.args[0]) if err.args else str(err)
        raise UpdateError("task_id", text.removeprefix("task_id: ")) from None
