"""The segmented-generation scheduler: one loop that owns an engine and many robots' plans.

Each `tick()`:
  1. fails tasks whose robot missed its report deadline;
  2. recomputes the policy's priority of every queued generation and admits the best ones while
     the admission controller (latency-guided, fixed cap, or KV-only) allows;
  3. runs one engine step;
  4. feeds each output's new text to the task's skill language, and at a segment boundary
     suspends the generation (policy dispatch "segment"), dispatches the segment right away
     ("stream"), or holds it until the plan is complete ("whole").

The scheduler is engine-agnostic (real vLLM or the simulated cost-model engine) and clock-agnostic
(it reads `engine.now()`), so the bench and the ROS planner node run exactly this code. Robots and
transports are outside: segments and status changes go to a `SchedulerListener`, and robot reports
come back through `on_report`.

Extension points for policies from other papers (docs/policies.md; all optional, a policy that
uses none of them runs the original code path):
- queue columns `task_seq`, `context_tokens`, `bound_tokens`, `prefill_tokens`, `pause_s`
  (filled when a generation is queued, see QueueView);
- `Policy.make_admission(ctx)`: the policy's admission controller. A controller with
  `may_admit_candidate(batch, candidate, free_kv_blocks)` gets the running batch as
  `RunningGen`s and each candidate as a `Candidate` (context sizes, bounds, deadlines), and
  `begin_pass(AdmissionPass)` once per pass; `skip_refused` lets the walk go on after a refusal;
- an admission controller with `displacement_for(batch, candidate, free_kv_blocks)` may name
  running generations to preempt when a candidate it wants lacks KV (BROS's "yield blocks from
  best-effort work" from outside the engine): each is aborted and queued again, and continues
  from its token ids, served by the prefix cache (`_preempt`);
- `Policy.make_gate(ctx)`: a gate (`decide(waiting_prefill_tokens, decoding)`, `note_prefill()`,
  `note_decode_round(n)`) that can hold a whole admission pass back;
- `Policy.pause_handling(PauseInfo)`: preserve / discard / swap at each suspension, carried out
  by engines with `suspend_request(id, handling)` / `resume_request(old_id, request)` (the
  simulated engine); other engines always discard (abort + resubmit with the token ids);
- `Policy.on_admitted`, `on_step`, `on_task_end`: notifications for stateful policies.
"""

from __future__ import annotations

import itertools
import logging
import math
import numbers
import re
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

import numpy as np

from timelyllm_ros.core.admission import (BlocksOnlyAdmission, FixedBatchCap, LatencyGuidedAdmission,
                                          TokenRateMeter)
from timelyllm_ros.core.engine.base import EngineAdapter, EngineOutput, EngineRequest
from timelyllm_ros.core.errors import FieldError
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.generation import resume_regex
from timelyllm_ros.core.lifecycle import TaskLifecycle
from timelyllm_ros.core.policies.base import (DISCARD, PAUSE_HANDLINGS, PRESERVE, GenerationInfo,
                                              PauseInfo, Policy, SchedulerContext, StepInfo)
from timelyllm_ros.core.policies.queue_view import (QueueArrays, QueueView, initial_row,
                                                    suspended_row)
from timelyllm_ros.core.robot_timeline import RobotTimelines
from timelyllm_ros.core.skills.base import SkillCall, SkillSyntaxError
from timelyllm_ros.core.skills.skillset import SkillSet
from timelyllm_ros.core.task import SegmentRecord, TaskRecord, TaskSnapshot, TaskSpec

log = logging.getLogger("timelyllm.scheduler")


class SchedulerListener(Protocol):
    def on_segment(self, task: TaskRecord, segment: SegmentRecord) -> None: ...

    def on_status(self, snapshot: TaskSnapshot) -> None: ...


class TaskRejected(FieldError):
    """A goal the scheduler cannot serve; `field` names the offending goal field."""


@dataclass(slots=True)
class RunningGen:
    """A generation in the running batch, as candidate-aware admission controllers see it."""

    key: str
    context_tokens: int    # prompt + everything generated so far (its KV now)
    tokens_this_run: int
    bound_tokens: int      # most tokens this run may generate (the segment bound at admission)
    deadline_s: float      # when its current segment is due (TUF ERT / robot done estimate)
    is_urgent: bool
    # Leading full blocks of its prompt shared with its skill set's fixed prompt (the part the
    # prefix cache stores once for all generations of `skill_set`).
    skill_set: str = ""
    shared_tokens: int = 0

    @property
    def remaining_tokens(self) -> int:
        return max(0, self.bound_tokens - self.tokens_this_run)


@dataclass(slots=True)
class Candidate:
    """A queued generation offered to a candidate-aware admission controller."""

    key: str
    task_seq: int
    context_tokens: int
    bound_tokens: int
    prefill_tokens: int
    blocks_needed: int
    deadline_s: float
    is_urgent: bool
    segment_index: int
    skill_set: str = ""
    shared_tokens: int = 0


