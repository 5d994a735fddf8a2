"""When each robot is expected to be free, across all of its tasks.

A robot executes segments in the order they reach it, whatever task they belong to, so a segment
dispatched to a robot still busy with another task's segments starts only after them. Estimates
of completion (and hence report deadlines and the reference time of suspended generations) must
include that queue, or a robot serving two tasks would be declared dead for the second.
"""

from __future__ import annotations

from collections import defaultdict

from timelyllm_ros.core.task import SegmentRecord


class RobotTimelines:
    def __init__(self) -> None:
        self._pending: dict[str, list[SegmentRecord]] = defaultdict(list)

    def free_at(self, robot_id: str, earliest: float) -> float:
        pending = self._pending.get(robot_id)
        if not pending:
            return earliest
        return max(earliest, max(s.estimated_done_s for s in pending))

    def dispatched(self, robot_id: str, segment: SegmentRecord) -> None:
        self._pending[robot_id].append(segment)

    def settled(self, robot_id: str, segments: list[SegmentRecord]) -> None:
        """Segments that were reported, or whose task ended: they no longer hold the robot."""
        pending = self._pending.get(robot_id)
        if not pending:
            return
        gone = {id(s) for s in segments}
        pending[:] = [s for s in pending if id(s) not in gone]
        if not pending:
            del self._pending[robot_id]

    def reschedule(self, robot_id: str, free_from: float, network_latency_s: float) -> None:
        """The robot was free at `free_from` (a report): shift every queued segment's estimated
        completion and report deadline to follow from it, in the order the robot runs them."""
        free = free_from
        for segment in self._pending.get(robot_id, ()):
            start = max(segment.dispatched_s + network_latency_s, free)
            shift = start + segment.estimated_execution_s - segment.estimated_done_s
            segment.estimated_done_s += shift
            segment.report_deadline_s += shift
            free = segment.estimated_done_s

    def pending_count(self, robot_id: str) -> int:
        return len(self._pending.get(robot_id, ()))
