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

Every report restarts both chains of its robot, so a deep queue (hundreds of segments, one
overloaded replay reschedules 36,000 times) is rescheduled with whole-array operations: while no
segment waits for its own dispatch (the robot is busy past it), each chain is a running sum, which
`np.add.accumulate` computes left to right with the very rounding of the step-by-step loop. The
first segment where that does not hold (an idle gap in a chain, or an estimate whose update does
not land exactly on its new value, see `_chains_stepwise`) and everything after it go through the
loop, so the estimates are the loop's, bit for bit (test_robot_timeline.py checks it).
"""

from __future__ import annotations

from typing import Hashable

import numpy as np

from timelyllm_ros.core.task import SegmentRecord

# Queues at least this long are rescheduled with whole-array operations; below it the loop's
# lower fixed cost wins. A speed knob only: both paths give the same estimates.
VECTORISE_FROM = 16


class _RobotQueue:
    """One robot's dispatched, unreported segments in dispatch order, as parallel lists of what
    rescheduling reads, and the latest finish on each chain."""

    __slots__ = ("ids", "segments", "owners", "dispatched", "execution", "done",
                 "latest_start", "longest", "last_done", "latest_done")

    def __init__(self) -> None:
        self.ids: list[int] = []  # id(segment): the segment is held, so its id stays unique
        self.segments: list[SegmentRecord] = []
        self.owners: list[Hashable] = []  # what the caller said each belongs to (the task)
        self.dispatched: list[float] = []
        self.execution: list[float] = []  # estimated (minimum) execution
        # Each segment's estimated_done_s, as read without an attribute lookup per segment
        # (only this module moves a queued segment's estimate, and it writes both).
        self.done: list[float] = []
        self.latest_start: list[float] = []  # its start on the latest chain
        self.longest: list[float] = []  # longest plausible execution
        self.last_done = -float("inf")  # latest estimated_done_s of its segments
        self.latest_done = -float("inf")  # latest finish on the latest chain

    def append(self, segment: SegmentRecord, owner: Hashable, latest_start: float,
               longest_s: float) -> None:
        self.ids.append(id(segment))
        self.segments.append(segment)
        self.owners.append(owner)
        self.dispatched.append(segment.dispatched_s)
        self.execution.append(segment.estimated_execution_s)
        self.done.append(segment.estimated_done_s)
        self.latest_start.append(latest_start)
        self.longest.append(longest_s)

    def remove(self, at: int) -> None:
        for column in (self.ids, self.segments, self.owners, self.dispatched, self.execution,
                       self.done, self.latest_start, self.longest):
            del column[at]


class RobotTimelines:
    """Per robot, its dispatched and unreported segments in dispatch order, on both chains.

    Costs: `free_at` and `latest_free_at` are O(1), `settled` O(queue) at C speed (a list
    search and deletion) unless it settles the robot's last segment, and `reschedule` walks the
    robot's queue once, since every estimate moves (at C speed from `VECTORISE_FROM` segments)."""

    def __init__(self) -> None:
        self._queues: dict[str, _RobotQueue] = {}

    def free_at(self, robot_id: str, earliest: float) -> float:
        """When the robot is expected to be free (every queued segment at its minimum)."""
        queue = self._queues.get(robot_id)
        if queue is None:
            return earliest
        return max(earliest, queue.last_done)

    def latest_free_at(self, robot_id: str, earliest: float) -> float:
        """When the robot is free at the latest (every queued segment at its longest)."""
        queue = self._queues.get(robot_id)
        if queue is None:
            return earliest
        return max(earliest, queue.latest_done)

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
        queue = self._queues.get(robot_id)
        if queue is None:
            queue = self._queues[robot_id] = _RobotQueue()
            queue.last_done = segment.estimated_done_s
            queue.latest_done = latest_done
        else:
            queue.last_done = max(queue.last_done, segment.estimated_done_s)
            queue.latest_done = max(queue.latest_done, latest_done)
        queue.append(segment, owner, latest_start, longest_s)

    def settled(self, robot_id: str, segments: list[SegmentRecord]) -> None:
        """Segments that were reported, or whose task ended: they no longer hold the robot."""
        queue = self._queues.get(robot_id)
        if queue is None:
            return
        last, latest = queue.last_done, queue.latest_done
        dropped_last = False
        for segment in segments:
            try:
                at = queue.ids.index(id(segment))
            except ValueError:
                continue
            if segment.estimated_done_s >= last \
                    or queue.latest_start[at] + queue.longest[at] >= latest:
                dropped_last = True
            queue.remove(at)
        if not queue.ids:
            del self._queues[robot_id]
        elif dropped_last:
            queue.last_done = max(queue.done)
            queue.latest_done = max(s + g for s, g in zip(queue.latest_start, queue.longest))

    def reschedule(self, robot_id: str, free_from: float, network_latency_s: float) -> list:
        """The robot was free at `free_from` (a report): both chains restart from it, in the
        order the robot runs its queue. Every queued segment's estimated completion follows the
        estimated chain, its report deadline moves with its start on the latest chain. Returns
        the owners of the segments it moved (each once, in robot order)."""
        queue = self._queues.get(robot_id)
        if queue is None:
            return []
        if len(queue.ids) >= VECTORISE_FROM:
            _chains_vectorised(queue, free_from, network_latency_s)
        else:
            queue.last_done, queue.latest_done = _chains_stepwise(
                queue, 0, free_from, free_from, network_latency_s)
        moved: dict[int, Hashable] = {}
        previous = None
        for owner in queue.owners:
            if owner is not previous:  # a task's segments are mostly queued back to back
                previous = owner
                moved.setdefault(id(owner), owner)
        return list(moved.values())

    def pending_count(self, robot_id: str) -> int:
        queue = self._queues.get(robot_id)
        return 0 if queue is None else len(queue.ids)


