"""The admission half of `SegmentScheduler`: which queued generations start in the engine.

Before each engine step the policy's priorities order the queue; the walk admits generations in
that order while the admission controller allows (a generic `AdmissionController` sees the
running batch's token budgets, a `CandidateAdmission` sees the batch and each candidate and may
name running generations to preempt), behind the policy's gate if it has one. `_start` submits
the engine request: a fresh plan, a discarded generation resubmitted with its token ids (the
prefix cache serves its full blocks), or a paused one resumed in place.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Collection

import numpy as np

from timelyllm_ros.core.engine.base import PRESERVE, EngineAdapter, EngineRequest
from timelyllm_ros.core.generation import resume_regex
from timelyllm_ros.core.sched.admission import TokenRateMeter
from timelyllm_ros.core.sched.interface import (AdmissionController, AdmissionPass, Candidate,
                                                GenerationInfo, Gate, Policy, RunningGen,
                                                SchedulerContext)
from timelyllm_ros.core.sched.parked import EvictionPlan, ParkedEviction
from timelyllm_ros.core.sched.queue_view import QueueArrays, QueueView
from timelyllm_ros.core.sched.sizes import bound_of, context_of, is_complete_program, plan_budget
from timelyllm_ros.core.skills.skillset import SkillSet
from timelyllm_ros.core.task import TaskRecord

log = logging.getLogger("timelyllm.scheduler")


@dataclass
class Contention:
    """The last admission pass left eligible generations waiting: the best refused one's
    priority, and how many were refused. A running generation of lower priority is worth
    suspending at its next segment boundary (`Policy.suspend_when == "contended"`)."""

    best_refused_priority: float
    refused: int
    # Running generations the admission controller asked to suspend at their next boundary,
    # by key (`CandidateAdmission.yield_keys`), whatever their priority.
    yield_keys: frozenset = frozenset()


class AdmissionStep(ParkedEviction):
    """Mixin of `SegmentScheduler` (core.sched.scheduler), which owns the state declared here."""

    engine: EngineAdapter
    policy: Policy
    context: SchedulerContext
    tasks: dict[str, TaskRecord]
    fetch_overhead_s: list[float]
    gate_holds: int
    _queue: QueueArrays
    _admission: AdmissionController
    _candidate_aware: bool
    _gate: Gate | None
    _rate: TokenRateMeter
    _running: dict[str, TaskRecord]
    _run_bound: dict[str, int]
    _paused: dict[str, tuple[str, str]]
    _shared_of: dict[str, int]
    _hook_admitted: bool
    _hook_service_class: bool
    _contention: "Contention | None"

    def _admit(self, now: float) -> None:
        self._contention = None
        self._admit_queued(now)
        if self._running and self._candidate_aware and self.policy.suspend_when == "contended":
            batch = self._batch_state(now)
            bar = self._admission.yield_below(batch, now, self._rate.rate)
            if bar is not None:
                c = self._contention
                self._contention = Contention(
                    bar if c is None else max(bar, c.best_refused_priority),
                    len(self._running) + (0 if c is None else c.refused))
            named = self._admission.yield_keys(batch, now)
            if named:
                c = self._contention
                self._contention = Contention(
                    -math.inf if c is None else c.best_refused_priority,
                    0 if c is None else c.refused, frozenset(named))

    def _admit_queued(self, now: float) -> None:
        if not len(self._queue):
            return
        started = time.perf_counter()
        if self.policy.hopeless == "shed":
            self._shed_hopeless(now)
            if not len(self._queue):
                self._record_overhead(started)
                return
        view = self._queue.view()
        priorities = np.asarray(self.policy.priorities(view, now), dtype=float)
        # Highest priority first; equal priorities in submission order. (Queue rows are not in
        # submission order: removal moves the last row into the hole. A plain reversed argsort
        # served ties last-submitted first, so FCFS admitted simultaneous arrivals backwards.)
        submitted = view.task_seq
        order = np.lexsort((submitted, -priorities))
        eligible_from = None
        if self.config.resume_lead_s is not None:
            eligible_from = view.reference_s - self.config.resume_lead_s
        if eligible_from is None:
            rows = order
        else:
            mask = (view.segment_index[order] == 0) | (eligible_from[order] <= now)
            rows = order[mask]
        if not len(rows):
            self._record_overhead(started)
            if self._hook_admitted:
                self.policy.on_admitted([], now)
            return
        if self._gate is not None and self._gate.decide(
                view.prefill_tokens[rows], len(self._running)) != "prefill":
            self.gate_holds += 1
            self._contention = Contention(float(priorities[rows[0]]), len(rows))
            self._record_overhead(started)
            if self._hook_admitted:
                self.policy.on_admitted([], now)
            return
        if self._candidate_aware:
            admitted = self._admit_candidates(view, rows, self._queue.keys_at(rows), now,
                                              started, priorities)
        else:
            self._record_overhead(started)
            admitted = []
            # The running batch's budgets, built once per pass and extended by each admission
            # (rebuilding them for every candidate cost O(batch) per candidate), and not at all
            # for a controller that does not read them. The controller gets a copy: it may keep
            # what it is given.
            reads_running = self._admission.reads_running
            budgets = self._running_budgets(now) if reads_running else []
            rate = self._rate.rate
            # Keys as of now (admissions reorder the rows), looked up only for the rows the walk
            # reaches: it usually stops after a few of a queue that may hold thousands.
            row_keys = self._queue.keys_column()
            walk = rows.tolist()
            for i, row in enumerate(walk):
                task = self.tasks[row_keys[row]]
                need, free = self._blocks_needed(task), self._free_blocks()
                # (Refusal ends this walk, so no parked generation ranks above this one.)
                plan = self._room_for(task, need, (), now)
                if plan is not None:
                    free = max(free, plan.free_after)
                ok, _why = self._admission.may_admit(list(budgets), rate, free, need)
                if ok and plan is not None:
                    self._carry_out(plan, now)
                if not ok:
                    self._contention = Contention(float(priorities[row]), len(walk) - i)
                    break
                self._start(task, now)
                self._admission.note_admission()
                admitted.append(task.submit_index)
                if reads_running and task.engine_request_id is not None:  # (it may be refused)
                    budgets.append(self._budget_of(task, now))
        if admitted and self._gate is not None:
            self._gate.note_prefill()
        if self._hook_admitted:
            self.policy.on_admitted(admitted, now)

    def _shed_hopeless(self, now: float) -> None:
        """Refuse every queued first segment whose utility can no longer be positive: whenever it
        is served, its response comes after the TUF's cut-off (arrival + ERT + U0/k). It counts
        as answered now, by the refusal, with the utility its TUF gives now (<= 0)."""
        view = self._queue.view()
        first = view.segment_index == 0
        if not first.any():
            return
        cutoff = view.arrival_s + view.task_ert_s + view.initial_utility / view.slope
        hopeless = np.flatnonzero(first & (cutoff <= now))
        for key in self._queue.keys_at(hopeless):
            task = self.tasks[key]
            waited = now - task.spec.arrival_s
            task.response_time_s = waited + self.config.network_latency_s
            task.utility = float(task.spec.tuf.utility(task.response_time_s))
            self.shed += 1
            self._finish(task, "shed", (
                f"overload: shed after waiting {waited:.2f} s in the queue; its utility can no "
                f"longer be positive (cut-off {task.spec.tuf.cutoff_s:.2f} s after arrival)"), now)

    def _record_overhead(self, started: float) -> None:
        self.fetch_overhead_s.append(time.perf_counter() - started)
        if len(self.fetch_overhead_s) > 2 * self.config.overhead_history:
            del self.fetch_overhead_s[:-self.config.overhead_history]

    def _admit_candidates(self, view: QueueView, rows: np.ndarray, keys: list, now: float,
                          started: float, priorities: np.ndarray) -> list[int]:
        """The admission walk for candidate-aware controllers (MC-SF look-ahead, BROS, ...)."""
        batch = self._batch_state(now)
        free = self._free_blocks()
        block_size = self.context.kv_block_size
        # The candidates' columns as lists, in walk order, taken before admissions below
        # reorder the queue's rows. A queued generation's row holds its context and bound
        # (written when it was queued; neither changes while it waits), so the walk reads them
        # here rather than recomputing them per candidate from the task (O(queue) per pass).
        context = view.context_tokens[rows]
        bounds = view.bound_tokens[rows]
        needs = (-(-(context + bounds) // block_size)).tolist()  # as _blocks_needed
        deadlines = (view.reference_s[rows] + view.ert_s[rows]).tolist()
        context, bounds = context.tolist(), bounds.tolist()
        prefill = view.prefill_tokens[rows].tolist()
        seg_index = view.segment_index[rows].tolist()
        urgent = view.is_urgent[rows].tolist()
        task_seq = view.task_seq[rows].tolist()
        admission = self._admission
        preserved = {}
        if admission.reads_preserved_blocks and self._paused:
            for key in self._paused:
                task = self.tasks[key]
                held = self._preserved_blocks(task, context_of(task))
                if held:
                    preserved[key] = held
        admission.begin_pass(AdmissionPass(now, view, rows, keys, list(batch), free, block_size,
                                           self._rate.rate, preserved))
        self._record_overhead(started)
        admitted = []
        tasks, shared_of, paused = self.tasks, self._shared_of, self._paused
        refused_parked: set[str] = set()
        shortlist = admission.shortlist()
        for j, task_id in enumerate(keys):
            if shortlist is not None and task_id not in shortlist:
                if admission.skip_refused:  # refused, nothing to displace for it
                    continue
                break
            task = tasks[task_id]
            need = needs[j]
            if paused and task_id in paused:
                need -= self._preserved_blocks(task, context[j])
            tuf = task.spec.tuf
            cand = Candidate(task_id, task_seq[j], context[j], bounds[j], prefill[j], need,
                             deadlines[j], urgent[j], seg_index[j], task.spec.skill_set,
                             shared_of.get(task_id, 0), tuf.initial_utility, tuf.slope_per_s)
            plan = self._room_for(task, need, refused_parked, now)
            ok, _why = admission.may_admit_candidate(
                batch, cand, free if plan is None else max(free, plan.free_after))
            if ok and plan is not None:
                self._carry_out(plan, now)
                free = self._free_blocks()
            if not ok:
                victims = admission.displacement_for(batch, cand, free)
                if victims:
                    for key in victims:
                        self._preempt(self.tasks[key], now)
                    gone = set(victims)
                    batch = [g for g in batch if g.key not in gone]
                    free = self._free_blocks()
                    ok, _why = admission.may_admit_candidate(batch, cand, free)
            if not ok:
                if self._contention is None:
                    self._contention = Contention(float(priorities[rows[j]]), 0)
                self._contention.refused += 1
                if paused and task_id in paused:  # it ranks above everything after it
                    refused_parked.add(task_id)
                if admission.skip_refused:
                    continue
                break
            self._start(task, now)
            admission.note_admission()
            if task.engine_request_id is not None:
                batch.append(RunningGen(task_id, cand.context_tokens, 0, cand.bound_tokens,
                                        cand.deadline_s, cand.is_urgent, cand.skill_set,
                                        cand.shared_tokens, cand.segment_index,
                                        cand.initial_utility, cand.slope))
                free -= need
            admitted.append(task.submit_index)
        return admitted

    def _room_for(self, task: TaskRecord, need: int, ranked_above: Collection[str],
                  now: float) -> EvictionPlan | None:
        """Parked generations to evict for this admission (parked.py), None if none is needed
        or none helps. Only an urgent task evicts, so every other candidate of the walk costs
        one test. Reckoned on the blocks really free: `_free_blocks` counts pinned blocks as
        free when nothing runs, and the engine's own revocation (oldest first) then chooses."""
        if not self._paused or not task.spec.is_urgent or not self.config.evict_parked:
            return None
        free = self.engine.kv_usage().free_blocks
        return self._eviction_plan(task.task_id, need - free, self._parked_hold_slots(),
                                   ranked_above, now, free)

    def _batch_state(self, now: float) -> list[RunningGen]:
        out = []
        for rid, task in self._running.items():
            tuf = task.spec.tuf
            out.append(RunningGen(task.task_id, context_of(task), task.tokens_this_run,
                                  self._run_bound.get(rid, 0), self._deadline_of(task, now),
                                  task.spec.is_urgent, task.spec.skill_set,
                                  self._shared_of.get(task.task_id, 0), len(task.segments),
                                  tuf.initial_utility, tuf.slope_per_s))
        return out

    def _deadline_of(self, task: TaskRecord, now: float) -> float:
        if not task.segments:
            return task.spec.arrival_s + task.spec.tuf.ert_s
        return task.robot_free_at(now)

    def _free_blocks(self) -> int:
        free = self.engine.kv_usage().free_blocks
        if not self._running and self._paused:
            # With nothing running the engine revokes preserved pauses for a waiting request
            # (else it could wait for ever on blocks that only a queued generation would free).
            free += self.engine.pinned_blocks()
        return free

    def _running_budgets(self, now: float) -> list[tuple[int, float, int]]:
        return [self._budget_of(task, now) for task in self._running.values()]

    def _budget_of(self, task: TaskRecord, now: float) -> tuple[int, float, int]:
        # (tokens so far, remaining budget, this generation's own segment bound): in a mixed
        # fleet a drone segment is bounded by 10 tokens, a chat one by 60.
        bound = self._run_bound.get(task.engine_request_id)
        if bound is None:
            bound = self._skill_set_of(task.spec).max_segment_tokens
        return task.tokens_this_run, self._deadline_of(task, now) - now, bound

    def _blocks_needed(self, task: TaskRecord) -> int:
        bs = self.context.kv_block_size
        context = context_of(task)
        tokens = context + bound_of(task, self._skill_set_of(task.spec))
        return -(-tokens // bs) - self._preserved_blocks(task, context)

    def _preserved_blocks(self, task: TaskRecord, context: int) -> int:
        """Blocks a preserved pause of `task` still holds in the engine (its full blocks)."""
        paused = self._paused.get(task.task_id)
        if paused is not None and paused[1] == PRESERVE:
            if self.engine.paused_handling(paused[0]) == PRESERVE:
                return max(0, context - 1) // self.context.kv_block_size
        return 0

    def _start(self, task: TaskRecord, now: float) -> None:
        self._queue.remove(task.queue_slot)
        task.queue_slot = None
        skill_set = self._skill_set_of(task.spec)
        # One regex per skill set (the statement limit is enforced here, not in the grammar):
        # vLLM compiles each distinct grammar once, and a compile costs seconds on a small CPU.
        program = skill_set.output_regex()
        generated_ids = task.generated.token_ids
        request_id = f"{task.task_id}#{task.engine_requests}"
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
        paused = self._paused.get(task.task_id)
        try:
            if paused is not None:
                self.engine.resume_request(paused[0], request)
                del self._paused[task.task_id]
            else:
                self.engine.add_request(request)
        except Exception as err:  # noqa: BLE001 - the engine refused it; the task cannot run
            log.warning("engine refused request %s: %s", request_id, err)
            self._finish(task, "fail", f"engine refused the generation: {err}", now)
            return
        task.engine_request_id = request_id
        self._run_bound[request_id] = bound_of(task, skill_set)
        task.tokens_this_run = 0
        task.run_started_s = now
        self._running[request_id] = task
        task.lifecycle.admit(now)
        self._emit(task)

    def _service_class(self, task: TaskRecord, skill_set: SkillSet, now: float) -> str | None:
        if not self._hook_service_class:
            return None
        return self.policy.service_class(GenerationInfo(
            task_id=task.task_id, is_urgent=task.spec.is_urgent,
            deadline_s=self._deadline_of(task, now), bound_tokens=bound_of(task, skill_set),
            context_tokens=context_of(task), skill_set=skill_set.name), now)
