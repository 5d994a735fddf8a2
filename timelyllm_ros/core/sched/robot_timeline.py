"""When each robot is expected to be free, across all of its tasks.

A robot executes segments in the order they reach it, whatever task they belong to, so a segment
dispatched to a robot still busy with another task's segments starts only after them. Estimates
of completion (and hence report deadlines and the reference time of suspended generations) must
include that queue, or a robot serving two tasks would be declared dead for the second.
"""

from __future__ import annotations

from typing import Hashable

from timelyllm_ros.core.task import SegmentRecord


class RobotTimelines:
    """Per robot, its dispatched and unreported segments in dispatch order.

    Costs (a deep overload queues hundreds of segments on one robot, docs/overload.md): `free_at`
    is O(1), `settled` O(segments settled) unless it settles the robot's latest estimate, and
    `reschedule` walks the robot's queue once, since every estimate in it moves."""

    def __init__(self) -> None:
        # robot -> {id(segment): (segment, owner)}: its dispatched, unreported segments in
        # dispatch order (a dict keeps insertion order and removes any entry in O(1): a robot
        # that serves tasks in arrival order reports out of dispatch order), each with what the
        # caller said it belongs to (the scheduler: the task). The segment is held, so its id
        # stays unique while it is here.
        self._pending: dict[str, dict[int, tuple[SegmentRecord, Hashable]]] = {}
        # robot -> the latest estimated_done_s among its pending segments.
        self._last_done: dict[str, float] = {}

    def free_at(self, robot_id: str, earliest: float) -> float:
        if robot_id not in self._pending:
            return earliest
        return max(earliest, self._last_done[robot_id])

    def dispatched(self, robot_id: str, segment: SegmentRecord, owner: Hashable = None) -> None:
        pending = self._pending.get(robot_id)
        if pending is None:
            pending = self._pending[robot_id] = {}
            self._last_done[robot_id] = segment.estimated_done_s
        else:
            self._last_done[robot_id] = max(self._last_done[robot_id], segment.estimated_done_s)
        pending[id(segment)] = (segment, owner)

    def settled(self, robot_id: str, segments: list[SegmentRecord]) -> None:
        """Segments that were reported, or whose task ended: they no longer hold the robot."""
        pending = self._pending.get(robot_id)
        if not pending:
            return
        last = self._last_done[robot_id]
        dropped_last = False
        for segment in segments:
            if pending.pop(id(segment), None) is not None and segment.estimated_done_s >= last:
                dropped_last = True
        if not pending:
            del self._pending[robot_id], self._last_done[robot_id]
        elif dropped_last:
            self._last_done[robot_id] = max(s.estimated_done_s for s, _ in pending.values())

    def reschedule(self, robot_id: str, free_from: float, network_latency_s: float) -> list:
        """The robot was free at `free_from` (a report): shift every queued segment's estimated
        completion and report deadline to follow from it, in the order the robot runs them.
        Returns the owners of the segments it moved (each once, in robot order)."""
        pending = self._pending.get(robot_id)
        if not pending:
            return []
        free = free_from
        last = -float("inf")
        moved: dict[int, Hashable] = {}
        previous = None
        for segment, owner in pending.values():
            start = max(segment.dispatched_s + network_latency_s, free)
            shift = start + segment.estimated_execution_s - segment.estimated_done_s
            segment.estimated_done_s += shift
            segment.report_deadline_s += shift
            free = segment.estimated_done_s
            if free > last:
                last = free
            if owner is not previous:  # a task's segments are mostly queued back to back
                previous = owner
                moved.setdefault(id(owner), owner)
        self._last_done[robot_id] = last
        return list(moved.values())

    def pending_count(self, robot_id: str) -> int:
        return len(self._pending.get(robot_id, ()))
