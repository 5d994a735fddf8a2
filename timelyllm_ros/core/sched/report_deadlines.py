"""The earliest report deadline among the scheduler's tasks, without scanning them every tick.

A robot executes its segments in order, so only a task's first unreported segment can be overdue
(`first_unreported`). The scheduler needs, every tick, the tasks whose such segment is past its
deadline and the earliest such deadline (its next timer). Scanning every active task for that
cost most of a replay's time in overload (thousands of tasks, tens of thousands of ticks), so
the deadlines are kept in a heap instead.

The heap is lazy: whenever a task's first unreported segment or that segment's deadline may have
changed (a segment dispatched, a segment reported, a robot's timeline rescheduled), the scheduler
calls `note(task)`, which pushes the current (deadline, task). Older entries of the task stay in
the heap and are dropped when they reach the top: an entry counts only while its task is still
active and it still names that task's first unreported segment with that deadline. The current
entry of every active task is therefore always in the heap, and the valid top is the minimum.
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

    def note(self, task: TaskRecord) -> None:
        """`task`'s first unreported segment, or its deadline, may have changed."""
        segment = first_unreported(task)
        if segment is None or math.isnan(segment.report_deadline_s):
            return  # nothing to wait for (a NaN deadline never expires)
        heapq.heappush(self._heap, (segment.report_deadline_s, task.submit_index,
                                    next(self._pushes), segment.sequence, task))

    def _is_current(self, entry: tuple[float, int, int, int, TaskRecord]) -> bool:
        deadline, _, _, sequence, task = entry
        if self._active.get(task.task_id) is not task:
            return False
        segment = first_unreported(task)
        return segment is not None and segment.sequence == sequence \
            and segment.report_deadline_s == deadline

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and not self._is_current(heap[0]):
            heapq.heappop(heap)

    def earliest(self) -> float | None:
        """The earliest deadline of an active task's first unreported segment (None: none)."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def overdue(self, now: float) -> list[TaskRecord]:
        """Active tasks whose first unreported segment's deadline is before `now`, in submission
        order (the order in which the scheduler's task scan met them). They stay in the heap
        until they end."""
        found: dict[int, TaskRecord] = {}
        kept = []
        heap = self._heap
        while True:
            self._drop_stale()
            if not heap or not heap[0][0] < now:
                break
            entry = heapq.heappop(heap)
            kept.append(entry)
            found[entry[4].submit_index] = entry[4]
        for entry in kept:  # a task that does not end keeps its entry
            heapq.heappush(heap, entry)
        return [found[i] for i in sorted(found)]