@dataclass
class AdmissionPass:
    """One admission pass: the queue in walk order, before anything is admitted."""

    now: float
    view: QueueView
    rows: np.ndarray           # view rows in walk order (eligible ones only)
    keys: list                 # task ids of those rows
    running: list[RunningGen]
    free_kv_blocks: int
    block_size: int
    rate: float | None = None  # measured decode speed of one generation (tokens/s)


class CappedAdmission:
    """A fixed batch cap in front of a policy's own controller (`SchedulerConfig.batch_cap`)."""

    def __init__(self, cap: int, inner):
        self.cap = FixedBatchCap(cap)
        self.inner = inner
        self.skip_refused = getattr(inner, "skip_refused", False)
        if hasattr(inner, "begin_pass"):
            self.begin_pass = inner.begin_pass
        if hasattr(inner, "may_admit_candidate"):
            self.may_admit_candidate = self._candidate
        if hasattr(inner, "displacement_for"):
            self.displacement_for = inner.displacement_for

    def may_admit(self, running, rate, free_kv_blocks, blocks_needed):
        ok, why = self.cap.may_admit(running, rate, free_kv_blocks, blocks_needed)
        if not ok:
            return ok, why
        return self.inner.may_admit(running, rate, free_kv_blocks, blocks_needed)

    def _candidate(self, batch, candidate, free_kv_blocks):
        if len(batch) >= self.cap.cap:
            return False, f"batch cap {self.cap.cap} reached"
        return self.inner.may_admit_candidate(batch, candidate, free_kv_blocks)

    def note_admission(self) -> None:
        self.inner.note_admission()

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None:
        self.inner.note_step(duration_s, batch_size)


@dataclass
class SchedulerConfig:
    # One-way robot<->planner latency added to dispatch times (the paper measured 8 ms on a LAN).
    network_latency_s: float = 0.0
    # A robot that has not reported a segment by
    #   estimated completion + network latency
    #     + max(report_timeout_factor * estimated execution, report_timeout_min_s)
    # is declared dead for that task: the task fails and its engine request and queue entry go.
    # Robots execute in order, so only a task's earliest unreported segment is checked; the
    # estimates (and deadlines) of later ones move when earlier ones are reported.
    report_timeout_factor: float = 3.0
    report_timeout_min_s: float = 5.0
    # Fixed cap on running generations (batch-cap sweep); None = the policy's own admission.
    batch_cap: int | None = None
    # A suspended generation is not resumed earlier than this long before its robot is expected
    # to finish the previous segment; None resumes as soon as admission allows.
    resume_lead_s: float | None = None
    rate_window_steps: int = 8
    # `fetch_overhead_s` keeps at most this many recent fetch times (a planner runs for days).
    overhead_history: int = 100_000
    # Terminal tasks kept in `tasks` (oldest dropped first); None keeps every task, which the
    # bench needs for its results. A long-running planner should set a bound.
    max_finished_tasks: int | None = None


