"""The inputs of `SegmentScheduler` from outside the loop, besides `submit`: a robot's report,
a new time-utility function for a live task, and a cancel. Each validates what it is given
(a ValueError / KeyError names the field) before it changes anything.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Mapping

from timelyllm_ros.core.sched.observations import observation_text
from timelyllm_ros.core.sched.sizes import context_of
from timelyllm_ros.core.sched.state import SchedulerState
from timelyllm_ros.core.sched.task_book import TaskBook
from timelyllm_ros.core.task import TaskRecord, TaskSpec
from timelyllm_ros.core.tuf import TUF


class TaskInputs:
    """Reports, TUF updates and cancels (module docstring), over the scheduler's state, with
    the task transitions (`book`)."""

    def __init__(self, state: SchedulerState, book: TaskBook):
        self.state = state
        self.book = book

    def on_report(self, task_id: str, sequence: int, started_s: float, finished_s: float,
                  success: bool, message: str = "", returned: bool = False,
                  values: Mapping[str, Any] | None = None) -> None:
        """A robot's execution report, with times already in the scheduler's clock.

        `values`: what the segment's skills returned, by variable (`{"_1": False}`); with the
        skill set's `observations` they go into the context of the generation that waits for
        this report before it resumes (core/sched/observations.py).

        `returned`: the segment ended the plan with a return (MiniSpec `->`): nothing after it
        will run, so the generation stops (engine request aborted, KV and queue entry freed)
        and the task ends `done` with the reason "returned", instead of generating segments
        that would never run."""
        state = self.state
        task = state.tasks.get(task_id)
        if task is None:
            raise KeyError(f"task_id: no task {task_id!r}")
        if isinstance(sequence, bool) or not isinstance(sequence, numbers.Integral) \
                or not 0 <= sequence < len(task.segments):
            raise ValueError(f"sequence: task {task_id!r} has no dispatched segment {sequence!r} "
                             f"({len(task.segments)} dispatched)")
        # Bad times are the robot's bug and must be reported even when the report is moot.
        if not _is_time(started_s):
            raise ValueError(f"started: {started_s!r} is not a finite time")
        if not _is_time(finished_s):
            raise ValueError(f"finished: {finished_s!r} is not a finite time")
        if finished_s < started_s:
            raise ValueError(f"finished: {finished_s} is before started {started_s}")
        if task.lifecycle.is_terminal:
            return
        segment = task.segments[int(sequence)]
        if segment.reported:
            return
        started_s, finished_s = float(started_s), float(finished_s)
        segment.started_s, segment.finished_s, segment.success = started_s, finished_s, success
        state.robots.settled(task.spec.robot_id, [segment])
        if success and segment.calls:
            state.exec_model.observe_segment(segment.calls, finished_s - started_s)
            self.book.note_segment_time(task.spec.skill_set, finished_s - started_s, observed=True)
        now = state.engine.now()
        if not success:
            self.book.finish(task, "fail", f"robot {task.spec.robot_id} reported failure of "
                                           f"segment {sequence}: {message or 'no message'}", now)
            return
        if returned:
            self.book.finish(task, "end_early", f"returned: the plan ended at segment {sequence}"
                                                + (f" ({message})" if message else ""), now)
            return
        if values:
            segment.values = dict(values)
        if task.awaiting_report == segment.sequence:
            self._resume_with_report(task, segment, now)
        # Everything still queued on this robot (any task) now starts from the reported finish.
        moved = state.robots.reschedule(task.spec.robot_id, finished_s,
                                        state.config.network_latency_s)
        state.deadlines.note(task)  # its next segment is now the one to wait for
        for other in moved:
            state.deadlines.note(other)
        if task.queue_slot is not None and task.queue_slot in state.queue:
            # The reported finish replaces the estimate as the suspended generation's reference.
            state.queue.update(task.queue_slot, reference_s=task.robot_free_at(now))
        self.book.maybe_complete(task, now)
        self.book.emit(task)

    def _resume_with_report(self, task: TaskRecord, segment, now: float) -> None:
        """The report a suspended generation waited for: append it, then queue the generation."""
        task.awaiting_report = None
        computed = context_of(task)
        if segment.values:
            text = observation_text(segment.values)
            task.observations.append((len(task.generated.token_ids),
                                      tuple(self.state.engine.tokenize(text))))
        self.book.requeue(task, now, computed=computed)

    def update_tuf(self, task_id: str, tuf: TUF, urgency: str) -> TaskSpec:
        """Give a live task a new TUF (and urgency label); the next priority computation uses
        it. Its queued generation's row gets the new k, U0 and class; the row's ERT becomes
        the new ERT for a first segment (a suspended generation keeps ERT 0, §4.2). A response
        already given keeps the utility it earned. KeyError for an unknown task, ValueError for
        a finished one (both name `task_id`)."""
        task = self.state.tasks.get(task_id)
        if task is None:
            raise KeyError(f"task_id: unknown task {task_id!r}")
        if task.lifecycle.is_terminal:
            raise ValueError(f"task_id: task {task_id!r} already ended ({task.state})")
        task.spec = dataclasses.replace(task.spec, tuf=tuf, urgency=urgency or "custom")
        slot, queue = task.queue_slot, self.state.queue
        if slot is not None and slot in queue:
            first = int(queue.get(slot)["segment_index"]) == 0
            queue.update(slot, ert_s=tuf.ert_s if first else 0.0, slope=tuf.slope_per_s,
                         initial_utility=tuf.initial_utility, task_ert_s=tuf.ert_s,
                         is_urgent=task.spec.is_urgent)
        self.book.emit(task)
        return task.spec

    def cancel(self, task_id: str, reason: str) -> None:
        task = self.state.tasks.get(task_id)
        if task is not None and not task.lifecycle.is_terminal:
            self.book.finish(task, "cancel", reason, self.state.engine.now())


def _is_time(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)

