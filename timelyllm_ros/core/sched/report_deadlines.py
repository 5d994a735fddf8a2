"""The earliest report deadline among the scheduler's tasks, without scanning them every tick.

A robot executes its segments in order, so only a task's first unreported segment can be overdue
(`first_unreported`). The scheduler needs, every tick, the tasks whose such segment is past its
deadline and the earliest such deadline (its next timer). Scanning every active task for that
cost most of a replay's time in overload (thousands of tasks, tens of thousands of ticks), so
the deadlines are kept in a heap instead.

The heap is lazy: whenever a task's first unreported segment or that segment's deadline may have
changed (a segment dispatched, a segment reported, a robot's timeline rescheduled), the scheduler
calls `note(task)`. An entry counts while its task is still active, it names that task's first
unreported segment, and its deadline is not after that segment's deadline: a lower bound. `note`
pushes only when the task has no such entry (a new segment to wait for, or a deadline moved
earlier); a deadline moved later keeps its old entry, which is re-keyed to the current deadline
when it reaches the top. Entries that no longer count are dropped when they reach the top. Every
active task thus has an entry at or below its deadline, so a top entry equal to its task's
deadline is the minimum.

Why postponements push nothing: each robot report reschedules every segment queued on that
robot, and in a deep backlog (hundreds of tasks per robot, docs/overload.md) a push per queued
task per report made the heap, not the engine, most of a replay's time.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Mapping

from timelyllm_ros.core.sched.sizes import first_unreported
from timelyllm_ros.core.task import TaskRecord


class ReportDeadlines:
    def __init__(self, active: Mapping[str, TaskRecord]):
        self._active = active  # the scheduler's non-terminal tasks (read only)
        # (deadline, submission index, push order, segment sequence, task): the submission
        # index orders equal deadlines as the scheduler's task order does; the push order keeps
        # two entries of one task from ever comparing their tasks.
        self._heap: list[tuple[float, int, int, int, TaskRecord]] = []
        self._pushes = itertools.count()
        # task id -> (task, sequence, deadline) of its lowest entry for that segment: `note`
        # need not push while that entry is a lower bound of the segment's deadline.
        self._lowest: dict[str, tuple[TaskRecord, int, float]] = {}

    def note(self, task: TaskRecord) -> None:
        """`task`'s first unreported segment, or its deadline, may have changed."""
        segment = first_unreported(task)
        if segment is None or math.isnan(segment.report_deadline_s):
            return  # nothing to wait for (a NaN deadline never expires)
        deadline = segment.report_deadline_s
        lowest = self._lowest.get(task.task_id)
        if lowest is not None and lowest[0] is task and lowest[1] == segment.sequence \
                and lowest[2] <= deadline:
            return  # its entry is still a lower bound; re-keyed when it reaches the top
        self._push(deadline, segment.sequence, task)

    def _push(self, deadline: float, sequence: int, task: TaskRecord) -> None:
        heapq.heappush(self._heap, (deadline, task.submit_index, next(self._pushes), sequence,
                                    task))
        self._lowest[task.task_id] = (task, sequence, deadline)

    def _settle_top(self) -> None:
        """Drop entries that no longer count and re-key postponed ones until the top entry (if
        any) holds its task's current deadline."""
        heap = self._heap
        while heap:
            deadline, _, _, sequence, task = heap[0]
            current = None
            if self._active.get(task.task_id) is task:
                segment = first_unreported(task)
                if segment is not None and segment.sequence == sequence:
                    current = segment.report_deadline_s
            if current is None or not deadline <= current:
                # Ended, reported, or superseded by a lower entry pushed when it moved earlier.
                heapq.heappop(heap)
                lowest = self._lowest.get(task.task_id)
                if lowest is not None and lowest[0] is task and lowest[1] == sequence \
                        and lowest[2] == deadline:
                    del self._lowest[task.task_id]  # (so that `note` pushes again)
                continue
            if deadline < current:  # postponed since it was pushed
                heapq.heappop(heap)
                self._push(current, sequence, task)
                continue
            return

    def earliest(self) -> float | None:
        """The earliest deadline of an active task's first unreported segment (None: none)."""
        self._settle_top()
        return self._heap[0][0] if self._heap else None

    def overdue(self, now: float) -> list[TaskRecord]:
        """Active tasks whose first unreported segment's deadline is before `now`, in submission
        order (the order in which the scheduler's task scan met them). They stay in the heap
        until they end."""
        found: dict[int, TaskRecord] = {}
        kept = []
        heap = self._heap
        while True:
            self._settle_top()
            if not heap or not heap[0][0] < now:
                break
            entry = heapq.heappop(heap)
            kept.append(entry)
            found[entry[4].submit_index] = entry[4]
        for entry in kept:  # a task that does not end keeps its entry
            heapq.heappush(heap, entry)
        return [found[i] for i in sorted(found)]
