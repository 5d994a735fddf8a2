"""When each robot is expected to be free, across all of its tasks.

A robot executes segments in the order they reach it, whatever task they belong to, so a segment
dispatched to a robot still busy with another task's segments starts only after them. Estimates
of completion (and hence report deadlines and the reference time of suspended generations) must
include that queue, or a robot serving two tasks would be declared dead for the second.

Two chains per robot. The estimated one runs every queued segment for its minimum execution (the
paper's rule for priorities): `free_at`, each segment's `estimated_done_s`. The latest one runs
every queued segment for its longest plausible execution, and places report deadlines: a robot is
declared dead only when even that cannot explain a missing report. With the estimated chain, a
segment queued behind others was given its own longest time but only the others' minimum, so a
healthy robot with a deep queue was declared dead whenever one segment ahead ran long: in a deep
overload with the planner's 5 s timeout, 94 of 691 tasks failed on robots that all reported
(docs/overload.md).
"""

from __future__ import annotations

from typing import Hashable

from timelyllm_ros.core.task import SegmentRecord


class RobotTimelines:
    """Per robot, its dispatched and unreported segments in dispatch order, on both chains.

    Costs (a deep overload queues hundreds of segments on one robot, docs/overload.md): `free_at`
    and `latest_free_at` are O(1), `settled` O(segments settled) unless it settles the robot's
    last segment, and `reschedule` walks the robot's queue once, since every estimate moves."""

    def __init__(self) -> None:
        # robot -> {id(segment): [segment, owner, latest start, longest execution]}: its
        # dispatched, unreported segments in dispatch order (a dict keeps insertion order and
        # removes any entry in O(1): a robot may report out of dispatch order), each with what
        # the caller said it belongs to (the scheduler: the task). The segment is held, so its
        # id stays unique while it is here.
        self._pending: dict[str, dict[int, list]] = {}
        # robot -> the latest estimated_done_s, and the latest latest-chain finish, of its
        # pending segments.
        self._last_done: dict[str, float] = {}
        self._latest_done: dict[str, float] = {}

    def free_at(self, robot_id: str, earliest: float) -> float:
        """When the robot is expected to be free (every queued segment at its minimum)."""
        if robot_id not in self._pending:
            return earliest
        return max(earliest, self._last_done[robot_id])

    def latest_free_at(self, robot_id: str, earliest: float) -> float:
        """When the robot is free at the latest (every queued segment at its longest)."""
        if robot_id not in self._pending:
            return earliest
        return max(earliest, self._latest_done[robot_id])

    def dispatched(self, robot_id: str, segment: SegmentRecord, owner: Hashable = None,
                   latest_start: float | None = None, longest_s: float | None = None) -> None:
        """Queue `segment`. `latest_start` / `longest_s`: its start on the latest chain and its
        longest plausible execution (the caller placed its report deadline from them); by
        default its estimated start and execution."""
        if longest_s is None:
            longest_s = segment.estimated_execution_s
        if latest_start is None:
            latest_start = segment.estimated_done_s - segment.estimated_execution_s
        latest_done = latest_start + longest_s
        pending = self._pending.get(robot_id)
        if pending is None:
            pending = self._pending[robot_id] = {}
            self._last_done[robot_id] = segment.estimated_done_s
            self._latest_done[robot_id] = latest_done
        else:
            self._last_done[robot_id] = max(self._last_done[robot_id], segment.estimated_done_s)
            self._latest_done[robot_id] = max(self._latest_done[robot_id], latest_done)
        pending[id(segment)] = [segment, owner, latest_start, longest_s]

    def settled(self, robot_id: str, segments: list[SegmentRecord]) -> None:
        """Segments that were reported, or whose task ended: they no longer hold the robot."""
        pending = self._pending.get(robot_id)
        if not pending:
            return
        last, latest = self._last_done[robot_id], self._latest_done[robot_id]
        dropped_last = False
        for segment in segments:
            entry = pending.pop(id(segment), None)
            if entry is not None and (segment.estimated_done_s >= last
                                      or entry[2] + entry[3] >= latest):
                dropped_last = True
        if not pending:
            del self._pending[robot_id], self._last_done[robot_id], self._latest_done[robot_id]
        elif dropped_last:
            self._last_done[robot_id] = max(e[0].estimated_done_s for e in pending.values())
            self._latest_done[robot_id] = max(e[2] + e[3] for e in pending.values())

    def reschedule(self, robot_id: str, free_from: float, network_latency_s: float) -> list:
        """The robot was free at `free_from` (a report): both chains restart from it, in the
        order the robot runs its queue. Every queued segment's estimated completion follows the
        estimated chain, its report deadline moves with its start on the latest chain. Returns
        the owners of the segments it moved (each once, in robot order)."""
        pending = self._pending.get(robot_id)
        if not pending:
            return []
        free = latest = free_from
        last = latest_done = -float("inf")
        moved: dict[int, Hashable] = {}
        previous = None
        for entry in pending.values():
            segment, owner = entry[0], entry[1]
            ready = segment.dispatched_s + network_latency_s
            start = max(ready, free)
            segment.estimated_done_s += start + segment.estimated_execution_s \
                - segment.estimated_done_s
            free = segment.estimated_done_s
            latest_start = max(ready, latest)
            segment.report_deadline_s += latest_start - entry[2]
            entry[2] = latest_start
            latest = latest_start + entry[3]
            if free > last:
                last = free
            if latest > latest_done:
                latest_done = latest
            if owner is not previous:  # a task's segments are mostly queued back to back
                previous = owner
                moved.setdefault(id(owner), owner)
        self._last_done[robot_id] = last
        self._latest_done[robot_id] = latest_done
        return list(moved.values())

    def pending_count(self, robot_id: str) -> int:
        return len(self._pending.get(robot_id, ()))
