"""When each robot is expected to be free, across all of its tasks.

A robot executes segments in the order they reach it, whatever task they belong to, so a segment
dispatched to a robot still busy with another task's segments starts only after them. Estimates
of completion (and hence report deadlines and the reference time of suspended generations) must
include that queue, or a robot serving two tasks would be declared dead for the second.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Hashable

from timelyllm_ros.core.task import SegmentRecord


class RobotTimelines:
    def __init__(self) -> None:
        # robot -> [(segment, owner)]: its dispatched, unreported segments in dispatch order,
        # each with what the caller said it belongs to (the scheduler: the task).
        self._pending: dict[str, list[tuple[SegmentRecord, Hashable]]] = defaultdict(list)

    def free_at(self, robot_id: str, earliest: float) -> float:
        pending = self._pending.get(robot_id)
        if not pending:
            return earliest
        return max(earliest, max(s.estimated_done_s for s, _ in pending))

    def dispatched(self, robot_id: str, segment: SegmentRecord, owner: Hashable = None) -> None:
        self._pending[robot_id].append((segment, owner))

    def settled(self, robot_id: str, segments: list[SegmentRecord]) -> None:
        """Segments that were reported, or whose task ended: they no longer hold the robot."""
        pending = self._pending.get(robot_id)
        if not pending:
            return
        gone = {id(s) for s in segments}
        pending[:] = [p for p in pending if id(p[0]) not in gone]
        if not pending:
            del self._pending[robot_id]

    def reschedule(self, robot_id: str, free_from: float, network_latency_s: float) -> list:
        """The robot was free at `free_from` (a report): shift every queued segment's estimated
        completion and report deadline to follow from it, in the order the robot runs them.
        Returns the owners of the segments it moved (each once, in robot order)."""
        free = free_from
        moved: dict[int, Hashable] = {}
        for segment, owner in self._pending.get(robot_id, ()):
            start = max(segment.dispatched_s + network_latency_s, free)
            shift = start + segment.estimated_execution_s - segment.estimated_done_s
            segment.estimated_done_s += shift
            segment.report_deadline_s += shift
            free = segment.estimated_done_s
            moved.setdefault(id(owner), owner)
        return list(moved.values())

    def pending_count(self, robot_id: str) -> int:
        return len(self._pending.get(robot_id, ()))
