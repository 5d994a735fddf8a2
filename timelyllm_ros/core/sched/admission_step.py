"""The admission half of `SegmentScheduler`: which queued generations start in the engine.

Before each engine step the policy's priorities order the queue; the walk admits generations in
that order while the admission controller allows (a generic `AdmissionController` sees the
running batch's token budgets, a `CandidateAdmission` sees the batch and each candidate and may
name running generations to preempt), behind the policy's gate if it has one. `_start` submits
the engine request: a fresh plan, a discarded generation resubmitted with its token ids (the
prefix cache serves its full blocks), or a paused one resumed in place.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from typing import Collection

import numpy as np

from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.generation import resume_regex
from timelyllm_ros.core.sched.interface import (AdmissionController, AdmissionPass, Candidate,
                                                CandidateAdmission, Gate, GenerationInfo,
                                                RunningGen)
from timelyllm_ros.core.sched.parked import EvictionPlan, ParkedEviction
from timelyllm_ros.core.sched.pass_inputs import PassInputs, next_run_id
from timelyllm_ros.core.sched.preserved_blocks import PreservedBlocks
from timelyllm_ros.core.sched.queue_view import QueueView
from timelyllm_ros.core.sched.sizes import bound_of, context_of, is_complete_program, plan_budget
from timelyllm_ros.core.sched.state import Contention, SchedulerState
from timelyllm_ros.core.sched.task_book import TaskBook, deadline_of
from timelyllm_ros.core.skills.skillset import SkillSet
from timelyllm_ros.core.task import TaskRecord

log = logging.getLogger("timelyllm.scheduler")


class AdmissionStep:
    """Which queued generations start before each engine step (module docstring).

    Built with what it works on: the scheduler's state, the task transitions (`book`), the
    eviction of parked generations (`parked`), the admission controller and the policy's gate
    (None without one)."""

    def __init__(self, state: SchedulerState, book: TaskBook, parked: ParkedEviction,
                 controller: AdmissionController, gate: Gate | None):
        self.state = state
        self.book = book
        self.parked = parked
        self.controller = controller
        self.candidate_aware = isinstance(controller, CandidateAdmission)
        self.gate = gate
        self.inputs = PassInputs(state, book)
        # The running batch as this pass's walk found it (None without a walk): after the walk
        # those of its generations still running are unchanged, so the yield check after the
        # pass builds only the generations the walk admitted.
        self._walk_found: list[RunningGen] | None = None

    def admit(self, now: float) -> None:
        """One admission pass; then, for a work-conserving policy, what the running batch
        should yield at its next segment boundaries (`SchedulerState.contention`)."""
        state = self.state
        state.contention = None
        self._walk_found = None
        self._admit_queued(now)
        if state.running and self.candidate_aware and state.policy.suspend_when == "contended":
            batch = self.inputs.batch_state(now, known=self._walk_found)
            bar = self.controller.yield_below(batch, now, state.rate.rate)
            if bar is not None:
                c = state.contention
                state.contention = Contention(
                    bar if c is None else max(bar, c.best_refused_priority),
                    len(state.running) + (0 if c is None else c.refused))
            named = self.controller.yield_keys(batch, now)
            if named:
                c = state.contention
                state.contention = Contention(
                    -math.inf if c is None else c.best_refused_priority,
                    0 if c is None else c.refused, frozenset(named))

    def _admit_queued(self, now: float) -> None:
        state = self.state
        if not len(state.queue):
            return
        started = time.perf_counter()
        if state.policy.hopeless == "shed":
            self._shed_hopeless(now)
            if not len(state.queue):
                self._record_overhead(started)
                return
        view = state.queue.view()
        priorities = np.asarray(state.policy.priorities(view, now), dtype=float)
        # Highest priority first; equal priorities in submission order. (Queue rows are not in
        # submission order: removal moves the last row into the hole. A plain reversed argsort
        # served ties last-submitted first, so FCFS admitted simultaneous arrivals backwards.)
        # A task is queued once, so submission numbers are unique: any sort of them is the
        # submission order, and a stable sort by priority after it is `np.lexsort((seq,
        # -priorities))` at under half its cost (a pass sorts thousands in overload).
        by_submission = np.argsort(view.task_seq)
        order = by_submission[np.argsort(-priorities[by_submission], kind="stable")]
        eligible_from = None
        if state.config.resume_lead_s is not None:
            eligible_from = view.reference_s - state.config.resume_lead_s
        if eligible_from is None:
            rows = order
        else:
            mask = (view.segment_index[order] == 0) | (eligible_from[order] <= now)
            rows = order[mask]
        if not len(rows):
            self._record_overhead(started)
            if state.hooks.admitted:
                state.policy.on_admitted([], now)
            return
        if self.gate is not None and self.gate.decide(
                view.prefill_tokens[rows], len(state.running)) != "prefill":
            state.stats.gate_holds += 1
            state.contention = Contention(float(priorities[rows[0]]), len(rows))
            self._record_overhead(started)
            if state.hooks.admitted:
                state.policy.on_admitted([], now)
            return
        if self.candidate_aware:
            admitted = self._admit_candidates(view, rows, state.queue.keys_at(rows), now,
                                              started, priorities)
        else:
            self._record_overhead(started)
            admitted = []
            # The running batch's budgets, built once per pass and extended by each admission
            # (rebuilding them for every candidate cost O(batch) per candidate), and not at all
            # for a controller that does not read them. The controller gets a copy: it may keep
            # what it is given.
            reads_running = self.controller.reads_running
            budgets = self.inputs.running_budgets(now) if reads_running else []
            rate = state.rate.rate
            # Keys as of now (admissions reorder the rows), looked up only for the rows the walk
            # reaches: it usually stops after a few of a queue that may hold thousands.
            row_keys = state.queue.keys_column()
            walk = rows.tolist()
            for i, row in enumerate(walk):
                task = state.tasks[row_keys[row]]
                need, free = self.inputs.blocks_needed(task), self.inputs.free_blocks()
                # (Refusal ends this walk, so no parked generation ranks above this one.)
                plan = self._room_for(task, need, (), now)
                if plan is not None:
                    free = max(free, plan.free_after)
                ok, _why = self.controller.may_admit(list(budgets), rate, free, need)
                if ok and plan is not None:
                    self.parked.carry_out(plan, now)
                if not ok:
                    state.contention = Contention(float(priorities[row]), len(walk) - i)
                    break
                self._start(task, now)
                self.controller.note_admission()
                admitted.append(task.submit_index)
                if reads_running and task.engine_request_id is not None:  # (it may be refused)
                    budgets.append(self.inputs.budget_of(task, now))
        if admitted and self.gate is not None:
            self.gate.note_prefill()
        if state.hooks.admitted:
            state.policy.on_admitted(admitted, now)

    def _shed_hopeless(self, now: float) -> None:
        """Refuse every queued first segment whose utility can no longer be positive: whenever it
        is served, its response comes after the TUF's cut-off (arrival + ERT + U0/k). It counts
        as answered now, by the refusal, with the utility its TUF gives now (<= 0)."""
        state = self.state
        view = state.queue.view()
        first = view.segment_index == 0
        if not first.any():
            return
        cutoff = view.arrival_s + view.task_ert_s + view.initial_utility / view.slope
        hopeless = np.flatnonzero(first & (cutoff <= now))
        for key in state.queue.keys_at(hopeless):
            task = state.tasks[key]
            waited = now - task.spec.arrival_s
            task.response_time_s = waited + state.config.network_latency_s
            task.utility = float(task.spec.tuf.utility(task.response_time_s))
            state.stats.shed += 1
            self.book.finish(task, "shed", (
                f"overload: shed after waiting {waited:.2f} s in the queue; its utility can no "
                f"longer be positive (cut-off {task.spec.tuf.cutoff_s:.2f} s after arrival)"), now)

    def _record_overhead(self, started: float) -> None:
        overheads = self.state.stats.fetch_overhead_s
        overheads.append(time.perf_counter() - started)
        history = self.state.config.overhead_history
        if len(overheads) > 2 * history:
            del overheads[:-history]

    def _admit_candidates(self, view: QueueView, rows: np.ndarray, keys: list, now: float,
                          started: float, priorities: np.ndarray) -> list[int]:
        """The admission walk for candidate-aware controllers (MC-SF look-ahead, BROS, ...)."""
        state = self.state
        batch = self.inputs.batch_state(now)
        self._walk_found = batch[:]  # (the walk appends to `batch`)
        free = self.inputs.free_blocks()
        block_size = state.context.kv_block_size
        admission = self.controller
        tasks, shared_of, paused = state.tasks, state.shared_of, state.paused
        replica_for = state.engine.replica_for
        # Read when first asked, and by the walk until it changes the engine (preserved_blocks.py).
        preserved = PreservedBlocks(paused, self.inputs.preserved_blocks_of,
                                    self.inputs.positions_in(view, rows),
                                    self.inputs.preserved_blocks_all)
        rooms = placed = None
        if admission.reads_replicas:
            rooms = state.engine.replica_rooms()
            if rooms is not None:
                placed = self.inputs.placements(keys)
        admission.begin_pass(AdmissionPass(
            now, view, rows, keys, list(batch), free, block_size, state.rate.rate,
            preserved if admission.reads_preserved_blocks else PreservedBlocks.empty(), rooms,
            placed))
        self._record_overhead(started)
        admitted = []
        refused_parked: set[str] = set()
        shortlist = admission.shortlist()
        # The positions the walk below visits: all, or with a shortlist those on it (a refusal
        # without displacement, `CandidateAdmission.shortlist`), or only the leading run of
        # them when a refusal ends the walk. In overload the queue holds thousands and a pass
        # admits a few, so the columns below are read for those positions only.
        if shortlist is None:
            visit = range(len(keys))
        elif admission.skip_refused:
            visit = admission.shortlist_positions()
            if visit is None:
                visit = [j for j, key in enumerate(keys) if key in shortlist]
        else:
            visit = list(itertools.takewhile(lambda j: keys[j] in shortlist, range(len(keys))))
        # The candidates' columns as lists, in the order visited, taken before admissions below
        # reorder the queue's rows. A queued generation's row holds its context and bound
        # (written when it was queued; neither changes while it waits), so the walk reads them
        # here rather than recomputing them per candidate from the task.
        reach = rows[np.asarray(visit, dtype=np.intp)] if shortlist is not None else rows
        context = view.context_tokens[reach]
        bounds = view.bound_tokens[reach]
        needs = (-(-(context + bounds) // block_size)).tolist()  # as _blocks_needed
        deadlines = (view.reference_s[reach] + view.ert_s[reach]).tolist()
        context, bounds = context.tolist(), bounds.tolist()
        prefill = view.prefill_tokens[reach].tolist()
        seg_index = view.segment_index[reach].tolist()
        urgent = view.is_urgent[reach].tolist()
        task_seq = view.task_seq[reach].tolist()
        for i, j in enumerate(visit):
            task_id = keys[j]
            task = tasks[task_id]
            need = needs[i]
            if paused and task_id in paused:
                need -= preserved.current(task_id)
            tuf = task.spec.tuf
            cand = Candidate(task_id, task_seq[i], context[i], bounds[i], prefill[i], need,
                             deadlines[i], urgent[i], seg_index[i], task.spec.skill_set,
                             shared_of.get(task_id, 0), tuf.initial_utility, tuf.slope_per_s,
                             replica_for(next_run_id(task)))
            plan = self._room_for(task, need, refused_parked, now)
            ok, _why = admission.may_admit_candidate(
                batch, cand, free if plan is None else max(free, plan.free_after))
            if ok and plan is not None:
                preserved.seal()
                self.parked.carry_out(plan, now)
                free = self.inputs.free_blocks()
            if not ok:
                victims = admission.displacement_for(batch, cand, free)
                if victims:
                    preserved.seal()
                    for key in victims:
                        self.book.preempt(tasks[key], now)
                    gone = set(victims)
                    batch = [g for g in batch if g.key not in gone]
                    free = self.inputs.free_blocks()
                    ok, _why = admission.may_admit_candidate(batch, cand, free)
            if not ok:
                if state.contention is None:
                    state.contention = Contention(float(priorities[rows[j]]), 0)
                state.contention.refused += 1
                if paused and task_id in paused:  # it ranks above everything after it
                    refused_parked.add(task_id)
                if admission.skip_refused:
                    continue
                break
            preserved.seal()
            self._start(task, now)
            admission.note_admission()
            if task.engine_request_id is not None:
                batch.append(RunningGen(task_id, cand.context_tokens, 0, cand.bound_tokens,
                                        cand.deadline_s, cand.is_urgent, cand.skill_set,
                                        cand.shared_tokens, cand.segment_index,
                                        cand.initial_utility, cand.slope,
                                        replica_for(task.engine_request_id)))
                free -= need
            admitted.append(task.submit_index)
        return admitted

    def _room_for(self, task: TaskRecord, need: int, ranked_above: Collection[str],
                  now: float) -> EvictionPlan | None:
        """Parked generations to evict for this admission (parked.py), None if none is needed
        or none helps. Only an urgent task evicts, so every other candidate of the walk costs
        one test. Reckoned on the blocks really free: `free_blocks` counts pinned blocks as
        free when nothing runs, and the engine's own revocation (oldest first) then chooses."""
        state = self.state
        if not state.paused or not task.spec.is_urgent or not state.config.evict_parked:
            return None
        free = state.engine.kv_usage().free_blocks
        return self.parked.eviction_plan(task.task_id, need - free,
                                         self.parked.parked_hold_slots(), ranked_above, now, free)

    def _start(self, task: TaskRecord, now: float) -> None:
        """Submit `task`'s next run to the engine: a fresh plan, a discarded generation with
        its token ids (the prefix cache serves its full blocks), or a paused one in place."""
        state = self.state
        state.queue.remove(task.queue_slot)
        task.queue_slot = None
        skill_set = self.book.skill_set_of(task.spec)
        # One regex per skill set (the statement limit is enforced here, not in the grammar):
        # vLLM compiles each distinct grammar once, and a compile costs seconds on a small CPU.
        program = skill_set.output_regex()
        generated_ids = task.generated.token_ids
        request_id = next_run_id(task)
        task.engine_requests += 1
        resuming = bool(task.segments) or bool(generated_ids)
        if resuming:
            task.resumes += 1
            task.awaiting_cached_count = True
        scripted = None
        if task.spec.scripted_plan is not None:
            scripted = task.spec.scripted_plan[len(task.generated.text):]
        # A plan suspended at the end of a complete program may stop right there; without this
        # a resumed generation would be forced to add statements until max_statements.
        may_end = resuming and program is not None and is_complete_program(
            skill_set.output_regex(), task.generated.text + task.owed_text)
        request = EngineRequest(
            request_id=request_id,
            prompt_token_ids=task.context_ids(),   # prompt, generated, robot reports
            max_tokens=max(1, plan_budget(task.spec, skill_set) - len(generated_ids)),
            output_regex=resume_regex(task.owed_text, program, may_end=may_end),
            scripted_text=scripted,
            service_class=self._service_class(task, skill_set, now),
        )
        paused = state.paused.get(task.task_id)
        try:
            if paused is not None:
                state.engine.resume_request(paused[0], request)
                del state.paused[task.task_id]
            else:
                state.engine.add_request(request)
        except Exception as err:  # noqa: BLE001 - the engine refused it; the task cannot run
            log.warning("engine refused request %s: %s", request_id, err)
            self.book.finish(task, "fail", f"engine refused the generation: {err}", now)
            return
        task.engine_request_id = request_id
        state.run_bound[request_id] = bound_of(task, skill_set)
        task.tokens_this_run = 0
        task.run_started_s = now
        state.running[request_id] = task
        state.running_context += context_of(task)
        task.lifecycle.admit(now)
        self.book.emit(task)

    def _service_class(self, task: TaskRecord, skill_set: SkillSet, now: float) -> str | None:
        if not self.state.hooks.service_class:
            return None
        return self.state.policy.service_class(GenerationInfo(
            task_id=task.task_id, is_urgent=task.spec.is_urgent,
            deadline_s=deadline_of(task, now), bound_tokens=bound_of(task, skill_set),
            context_tokens=context_of(task), skill_set=skill_set.name), now)