def _chains_stepwise(queue: _RobotQueue, first: int, free: float, latest: float,
                     network_latency_s: float) -> tuple[float, float]:
    """Both chains from segment `first` on, one segment at a time, the robot free from `free`
    (estimated chain) and `latest` (latest chain). Returns the latest finish on each chain
    (-inf for none).

    A segment's estimate moves by the difference between its new and old value (`done += new -
    done`): that lands exactly on the new value unless old and new differ by more than a factor
    of two (Sterbenz), and the next segment starts from what it landed on."""
    last = latest_done = -float("inf")
    segments, dispatched, execution = queue.segments, queue.dispatched, queue.execution
    done, latest_start, longest = queue.done, queue.latest_start, queue.longest
    for i in range(first, len(segments)):
        segment = segments[i]
        ready = dispatched[i] + network_latency_s
        start = max(ready, free)
        segment.estimated_done_s += start + execution[i] - segment.estimated_done_s
        free = done[i] = segment.estimated_done_s
        start_latest = max(ready, latest)
        segment.report_deadline_s += start_latest - latest_start[i]
        latest_start[i] = start_latest
        latest = start_latest + longest[i]
        if free > last:
            last = free
        if latest > latest_done:
            latest_done = latest
    return last, latest_done


def _chains_vectorised(queue: _RobotQueue, free_from: float, network_latency_s: float) -> None:
    """`_chains_stepwise` from the first segment, with whole-array operations up to the first
    segment where the running sums do not reproduce the loop, and the loop from there."""
    ready = np.add(queue.dispatched, network_latency_s)
    # The estimated chain while every segment starts when the one before it is done: the
    # loop's additions, in its order. Each estimate moves by `new - old` as in the loop.
    sums = np.add.accumulate(np.concatenate(([free_from], queue.execution)))
    old_done = np.array(queue.done)
    done = old_done + (sums[1:] - old_done)
    # The latest chain likewise: each start is the previous latest finish.
    latest = np.add.accumulate(np.concatenate(([free_from], queue.longest)))
    starts_latest = latest[:-1]
    # Where the sums stop being the loop's: a segment that waits for its own dispatch on
    # either chain, or an estimate that did not land on its new value (its successor would
    # start from where it landed).
    off = (ready > sums[:-1]) | (ready > starts_latest) | (done != sums[1:])
    cut = int(off.argmax()) if off.any() else len(off)
    segments = queue.segments
    shifts = (starts_latest[:cut] - np.asarray(queue.latest_start[:cut])).tolist()
    new_done = done[:cut].tolist()
    for segment, value, shift in zip(segments, new_done, shifts):
        segment.estimated_done_s = value
        segment.report_deadline_s += shift
    queue.done[:cut] = new_done
    queue.latest_start[:cut] = starts_latest[:cut].tolist()
    last = float(done[:cut].max()) if cut else -float("inf")
    latest_done = float(latest[1:cut + 1].max()) if cut else -float("inf")
    if cut < len(segments):
        free = float(done[cut - 1]) if cut else free_from
        rest_last, rest_latest = _chains_stepwise(queue, cut, free, float(latest[cut]),
                                                  network_latency_s)
        last, latest_done = max(last, rest_last), max(latest_done, rest_latest)
    queue.last_done, queue.latest_done = last, latest_done