class SegmentScheduler:
    def __init__(self, engine: EngineAdapter, policy: Policy, skill_sets: dict[str, SkillSet],
                 exec_model: ExecutionTimeModel, listener: SchedulerListener,
                 config: SchedulerConfig | None = None):
        self.engine = engine
        self.policy = policy
        self.skill_sets = skill_sets
        self.exec_model = exec_model
        self.listener = listener
        self.config = config or SchedulerConfig()
        self.tasks: dict[str, TaskRecord] = {}
        # Non-terminal tasks, in submission order (every tick looks at them, never at old ones).
        self._active: dict[str, TaskRecord] = {}
        self._robots = RobotTimelines()
        self._finished_order: deque[str] = deque()
        self._submissions = itertools.count()
        self._queue = QueueArrays()
        self._running: dict[str, TaskRecord] = {}  # engine request id -> task
        self._rate = TokenRateMeter(self.config.rate_window_steps)
        self.context = self._make_context()
        if policy.requires_engine is not None and self.context.engine_name != policy.requires_engine:
            raise ValueError(
                f"policy {policy.name!r} runs only on the {policy.requires_engine!r} engine "
                f"(simulation-only baseline; this engine is {self.context.engine_name!r}); "
                "evaluate it with `timelyllm bench`")
        self._admission = self._make_admission()
        self._candidate_aware = hasattr(self._admission, "may_admit_candidate")
        self._skip_refused = bool(getattr(self._admission, "skip_refused", False))
        self._displacer = getattr(self._admission, "displacement_for", None) \
            if self._candidate_aware else None
        self.preemptions = 0  # running generations preempted for more urgent work
        self._gate = policy.make_gate(self.context)
        # Hooks the policy does not override are never called (hot path unchanged).
        self._hook_admitted = _overrides(policy, "on_admitted")
        self._hook_step = _overrides(policy, "on_step")
        self._hook_task_end = _overrides(policy, "on_task_end")
        self._hook_pause = _overrides(policy, "pause_handling")
        self._hook_service_class = _overrides(policy, "service_class")
        self._engine_pauses = self.context.supports_pause_handling
        # Suspended generations whose engine request is paused (preserve/swap): task id ->
        # (engine request id, handling).
        self._paused: dict[str, tuple[str, str]] = {}
        self.pause_counts: dict[str, int] = {h: 0 for h in PAUSE_HANDLINGS}
        # Engine request id -> most tokens that run may generate (RunningGen.bound_tokens).
        self._run_bound: dict[str, int] = {}
        # Skill set -> token ids of its fixed prompt (the prefix the cache shares across tasks),
        # and task id -> tokens of its prompt shared that way (full blocks).
        self._shared_prefix: dict[str, list[int]] = {}
        self._shared_of: dict[str, int] = {}
        # Admission passes the policy's gate held back.
        self.gate_holds = 0
        # Skill set -> [sum, count] of reported segment durations, and of estimates until then.
        self._seg_time: dict[str, list[float]] = {}
        self._prompt_cache: dict[str, list[int]] = {}
        self.fetch_overhead_s: list[float] = []
        self.steps = 0

    def _make_context(self) -> SchedulerContext:
        kv = self.engine.kv_usage()
        engine = self.engine
        pauses = callable(getattr(engine, "suspend_request", None)) and \
            callable(getattr(engine, "resume_request", None))
        return SchedulerContext(
            engine_name=getattr(engine, "name", type(engine).__name__),
            kv_block_size=max(1, int(kv.block_size)), kv_total_blocks=int(kv.total_blocks),
            max_segment_tokens=max((s.max_segment_tokens for s in self.skill_sets.values()),
                                   default=10),
            max_num_seqs=getattr(engine, "max_num_seqs", None),
            profile=getattr(engine, "profile", None), supports_pause_handling=pauses,
            kv_bytes_per_token=float(getattr(engine, "kv_bytes_per_token", 131072.0)),
            host_link_bytes_per_s=float(getattr(engine, "host_link_bytes_per_s", 25e9)))

    def _make_admission(self):
        own = self.policy.make_admission(self.context)
        if own is not None:
            if self.config.batch_cap is not None:
                return CappedAdmission(self.config.batch_cap, own)
            return own
        if self.config.batch_cap is not None:
            return FixedBatchCap(self.config.batch_cap)
        if self.policy.latency_guided_admission:
            return LatencyGuidedAdmission(max_segment_tokens=self.context.max_segment_tokens)
        return BlocksOnlyAdmission()

    # ------------------------------------------------------------------ inputs
    def submit(self, spec: TaskSpec) -> TaskRecord:
        """Accept a validated goal, or record it as rejected (TaskRejected is raised too)."""
        now = self.engine.now()
        if spec.task_id in self.tasks:
            # The existing task is untouched; the duplicate gets a rejection of its own.
            self.listener.on_status(_rejected_snapshot(spec, "task_id: duplicate of a known task"))
            raise TaskRejected("task_id", "duplicate of a known task")
        task = TaskRecord(spec=spec, lifecycle=TaskLifecycle(now, spec.task_id),
                          submit_index=next(self._submissions))
        try:
            skill_set = self._skill_set_of(spec)
            task.prompt_ids = self._prompt_ids(skill_set, spec.instruction)
            if spec.max_plan_tokens is not None and not (
                    isinstance(spec.max_plan_tokens, int) and spec.max_plan_tokens >= 1):
                raise TaskRejected("max_plan_tokens", f"must be an integer >= 1, got "
                                   f"{spec.max_plan_tokens!r}")
            plan_tokens = _plan_budget(spec, skill_set)
            budget = self.engine.max_model_len() - plan_tokens
            if len(task.prompt_ids) > budget:
                raise TaskRejected(
                    "instruction", f"prompt is {len(task.prompt_ids)} tokens; the model context of "
                    f"{self.engine.max_model_len()} leaves {budget} after {plan_tokens} "
                    "plan tokens")
            kv = self.engine.kv_usage()
            need = -(-(len(task.prompt_ids) + plan_tokens) // max(1, kv.block_size))
            if need > kv.total_blocks:
                # It could never be admitted, and would block the head of the queue for good.
                raise TaskRejected(
                    "instruction", f"prompt and plan need {need} KV blocks; the engine has "
                    f"{kv.total_blocks} in all")
        except TaskRejected as err:
            task.lifecycle.reject(now, str(err))
            self.tasks[spec.task_id] = task
            self._forget_old(task)
            self._emit(task)
            raise
        self.tasks[spec.task_id] = task
        self._active[spec.task_id] = task
        task.lifecycle.accept(now)
        task.queued_since_s = now
        shared = self._shared_of[spec.task_id] = self._shared_prefix_len(skill_set,
                                                                          task.prompt_ids)
        task.queue_slot = self._queue.add(
            initial_row(spec.tuf, spec.arrival_s, enqueued_s=now, is_urgent=spec.is_urgent,
                        **self._sizes(task, skill_set, cached=shared)),
            key=spec.task_id)
        self._emit(task)
        return task

    def on_report(self, task_id: str, sequence: int, started_s: float, finished_s: float,
                  success: bool, message: str = "") -> None:
        """A robot's execution report, with times already in the scheduler's clock."""
        task = self.tasks.get(task_id)
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
        self._robots.settled(task.spec.robot_id, [segment])
        if success and segment.calls:
            self.exec_model.observe_segment(segment.calls, finished_s - started_s)
            self._note_segment_time(task.spec.skill_set, finished_s - started_s, observed=True)
        now = self.engine.now()
        if not success:
            self._finish(task, "fail", f"robot {task.spec.robot_id} reported failure of segment "
                                       f"{sequence}: {message or 'no message'}", now)
            return
        # Everything still queued on this robot (any task) now starts from the reported finish.
        self._robots.reschedule(task.spec.robot_id, finished_s, self.config.network_latency_s)
        if task.queue_slot is not None and task.queue_slot in self._queue:
            # The reported finish replaces the estimate as the suspended generation's reference.
            self._queue.update(task.queue_slot, reference_s=task.robot_free_at(now))
        self._maybe_complete(task, now)
        self._emit(task)

    def cancel(self, task_id: str, reason: str) -> None:
        task = self.tasks.get(task_id)
        if task is not None and not task.lifecycle.is_terminal:
            self._finish(task, "cancel", reason, self.engine.now())

    # ------------------------------------------------------------------ the loop
    def has_work(self) -> bool:
        return bool(self._running) or len(self._queue) > 0

    def active_tasks(self) -> list[TaskRecord]:
        return list(self._active.values())

    def next_timer_s(self) -> float | None:
        """Earliest time something happens without new input (report deadline, resume lead)."""
        times = []
        for task in self._active.values():
            segment = _first_unreported(task)
            if segment is not None:
                times.append(segment.report_deadline_s)
        if self.config.resume_lead_s is not None and len(self._queue):
            view = self._queue.view()
            times.append(float((view.reference_s - self.config.resume_lead_s).min()))
        return min(times) if times else None

    def tick(self) -> bool:
        """One scheduling round and engine step. Returns False when there was nothing to run."""
        now = self.engine.now()
        self._expire_reports(now)
        self._admit(now)
        if not self._running:
            return False
        outputs = self.engine.step()
        self.steps += 1
        timing = self.engine.last_step_timing()
        if timing.duration_s > 0 and outputs:
            self._rate.record(timing.duration_s, 1)
        self._admission.note_step(timing.duration_s, timing.batch_size)
        if self._gate is not None and timing.batch_size > 0:
            self._gate.note_decode_round(timing.batch_size)
        if self._hook_step:
            self.policy.on_step(StepInfo(
                step=self.steps, duration_s=timing.duration_s, batch_size=timing.batch_size,
                prefill_tokens=timing.prefill_tokens,
                context_tokens=sum(_context_of(t) for t in self._running.values())))
        now = self.engine.now()
        for output in outputs:
            task = self._running.get(output.request_id)
            if task is not None:
                self._consume(task, output, now)
        return True

    def warm_prefix_cache(self) -> None:
        """Prefill each skill set's fixed prompt once so the first real task finds it cached."""
        warming = set()
        for name, skill_set in self.skill_sets.items():
            ids = self._prompt_ids(skill_set, "")
            request_id = f"__warmup__{name}"
            # Constrained like real plans, so the grammar is compiled now rather than on the first task.
            self.engine.add_request(EngineRequest(request_id, ids, max_tokens=1,
                                                  output_regex=skill_set.output_regex(),
                                                  scripted_text=" "))
            warming.add(request_id)
        while warming and self.engine.has_unfinished_requests():
            outputs = self.engine.step()
            now = self.engine.now()
            for output in outputs:
                if output.request_id in warming:
                    if output.finished:
                        warming.discard(output.request_id)
                    continue
                # Called with plans already running: their tokens must not be lost.
                task = self._running.get(output.request_id)
                if task is not None:
                    self._consume(task, output, now)

    def shutdown(self, reason: str = "planner shutting down") -> None:
        for task in self.active_tasks():
            self._finish(task, "cancel", reason, self.engine.now())

    # ------------------------------------------------------------------ admission
    def _admit(self, now: float) -> None:
        if not len(self._queue):
            return
        started = time.perf_counter()
        view = self._queue.view()
        priorities = np.asarray(self.policy.priorities(view, now), dtype=float)
        row_keys = [self._queue.key_at(i) for i in range(len(view))]
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
        keys = [row_keys[i] for i in rows]
        if not keys:
            self._record_overhead(started)
            if self._hook_admitted:
                self.policy.on_admitted([], now)
            return
        if self._gate is not None and self._gate.decide(
                view.prefill_tokens[rows], len(self._running)) != "prefill":
            self.gate_holds += 1
            self._record_overhead(started)
            if self._hook_admitted:
                self.policy.on_admitted([], now)
            return
        if self._candidate_aware:
            admitted = self._admit_candidates(view, rows, keys, now, started)
        else:
            self._record_overhead(started)
            admitted = []
            for task_id in keys:
                task = self.tasks[task_id]
                ok, _why = self._admission.may_admit(
                    self._running_budgets(now), self._rate.rate, self._free_blocks(),
                    self._blocks_needed(task))
                if not ok:
                    break
                self._start(task, now)
                self._admission.note_admission()
                admitted.append(task.submit_index)
        if admitted and self._gate is not None:
            self._gate.note_prefill()
        if self._hook_admitted:
            self.policy.on_admitted(admitted, now)

    def _record_overhead(self, started: float) -> None:
        self.fetch_overhead_s.append(time.perf_counter() - started)
        if len(self.fetch_overhead_s) > 2 * self.config.overhead_history:
            del self.fetch_overhead_s[:-self.config.overhead_history]

    def _admit_candidates(self, view: QueueView, rows: np.ndarray, keys: list, now: float,
                          started: float) -> list[int]:
        """The admission walk for candidate-aware controllers (MC-SF look-ahead, BROS, ...)."""
        batch = self._batch_state(now)
        free = self._free_blocks()
        block_size = self.context.kv_block_size
        # Copies (fancy indexing): admissions below reorder the queue's rows.
        deadlines = view.reference_s[rows] + view.ert_s[rows]
        bounds = view.bound_tokens[rows]
        prefill = view.prefill_tokens[rows]
        seg_index = view.segment_index[rows]
        urgent = view.is_urgent[rows]
        begin = getattr(self._admission, "begin_pass", None)
        if begin is not None:
            begin(AdmissionPass(now, view, rows, keys, batch, free, block_size, self._rate.rate))
        self._record_overhead(started)
        admitted = []
        for j, task_id in enumerate(keys):
            task = self.tasks[task_id]
            need = self._blocks_needed(task)
            cand = Candidate(task_id, task.submit_index, _context_of(task), int(bounds[j]),
                             int(prefill[j]), need, float(deadlines[j]), bool(urgent[j]),
                             int(seg_index[j]), task.spec.skill_set,
                             self._shared_of.get(task_id, 0))
            ok, _why = self._admission.may_admit_candidate(batch, cand, free)
            if not ok and self._displacer is not None:
                victims = self._displacer(batch, cand, free)
                if victims:
                    for key in victims:
                        self._preempt(self.tasks[key], now)
                    gone = set(victims)
                    batch = [g for g in batch if g.key not in gone]
                    free = self._free_blocks()
                    ok, _why = self._admission.may_admit_candidate(batch, cand, free)
            if not ok:
                if self._skip_refused:
                    continue
                break
            self._start(task, now)
            self._admission.note_admission()
            if task.engine_request_id is not None:
                batch.append(RunningGen(task_id, cand.context_tokens, 0, cand.bound_tokens,
                                        cand.deadline_s, cand.is_urgent, cand.skill_set,
                                        cand.shared_tokens))
                free -= need
            admitted.append(task.submit_index)
        return admitted

    def _batch_state(self, now: float) -> list[RunningGen]:
        out = []
        for rid, task in self._running.items():
            out.append(RunningGen(task.task_id, _context_of(task), task.tokens_this_run,
                                  self._run_bound.get(rid, 0), self._deadline_of(task, now),
                                  task.spec.is_urgent, task.spec.skill_set,
                                  self._shared_of.get(task.task_id, 0)))
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
            pinned = getattr(self.engine, "pinned_blocks", None)
            if pinned is not None:
                free += pinned()
        return free

    def _running_budgets(self, now: float) -> list[tuple[int, float, int]]:
        # (tokens so far, remaining budget, this generation's own segment bound): in a mixed
        # fleet a drone segment is bounded by 10 tokens, a chat one by 60.
        return [(task.tokens_this_run, self._deadline_of(task, now) - now,
                 self._run_bound.get(task.engine_request_id,
                                     self._skill_set_of(task.spec).max_segment_tokens))
                for task in self._running.values()]

    def _blocks_needed(self, task: TaskRecord) -> int:
        bs = self.context.kv_block_size
        context = _context_of(task)
        tokens = context + _bound_of(task, self._skill_set_of(task.spec))
        need = -(-tokens // bs)
        paused = self._paused.get(task.task_id)
        if paused is not None and paused[1] == PRESERVE:
            held = getattr(self.engine, "paused_handling", None)
            if held is not None and held(paused[0]) == PRESERVE:
                need -= max(0, context - 1) // bs  # it still holds its full blocks
        return need

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
        may_end = resuming and program is not None and _is_complete_program(
            skill_set.output_regex(), task.generated.text + task.owed_text)
        request = EngineRequest(
            request_id=request_id,
            prompt_token_ids=[*task.prompt_ids, *generated_ids],
            max_tokens=max(1, _plan_budget(task.spec, skill_set) - len(generated_ids)),
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
        self._run_bound[request_id] = _bound_of(task, skill_set)
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
            deadline_s=self._deadline_of(task, now), bound_tokens=_bound_of(task, skill_set),
            context_tokens=_context_of(task), skill_set=skill_set.name), now)

    # ------------------------------------------------------------------ outputs
    def _consume(self, task: TaskRecord, output: EngineOutput, now: float) -> None:
        if task.awaiting_cached_count and output.num_cached_tokens is not None:
            task.awaiting_cached_count = False
            task.cached_tokens_last_resume = int(output.num_cached_tokens)
            task.cached_tokens_total += int(output.num_cached_tokens)
            log.info("task %s resumed with %d cached prompt tokens of %d", task.task_id,
                     output.num_cached_tokens, len(task.prompt_ids) + len(task.generated.token_ids))
        task.generated.append(output.new_token_ids, output.new_text)
        task.tokens_this_run += len(output.new_token_ids)
        skill_set = self._skill_set_of(task.spec)
        language = skill_set.language
        gen = task.generated

        found = []
        while True:
            end = language.next_boundary(gen.text, gen.consumed)
            if end is None:
                break
            found.append((gen.consumed, end))
            gen.consumed = end
            gen.statements_done += 1
        if output.finished:
            tail_end = language.final_segment_end(gen.text, gen.consumed)
            if tail_end is not None and gen.text[gen.consumed:tail_end].strip():
                found.append((gen.consumed, tail_end))
                gen.consumed = tail_end
                gen.statements_done += 1

        plan_full = (gen.statements_done >= skill_set.max_statements
                     or len(gen.token_ids) >= _plan_budget(task.spec, skill_set))
        plan_done = output.finished or plan_full
        if found:
            text = gen.text[found[0][0]:found[-1][1]]
            try:
                calls = language.parse(text).calls
            except SkillSyntaxError as err:
                self._finish(task, "fail", f"generated text is not executable: {err}", now)
                return
            self._on_segment_text(task, text, calls, plan_done, now)
        if task.lifecycle.is_terminal:
            return
        if plan_done:
            self._end_generation(task, output.finished, now)
        elif found and self.policy.dispatch == "segment":
            self._suspend(task, now)

    def _on_segment_text(self, task: TaskRecord, text: str, calls: tuple[SkillCall, ...],
                         is_last: bool, now: float) -> None:
        if self.policy.dispatch == "whole":
            task.held_segments.append((text, calls))
            if is_last:
                for i, (held_text, held_calls) in enumerate(task.held_segments):
                    self._dispatch(task, held_text, held_calls,
                                   is_last=i == len(task.held_segments) - 1, now=now)
                task.held_segments.clear()
            return
        self._dispatch(task, text, calls, is_last, now)

    def _dispatch(self, task: TaskRecord, text: str, calls: tuple[SkillCall, ...], is_last: bool,
                  now: float) -> None:
        estimate = self.exec_model.estimate_segment_min(calls) if calls else 0.0
        if calls:
            self._note_segment_time(task.spec.skill_set, estimate, observed=False)
        arrive = now + self.config.network_latency_s
        start = max(arrive, task.robot_free_at(arrive),
                    self._robots.free_at(task.spec.robot_id, arrive))
        done = start + estimate
        segment = SegmentRecord(
            sequence=len(task.segments), text=text, calls=calls, is_last=is_last,
            estimated_execution_s=estimate, dispatched_s=now, estimated_done_s=done,
            report_deadline_s=done + self.config.network_latency_s + max(
                self.config.report_timeout_factor * estimate, self.config.report_timeout_min_s))
        task.segments.append(segment)
        self._robots.dispatched(task.spec.robot_id, segment)
        if segment.sequence == 0:
            task.response_time_s = arrive - task.spec.arrival_s
            task.utility = float(task.spec.tuf.utility(task.response_time_s))
        self.listener.on_segment(task, segment)

    def _suspend(self, task: TaskRecord, now: float) -> None:
        context = _context_of(task)
        handling = self._pause_handling(task, context, now)
        rid = task.engine_request_id
        if handling != DISCARD and rid is not None:
            self.engine.suspend_request(rid, handling)
            self._running.pop(rid, None)
            self._run_bound.pop(rid, None)
            task.engine_request_id = None
            self._paused[task.task_id] = (rid, handling)
        else:
            handling = DISCARD
            self._stop_engine_request(task)
        self.pause_counts[handling] += 1
        task.owed_text = task.generated.cut_for_resume()
        task.lifecycle.suspend(now)
        task.queued_since_s = now
        self._requeue(task, now, computed=context)
        self._emit(task)

    def _preempt(self, task: TaskRecord, now: float) -> None:
        """Stop a running generation mid-segment and queue it again (recompute from outside
        the engine): abort, keep its tokens, and resubmit `prompt + generated` when it is
        admitted again, so the prefix cache serves every full block it had computed.

        A skill language with an output grammar restarts the statement in progress: a
        structured-output constraint can only be entered at a statement boundary, so the
        tokens after the last boundary (less than one segment) are generated again. Without a
        grammar (chat, tool calls) every token is kept, as vLLM's own preemption does."""
        skill_set = self._skill_set_of(task.spec)
        self._stop_engine_request(task)
        task.owed_text = task.generated.cut_for_resume(
            keep_pending=skill_set.output_regex() is None)
        task.preemptions += 1
        self.preemptions += 1
        task.lifecycle.preempt(now)
        self._requeue(task, now, computed=_context_of(task))
        self._emit(task)

    def _requeue(self, task: TaskRecord, now: float, computed: int) -> None:
        """Queue the next run of a generation that had `computed` tokens in the engine: its
        full blocks are expected back (prefix cache, pinned or host copy). Its row keeps the
        reference of the segment it generates (arrival for the first, the robot's estimated
        completion of the previous one after that) and `queued_since_s`."""
        bs = self.context.kv_block_size
        cached = (max(0, computed - 1) // bs) * bs
        sizes = self._sizes(task, self._skill_set_of(task.spec), cached=cached)
        spec = task.spec
        if task.segments:
            row = suspended_row(spec.tuf, spec.arrival_s, task.robot_free_at(now),
                                len(task.segments), enqueued_s=task.queued_since_s,
                                is_urgent=spec.is_urgent, **sizes)
        else:
            row = initial_row(spec.tuf, spec.arrival_s, enqueued_s=task.queued_since_s,
                              is_urgent=spec.is_urgent, **sizes)
        task.queue_slot = self._queue.add(row, key=task.task_id)

    def _pause_handling(self, task: TaskRecord, context: int, now: float) -> str:
        if not (self._hook_pause and self._engine_pauses) or task.engine_request_id is None:
            return DISCARD
        rid = task.engine_request_id
        other = sum(_context_of(t) for r, t in self._running.items() if r != rid)
        free_at = task.robot_free_at(now)
        lead = self.config.resume_lead_s
        handling = self.policy.pause_handling(PauseInfo(
            task_id=task.task_id, context_tokens=context, other_tokens=other,
            pause_s=max(0.0, free_at - now),
            eligible_in_s=0.0 if lead is None else max(0.0, free_at - lead - now),
            segment_index=len(task.segments), is_urgent=task.spec.is_urgent,
            context=self.context))
        if handling not in PAUSE_HANDLINGS:
            raise ValueError(f"policy {self.policy.name!r}: pause handling must be one of "
                             f"{PAUSE_HANDLINGS}, got {handling!r}")
        return handling

    def _end_generation(self, task: TaskRecord, engine_finished: bool, now: float) -> None:
        if not engine_finished:
            self._stop_engine_request(task)
        else:
            self._running.pop(task.engine_request_id, None)
            self._run_bound.pop(task.engine_request_id, None)
            task.engine_request_id = None
        if task.held_segments:  # whole-plan dispatch of a plan cut short
            self._on_segment_text(task, *task.held_segments.pop(), is_last=True, now=now)
        if not task.segments:
            self._finish(task, "fail", "the model produced no executable statement", now)
            return
        if not task.segments[-1].is_last:
            # The plan ended right after a segment boundary; tell the robot with an empty closing
            # segment so it knows nothing more is coming (it reports it at once).
            self._dispatch(task, "", (), is_last=True, now=now)
        task.generation_finished = True
        task.lifecycle.finish_generation(now)
        self._maybe_complete(task, now)
        self._emit(task)

    # ------------------------------------------------------------------ completion
    def _maybe_complete(self, task: TaskRecord, now: float) -> None:
        if task.state != "awaiting_robot" or not all(s.reported for s in task.segments):
            return
        finished = max(s.finished_s for s in task.segments)
        executing = sum(s.finished_s - s.started_s for s in task.segments)
        task.waiting_time_s = (finished - task.spec.arrival_s) - executing
        task.lifecycle.complete(now, "all segments executed")
        self._forget_old(task)

    def _expire_reports(self, now: float) -> None:
        # A robot executes its segments in order: only the first unreported one can be overdue.
        # (A later segment's deadline assumes the earlier ones finished as estimated; it is
        # re-estimated when they are reported, see RobotTimelines.reschedule.)
        for task in list(self._active.values()):
            s = _first_unreported(task)
            if s is not None and s.report_deadline_s < now:
                self._finish(task, "fail", (
                    f"robot {task.spec.robot_id} did not report segment {s.sequence} within "
                    f"{s.report_deadline_s - s.dispatched_s:.1f} s of dispatch (estimated execution "
                    f"{s.estimated_execution_s:.1f} s)"), now)

    def _finish(self, task: TaskRecord, trigger: str, reason: str, now: float) -> None:
        """Terminal transition that releases everything the task holds."""
        self._stop_engine_request(task)
        if task.queue_slot is not None:
            self._queue.remove(task.queue_slot)
            task.queue_slot = None
        task.lifecycle.trigger(trigger, now, reason)
        self._robots.settled(task.spec.robot_id, task.segments)
        self._forget_old(task)
        self._emit(task)

    def _stop_engine_request(self, task: TaskRecord) -> None:
        if task.engine_request_id is not None:
            self.engine.abort_request(task.engine_request_id)
            self._running.pop(task.engine_request_id, None)
            self._run_bound.pop(task.engine_request_id, None)
            task.engine_request_id = None
        paused = self._paused.pop(task.task_id, None)
        if paused is not None:
            self.engine.abort_request(paused[0])  # releases pinned blocks / the host copy

    # ------------------------------------------------------------------ helpers
    def _forget_old(self, task: TaskRecord) -> None:
        """Book-keeping once `task` is terminal."""
        self._active.pop(task.task_id, None)
        self._shared_of.pop(task.task_id, None)
        if self._hook_task_end:
            self.policy.on_task_end(task.submit_index)
        limit = self.config.max_finished_tasks
        if limit is None:
            return
        self._finished_order.append(task.task_id)
        while len(self._finished_order) > limit:
            old = self._finished_order.popleft()
            if old in self.tasks and self.tasks[old].lifecycle.is_terminal:
                del self.tasks[old]

    def _sizes(self, task: TaskRecord, skill_set: SkillSet, cached: int) -> dict:
        context = _context_of(task)
        return {
            "task_seq": task.submit_index,
            "context_tokens": context,
            "bound_tokens": _bound_of(task, skill_set),
            "prefill_tokens": max(1, context - min(cached, context - 1)),
            "pause_s": self._mean_segment_time(task.spec.skill_set),
        }

    def _shared_prefix_len(self, skill_set: SkillSet, prompt_ids: list[int]) -> int:
        """Full blocks of `prompt_ids` shared with the skill set's fixed prompt (the part the
        prefix cache is expected to serve)."""
        shared = self._shared_prefix.get(skill_set.name)
        if shared is None:
            shared = self._shared_prefix[skill_set.name] = self._prompt_ids(skill_set, "")
        n = min(len(shared), len(prompt_ids))
        a = np.asarray(shared[:n])
        b = np.asarray(prompt_ids[:n])
        diff = np.flatnonzero(a != b)
        common = int(diff[0]) if diff.size else n
        return common // self.context.kv_block_size * self.context.kv_block_size

    def _note_segment_time(self, skill_set: str, seconds: float, observed: bool) -> None:
        # [sum, count, observed?]: estimates only until the first report of the skill set.
        entry = self._seg_time.get(skill_set)
        if entry is None or (observed and not entry[2]):
            self._seg_time[skill_set] = [float(seconds), 1.0, observed]
        elif observed == entry[2]:
            entry[0] += float(seconds)
            entry[1] += 1.0

    def _mean_segment_time(self, skill_set: str) -> float:
        entry = self._seg_time.get(skill_set)
        return entry[0] / entry[1] if entry else 0.0

    def _skill_set_of(self, spec: TaskSpec) -> SkillSet:
        skill_set = self.skill_sets.get(spec.skill_set)
        if skill_set is None:
            raise TaskRejected("skill_set", f"unknown robot kind {spec.skill_set!r}; known: "
                                            f"{', '.join(sorted(self.skill_sets))}")
        return skill_set

    def _prompt_ids(self, skill_set: SkillSet, instruction: str) -> list[int]:
        messages = skill_set.render_messages(instruction)
        render = getattr(self.engine, "render_chat", None)
        if render is not None:
            return render(messages)
        return self.engine.tokenize("\n".join(m["content"] for m in messages) + "\n")

    def _emit(self, task: TaskRecord) -> None:
        self.listener.on_status(TaskSnapshot.of(task))

    # ------------------------------------------------------------------ introspection
    def queue_length(self) -> int:
        return len(self._queue)

    def running_request_ids(self) -> list[str]:
        return list(self._running)

    def snapshots(self, task_ids: Iterable[str] | None = None) -> list[TaskSnapshot]:
        ids = self.tasks if task_ids is None else task_ids
        return [TaskSnapshot.of(self.tasks[i]) for i in ids]


def _context_of(task: TaskRecord) -> int:
    return len(task.prompt_ids) + len(task.generated.token_ids)


def _plan_budget(spec: TaskSpec, skill_set: SkillSet) -> int:
    if spec.max_plan_tokens is None:
        return skill_set.max_plan_tokens
    return min(skill_set.max_plan_tokens, spec.max_plan_tokens)


def _bound_of(task: TaskRecord, skill_set: SkillSet) -> int:
    left = _plan_budget(task.spec, skill_set) - len(task.generated.token_ids)
    return max(1, min(skill_set.max_segment_tokens, left))


def _overrides(policy: Policy, name: str) -> bool:
    return getattr(type(policy), name, None) is not getattr(Policy, name)


def _rejected_snapshot(spec: TaskSpec, reason: str) -> TaskSnapshot:
    nan = float("nan")
    return TaskSnapshot(task_id=spec.task_id, robot_id=spec.robot_id, state="rejected",
                        reason=reason, response_time_s=nan, utility=nan, waiting_time_s=nan,
                        segments_dispatched=0, segments_completed=0, resumes=0,
                        cached_tokens_last_resume=0, cached_tokens_total=0)


def _is_time(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _first_unreported(task: TaskRecord) -> SegmentRecord | None:
    for segment in task.segments:
        if not segment.reported:
            return segment
    return None


def _is_complete_program(regex: str | None, text: str) -> bool:
    if regex is None or not text:
        return False
    try:
        return re.fullmatch(regex, text) is not None
    except re.error:
        return False


ListenerFn = Callable[[TaskSnapshot], None]
