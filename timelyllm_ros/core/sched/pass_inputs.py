"""What an admission pass reads of the scheduler's state (core/sched/admission_step.py walks
it): the running batch as admission controllers see it, the free KV blocks, the blocks a queued
generation needs and those its preserved pause still holds, where each candidate of a pass is
and which replica would run it. Reads only: nothing here changes the engine or a task."""

from __future__ import annotations

import numpy as np

from timelyllm_ros.core.engine.base import PRESERVE
from timelyllm_ros.core.sched.interface import RunningGen
from timelyllm_ros.core.sched.queue_view import QueueView
from timelyllm_ros.core.sched.sizes import bound_of, context_of
from timelyllm_ros.core.sched.state import SchedulerState
from timelyllm_ros.core.sched.task_book import TaskBook, deadline_of
from timelyllm_ros.core.task import TaskRecord


class PassInputs:
    """The scheduler's state as an admission pass reads it (module docstring); `book` gives a
    task's skill set."""

    def __init__(self, state: SchedulerState, book: TaskBook):
        self.state = state
        self.book = book

    def positions_in(self, view: QueueView, rows: np.ndarray):
        """key -> its position in this pass's walk order (`rows`), None where it is not a
        candidate of the pass; as of the pass's start (admissions move the queue's rows)."""
        tasks, queue = self.state.tasks, self.state.queue
        position_of_row = None

        def position_of(key: str) -> int | None:
            nonlocal position_of_row
            slot = tasks[key].queue_slot
            if slot is None:
                return None
            if position_of_row is None:
                position_of_row = np.full(len(view), -1, dtype=np.int64)
                position_of_row[rows] = np.arange(len(rows))
            position = int(position_of_row[queue.index_of(slot)])
            return None if position < 0 else position

        return position_of

    def placements(self, keys: list) -> np.ndarray:
        """Per queued key, the replica that would run it if it started now
        (`EngineAdapter.replica_for`), -1 where none can. A plan never submitted has no home
        yet: every one of them gets the router's pick of now, asked once per pass (nothing is
        submitted before the walk)."""
        tasks, replica_for = self.state.tasks, self.state.engine.replica_for
        out = np.full(len(keys), -1, dtype=np.int64)
        pick: int | None = -1  # the router's pick for a new plan, once asked
        for j, key in enumerate(keys):
            task = tasks[key]
            if task.engine_requests:
                replica = replica_for(next_run_id(task))
            else:
                if pick == -1:
                    pick = replica_for(next_run_id(task))
                replica = pick
            if replica is not None:
                out[j] = replica
        return out

    def batch_state(self, now: float,
                    known: list[RunningGen] | None = None) -> list[RunningGen]:
        """The running batch, as candidate-aware admission controllers see it. `known`: records
        built at this `now` of generations that have not run a step since (they are reused)."""
        run_bound, shared_of = self.state.run_bound, self.state.shared_of
        replica_for = self.state.engine.replica_for
        reuse = {g.key: g for g in known} if known else {}
        out = []
        for rid, task in self.state.running.items():
            if reuse:
                gen = reuse.get(task.spec.task_id)
                if gen is not None:
                    out.append(gen)
                    continue
            tuf = task.spec.tuf
            out.append(RunningGen(task.task_id, context_of(task), task.tokens_this_run,
                                  run_bound.get(rid, 0), deadline_of(task, now),
                                  task.spec.is_urgent, task.spec.skill_set,
                                  shared_of.get(task.task_id, 0), len(task.segments),
                                  tuf.initial_utility, tuf.slope_per_s, replica_for(rid)))
        return out

    def free_blocks(self) -> int:
        engine = self.state.engine
        free = engine.kv_usage().free_blocks
        if not self.state.running and self.state.paused:
            # With nothing running the engine revokes preserved pauses for a waiting request
            # (else it could wait for ever on blocks that only a queued generation would free).
            free += engine.pinned_blocks()
        return free

    def running_budgets(self, now: float) -> list[tuple[int, float, int]]:
        return [self.budget_of(task, now) for task in self.state.running.values()]

    def budget_of(self, task: TaskRecord, now: float) -> tuple[int, float, int]:
        # (tokens so far, remaining budget, this generation's own segment bound): in a mixed
        # fleet a drone segment is bounded by 10 tokens, a chat one by 60.
        bound = self.state.run_bound.get(task.engine_request_id)
        if bound is None:
            bound = self.book.skill_set_of(task.spec).max_segment_tokens
        return task.tokens_this_run, deadline_of(task, now) - now, bound

    def blocks_needed(self, task: TaskRecord) -> int:
        bs = self.state.context.kv_block_size
        context = context_of(task)
        tokens = context + bound_of(task, self.book.skill_set_of(task.spec))
        return -(-tokens // bs) - self.preserved_blocks(task, context)

    def preserved_blocks(self, task: TaskRecord, context: int) -> int:
        """Blocks a preserved pause of `task` still holds in the engine (its full blocks)."""
        if not self._still_preserved(task.task_id):
            return 0
        return self._full_blocks(context)

    def preserved_blocks_of(self, task_id: str) -> int:
        """`preserved_blocks` of the task `task_id`, its context counted only when its pause
        is still preserved (a pass asks this of every paused generation)."""
        if not self._still_preserved(task_id):
            return 0
        return self._full_blocks(context_of(self.state.tasks[task_id]))

    def preserved_blocks_all(self) -> dict[str, int]:
        """`preserved_blocks_of` of every paused generation at once, those holding none left
        out: one loop over the paused (a pass reads them all, dozens in overload)."""
        tasks = self.state.tasks
        out = {}
        for task_id, paused in self.state.paused.items():
            if self._is_preserved(paused):
                blocks = self._full_blocks(context_of(tasks[task_id]))
                if blocks:
                    out[task_id] = blocks
        return out

    def _full_blocks(self, context: int) -> int:
        # A preserved pause keeps its full blocks; the last, partial one is recomputed.
        return max(0, context - 1) // self.state.context.kv_block_size

    def _still_preserved(self, task_id: str) -> bool:
        paused = self.state.paused.get(task_id)
        return paused is not None and self._is_preserved(paused)

    def _is_preserved(self, paused: tuple[str, str]) -> bool:
        """(request id, handling asked for) of a paused generation: its pause is a preserve
        and the engine has not revoked it."""
        return paused[1] == PRESERVE and self.state.engine.paused_handling(paused[0]) == PRESERVE


def next_run_id(task: TaskRecord) -> str:
    """The engine request id of `task`'s next run (`<task>#<n>`: the replica router's
    affinity key is the part before the last `#`)."""
    return f"{task.task_id}#{task.engine_requests}"
