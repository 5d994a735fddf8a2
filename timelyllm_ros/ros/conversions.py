"""Message <-> core conversions. The only place that knows both sides' field names."""

from __future__ import annotations

import math
import re
import time

from builtin_interfaces.msg import Time

from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.core.sched.interface import SegmentDispatch
from timelyllm_ros.core.task import TaskSnapshot
from timelyllm_ros.core.validation import GoalFields
from timelyllm_ros.msg import SkillSegment, TaskGoal, TaskStatus

_WIRE_CALL = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\((?P<args>.*)\)$")


def time_to_s(stamp: Time) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def s_to_time(seconds: float) -> Time:
    sec = math.floor(seconds)
    return Time(sec=int(sec), nanosec=int(round((seconds - sec) * 1e9)) % 1_000_000_000)


class ClockBridge:
    """Maps ROS time to the engine's monotonic clock, in which the scheduler works. Nodes pass
    their node clock as `ros_now` (so use_sim_time applies); the wall-clock default is for
    code outside a node."""

    def __init__(self, engine_now=time.monotonic, ros_now=time.time):
        self._engine_now = engine_now
        self._ros_now = ros_now

    def offset(self) -> float:
        """ROS time minus engine time, now. It drifts (the simulated engine's clock is paced
        to the wall clock, not locked to it), so times that must keep their order (a
        segment's start and finish) are converted with one reading of it."""
        return self._ros_now() - self._engine_now()

    def to_engine(self, ros_seconds: float, offset: float | None = None) -> float:
        return ros_seconds - (self.offset() if offset is None else offset)

    def to_ros(self, engine_seconds: float) -> float:
        return engine_seconds + self.offset()


def goal_fields(msg: TaskGoal, clock: ClockBridge) -> GoalFields:
    stamp = time_to_s(msg.stamp)
    return GoalFields(
        task_id=msg.task_id, robot_id=msg.robot_id, skill_set=msg.skill_set,
        instruction=msg.instruction, urgency=msg.urgency,
        expected_response_time_s=msg.expected_response_time_s,
        decline_slope_per_s=msg.decline_slope_per_s, initial_utility=msg.initial_utility,
        stamp_s=clock.to_engine(stamp) if stamp > 0 else None,
    )


def segment_msg(segment: SegmentDispatch, stamp: Time) -> SkillSegment:
    return SkillSegment(
        task_id=segment.task_id, robot_id=segment.robot_id, sequence=segment.sequence,
        text=segment.text, calls=[c.to_wire() for c in segment.calls], is_last=segment.is_last,
        estimated_execution_s=float(segment.estimated_execution_s), stamp=stamp)


def parse_wire_call(text: str) -> SkillCall:
    """Inverse of SkillCall.to_wire; raises ValueError naming the offending text."""
    m = _WIRE_CALL.match(text.strip())
    if m is None:
        raise ValueError(f"calls: {text!r} is not of the form name(arg,...)")
    args = tuple(a for a in m.group("args").split(",")) if m.group("args") else ()
    return SkillCall(name=m.group("name"), args=args, source=text)


def status_msg(snapshot: TaskSnapshot, stamp: Time) -> TaskStatus:
    return TaskStatus(
        task_id=snapshot.task_id, robot_id=snapshot.robot_id, state=snapshot.state,
        reason=snapshot.reason, response_time_s=float(snapshot.response_time_s),
        utility=float(snapshot.utility), waiting_time_s=float(snapshot.waiting_time_s),
        segments_dispatched=snapshot.segments_dispatched,
        segments_completed=snapshot.segments_completed, resumes=snapshot.resumes,
        cached_tokens_last_resume=snapshot.cached_tokens_last_resume,
        cached_tokens_total=snapshot.cached_tokens_total, stamp=stamp)
