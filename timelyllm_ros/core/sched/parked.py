"""Scheduler-side eviction of parked generations, at admission (seed 004's cost model).

A generation suspended with `preserve` (a parked vLLM session, a preserved pause of the simulated
engine) keeps its KV blocks, and on vLLM its slot, while its robot executes. When the admission
walk reaches a generation that those blocks or slots keep out, the scheduler may evict parked
generations to the prefix cache (the engine's `evict_paused`: abort now, resume later through the
prefix cache, the discard path). Only generations the walk ranks below the candidate are
victims: a parked generation the walk has already passed and refused ranks above it, one the
walk has admitted is no longer parked. Among the victims, `core.engine.eviction.eviction_order`
takes first those whose preserve wastes most per block (LAMPS / INFERCEPT: KV held idle for the
rest of the robot's segment against the recompute on resume), with the robot's expected finish
from the execution-time model as the pause's remaining length, which the engine cannot know.

Nothing is evicted unless the victims together make room and the admission controller then
admits the candidate: an eviction that admits nothing would only add a recompute.

Engines keep their own fallback for what the scheduler does not see (vLLM preempting a running
request, a slot short at the engine); both count into `EvictionStats`, the scheduler's as
`scheduler.evictions` and by reason "admission".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Collection

from timelyllm_ros.core.engine.base import PRESERVE
from timelyllm_ros.core.engine.eviction import (ParkedGeneration, eviction_order,
                                                recompute_seconds, waste_evict, waste_keep)
from timelyllm_ros.core.sched.sizes import context_of
from timelyllm_ros.core.sched.state import SchedulerState
from timelyllm_ros.core.sched.task_book import deadline_of
from timelyllm_ros.core.task import TaskRecord

log = logging.getLogger("timelyllm.scheduler")


@dataclass(frozen=True)
class EvictionPlan:
    """Parked generations whose eviction would admit one candidate."""

    task_ids: tuple[str, ...]
    blocks: int          # blocks their evictions free
    free_after: int      # free blocks once they are evicted


class ParkedEviction:
    """Evicts parked generations for an admission (module docstring), over the scheduler's
    state (state.py): its paused, running and evicted generations, the measured time from a
    run's admission to its first segment, and the eviction counters."""

    def __init__(self, state: SchedulerState):
        self.state = state

    def parked_hold_slots(self) -> int:
        """Slots the admission of one more generation lacks while parked sessions hold theirs
        (vLLM counts a parked session against `max_num_seqs`)."""
        state = self.state
        seqs = state.context.max_num_seqs
        if not state.paused or seqs is None or not state.context.parked_hold_slots:
            return 0
        return max(0, len(state.running) + len(state.paused) + 1 - seqs)

    def eviction_plan(self, candidate_id: str, blocks_short: int, slots_short: int,
                      ranked_above: Collection[str], now: float,
                      free: int) -> EvictionPlan | None:
        """The parked generations to evict so that `blocks_short` blocks and `slots_short`
        slots come free for `candidate_id`, cheapest first; None if they cannot make room."""
        state = self.state
        if (blocks_short <= 0 and slots_short <= 0) or not state.paused:
            return None
        candidate = state.tasks[candidate_id]
        if not self.can_still_make_it(candidate, now):
            return None
        task_of = {rid: tid for tid, (rid, handling) in state.paused.items()
                   if handling == PRESERVE and tid != candidate_id and tid not in ranked_above
                   and not state.tasks[tid].spec.is_urgent}
        if not task_of:
            return None
        parked = []
        for p in state.engine.paused_generations():
            task_id = task_of.get(p.key)
            if task_id is None:
                continue
            task = state.tasks[task_id]
            resume_in = max(0.0, task.robot_free_at(now) - now)
            parked.append(ParkedGeneration(p.key, p.context_tokens, p.blocks, resume_in))
        chosen: list[str] = []
        blocks = 0
        for p in eviction_order(parked, self.recompute_s):
            if blocks >= blocks_short and len(chosen) >= slots_short:
                break
            if waste_keep(p) <= waste_evict(p, self.recompute_s, 0):
                break  # keeping it wastes less than its recompute would, and so the rest
            chosen.append(task_of[p.key])
            blocks += p.blocks
        if blocks < blocks_short or len(chosen) < slots_short:
            return None
        return EvictionPlan(tuple(chosen), blocks, free + blocks)

    def can_still_make_it(self, task: TaskRecord, now: float) -> bool:
        """Admitted now, would the candidate's next segment arrive before its deadline? The
        time from admission to a run's first segment is measured per skill set as runs go.
        A task that misses anyway gains nothing from another's eviction."""
        needed = self.state.run_to_segment.get(task.spec.skill_set)
        if needed is None:  # nothing measured yet: its prefill and one decode step
            needed = (self.recompute_s(context_of(task))
                      + self.state.engine.last_step_timing().duration_s)
        return deadline_of(task, now) - now > needed

    def note_run_to_segment(self, skill_set: str, seconds: float) -> None:
        """A run reached its first segment `seconds` after its admission (moving average per
        skill set, so that it follows the load)."""
        run_to_segment = self.state.run_to_segment
        last = run_to_segment.get(skill_set)
        run_to_segment[skill_set] = seconds if last is None else last + 0.2 * (seconds - last)

    def carry_out(self, plan: EvictionPlan, now: float) -> None:
        state = self.state
        for task_id in plan.task_ids:
            request_id, _ = state.paused[task_id]
            held = state.engine.evict_paused(request_id, reason="admission")
            if held <= 0:
                continue
            # The engine now holds it as a discard: its resume goes through the prefix cache.
            state.paused[task_id] = (request_id, state.engine.paused_handling(request_id) or "")
            state.stats.evictions.note(held, "admission")
            state.evicted[task_id] = held
            log.info("evicted parked generation of task %s (%d tokens) for an admission",
                     task_id, held)

    def note_resumed_after_eviction(self, task: TaskRecord, recomputed: int | None,
                                    cached: int | None) -> None:
        """First output of a run that resumed an evicted generation: what it computed again."""
        held = self.state.evicted.pop(task.task_id, None)
        if held is None:
            return
        if recomputed is None:  # an engine without its own accounting: context minus cached
            recomputed = max(0, held - int(cached or 0))
        self.state.stats.evictions.recomputed_tokens += int(recomputed)

    def recompute_s(self, tokens: int) -> float:
        return recompute_seconds(self.state.context.profile, tokens)
