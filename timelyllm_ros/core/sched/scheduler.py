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

Policies plug in through the typed hooks of `core.sched.interface.Policy` (docs/policies.md; a
policy that overrides none of them runs the original code path): queue columns for their
orderings, their own `AdmissionController` or `CandidateAdmission` (which may name running
generations to preempt), a `Gate` in front of each admission pass, the pause handling of each
suspension (preserve / discard / swap, carried out by engines whose `capabilities()` declare
pause handling; others always discard: abort + resubmit with the token ids), the service class
of each engine request, and notifications (`on_admitted`, `on_step`, `on_task_end`).
Listeners receive frozen records (`SegmentDispatch`, `TaskSnapshot`), never the scheduler's own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from timelyllm_ros.core.engine.base import EngineAdapter, EngineRequest
from timelyllm_ros.core.engine.eviction import EvictionStats
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.lifecycle import TaskLifecycle
from timelyllm_ros.core.sched.admission import (BlocksOnlyAdmission, FixedBatchCap,
                                                LatencyGuidedAdmission, with_batch_cap)
from timelyllm_ros.core.sched.admission_step import AdmissionStep
from timelyllm_ros.core.sched.interface import (AdmissionController, Policy, SchedulerContext,
                                                SchedulerListener, StepInfo, TaskRejected)
from timelyllm_ros.core.sched.outputs import OutputStep
from timelyllm_ros.core.sched.parked import ParkedEviction
from timelyllm_ros.core.sched.queue_view import initial_row
from timelyllm_ros.core.sched.sizes import context_of, first_unreported, plan_budget
from timelyllm_ros.core.sched.state import PolicyHooks, SchedulerState
from timelyllm_ros.core.sched.task_book import TaskBook
from timelyllm_ros.core.sched.task_inputs import TaskInputs
from timelyllm_ros.core.skills.skillset import SkillSet
from timelyllm_ros.core.task import TaskRecord, TaskSnapshot, TaskSpec
from timelyllm_ros.core.tuf import TUF

log = logging.getLogger("timelyllm.scheduler")


@dataclass
class SchedulerConfig:
    # One-way robot<->planner latency added to dispatch times (the paper measured 8 ms on a LAN).
    network_latency_s: float = 0.0
    # A robot that has not reported a segment by
    #   estimated start + longest plausible execution (ExecutionTimeModel.estimate_segment_max)
    #     + network latency + max(report_timeout_factor * estimated execution, report_timeout_min_s)
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
    # Evict parked (preserved) generations to the prefix cache when their KV blocks or slots
    # keep out an urgent generation that can still make its deadline (parked.py).
    evict_parked: bool = True


class SegmentScheduler:
    """The loop (module docstring), composed of parts that each get what they need: the state
    they share (`state`, state.py), the task transitions (`book`, task_book.py), the eviction of
    parked generations (`parked`, parked.py), admission (`admission`, admission_step.py), turning
    outputs into segments (`outputs`, outputs.py), and reports, TUF updates and cancels
    (`inputs`, task_inputs.py). This class builds them and owns the task lifecycle: submission,
    the tick, report deadlines and shutdown."""

    def __init__(self, engine: EngineAdapter, policy: Policy, skill_sets: dict[str, SkillSet],
                 exec_model: ExecutionTimeModel, listener: SchedulerListener,
                 config: SchedulerConfig | None = None):
        config = config or SchedulerConfig()
        context = _context_of(engine, skill_sets)
        only_engine = policy.engine_needs().only_engine
        if only_engine is not None and context.engine_name != only_engine:
            raise ValueError(
                f"policy {policy.name!r} runs only on the {only_engine!r} engine "
                f"(simulation-only baseline; this engine is {context.engine_name!r}); "
                "evaluate it with `timelyllm bench`")
        self.state = SchedulerState(engine=engine, policy=policy, skill_sets=skill_sets,
                                    exec_model=exec_model, listener=listener, config=config,
                                    context=context, hooks=PolicyHooks.of(policy))
        controller = _admission_controller(policy, context, config)
        gate = policy.make_gate(context)
        self.book = TaskBook(self.state)
        self.parked = ParkedEviction(self.state)
        self.admission = AdmissionStep(self.state, self.book, self.parked, controller, gate)
        self.outputs = OutputStep(self.state, self.book, self.parked)
        self.inputs = TaskInputs(self.state, self.book)
        # What callers read (the same objects as the state's; none is ever replaced).
        self.engine, self.policy, self.skill_sets = engine, policy, skill_sets
        self.exec_model, self.listener, self.config = exec_model, listener, config
        self.context = context
        self.tasks = self.state.tasks

    # ------------------------------------------------------------------ counters
    @property
    def steps(self) -> int:
        return self.state.stats.steps

    @property
    def preemptions(self) -> int:
        """Running generations preempted for more urgent work."""
        return self.state.stats.preemptions

    @property
    def gate_holds(self) -> int:
        """Admission passes the policy's gate held back."""
        return self.state.stats.gate_holds

    @property
    def suspensions_avoided(self) -> int:
        """Segment boundaries at which a generation kept going (Policy.suspend_when)."""
        return self.state.stats.suspensions_avoided

    @property
    def shed(self) -> int:
        """Tasks shed because their utility could not be positive any more (Policy.hopeless)."""
        return self.state.stats.shed

    @property
    def pause_counts(self) -> dict[str, int]:
        return self.state.stats.pause_counts

    @property
    def evictions(self) -> EvictionStats:
        """Parked generations this scheduler evicted for an admission (parked.py)."""
        return self.state.stats.evictions

    @property
    def fetch_overhead_s(self) -> list[float]:
        return self.state.stats.fetch_overhead_s

    # ------------------------------------------------------------------ inputs
    def submit(self, spec: TaskSpec) -> TaskRecord:
        """Accept a validated goal, or record it as rejected (TaskRejected is raised too)."""
        state, book, engine = self.state, self.book, self.engine
        now = engine.now()
        if spec.task_id in state.tasks:
            # The existing task is untouched; the duplicate gets a rejection of its own.
            self.listener.on_status(_rejected_snapshot(spec, "task_id: duplicate of a known task"))
            raise TaskRejected("task_id", "duplicate of a known task")
        task = TaskRecord(spec=spec, lifecycle=TaskLifecycle(now, spec.task_id),
                          submit_index=next(state.submissions))
        try:
            skill_set = book.skill_set_of(spec)
            try:
                task.prompt_ids = book.prompt_ids(skill_set, spec.instruction, spec.scene)
            except ValueError as err:
                # An engine that refuses to tokenize (a server's EngineRefused is a ValueError:
                # e.g. every worker behind a router down) rejects this goal, not the planner.
                raise TaskRejected("instruction", f"the engine could not tokenize the prompt: "
                                   f"{err}") from err
            if spec.max_plan_tokens is not None and not (
                    isinstance(spec.max_plan_tokens, int) and spec.max_plan_tokens >= 1):
                raise TaskRejected("max_plan_tokens", f"must be an integer >= 1, got "
                                   f"{spec.max_plan_tokens!r}")
            plan_tokens = plan_budget(spec, skill_set)
            budget = engine.max_model_len() - plan_tokens
            if len(task.prompt_ids) > budget:
                raise TaskRejected(
                    "instruction", f"prompt is {len(task.prompt_ids)} tokens; the model context of "
                    f"{engine.max_model_len()} leaves {budget} after {plan_tokens} "
                    "plan tokens")
            kv = engine.kv_usage()
            need = -(-(len(task.prompt_ids) + plan_tokens) // max(1, kv.block_size))
            if need > kv.total_blocks:
                # It could never be admitted, and would block the head of the queue for good.
                raise TaskRejected(
                    "instruction", f"prompt and plan need {need} KV blocks; the engine has "
                    f"{kv.total_blocks} in all")
        except TaskRejected as err:
            task.lifecycle.reject(now, str(err))
            state.tasks[spec.task_id] = task
            book.forget_old(task)
            book.emit(task)
            raise
        state.tasks[spec.task_id] = task
        state.active[spec.task_id] = task
        task.lifecycle.accept(now)
        task.queued_since_s = now
        shared = state.shared_of[spec.task_id] = book.shared_prefix_len(skill_set, task.prompt_ids)
        task.queue_slot = state.queue.add(
            initial_row(spec.tuf, spec.arrival_s, enqueued_s=now, is_urgent=spec.is_urgent,
                        **book.sizes(task, skill_set, cached=shared)),
            key=spec.task_id)
        book.emit(task)
        return task

    def on_report(self, task_id: str, sequence: int, started_s: float, finished_s: float,
                  success: bool, message: str = "", returned: bool = False,
                  values: Mapping[str, Any] | None = None) -> None:
        """A robot's execution report (TaskInputs.on_report, task_inputs.py)."""
        self.inputs.on_report(task_id, sequence, started_s, finished_s, success, message,
                              returned, values)

    def update_tuf(self, task_id: str, tuf: TUF, urgency: str) -> TaskSpec:
        """Give a live task a new TUF (TaskInputs.update_tuf, task_inputs.py)."""
        return self.inputs.update_tuf(task_id, tuf, urgency)

    def cancel(self, task_id: str, reason: str) -> None:
        self.inputs.cancel(task_id, reason)

    # ------------------------------------------------------------------ the loop
    def has_work(self) -> bool:
        return bool(self.state.running) or len(self.state.queue) > 0

    def active_tasks(self) -> list[TaskRecord]:
        return list(self.state.active.values())

    def next_timer_s(self) -> float | None:
        """Earliest time something happens without new input (report deadline, resume lead)."""
        times = []
        deadline = self.state.deadlines.earliest()
        if deadline is not None:
            times.append(deadline)
        if self.config.resume_lead_s is not None and len(self.state.queue):
            view = self.state.queue.view()
            times.append(float((view.reference_s - self.config.resume_lead_s).min()))
        return min(times) if times else None

    def tick(self) -> bool:
        """One scheduling round and engine step. Returns False when there was nothing to run."""
        state, engine = self.state, self.engine
        now = engine.now()
        self._expire_reports(now)
        self.admission.admit(now)
        running = state.running
        if not running:
            return False
        outputs = engine.step()
        state.stats.steps += 1
        timing = engine.last_step_timing()
        if timing.duration_s > 0 and outputs:
            state.rate.record(timing.duration_s, 1)
        self.admission.controller.note_step(timing.duration_s, timing.batch_size)
        if timing.replica is not None:
            self.admission.controller.note_replica_step(timing.replica, timing.duration_s,
                                                        timing.replica_batch_size)
        gate = self.admission.gate
        if gate is not None and timing.batch_size > 0:
            gate.note_decode_round(timing.batch_size)
        if state.hooks.step:
            self.policy.on_step(StepInfo(
                step=state.stats.steps, duration_s=timing.duration_s,
                batch_size=timing.batch_size, prefill_tokens=timing.prefill_tokens,
                context_tokens=state.running_context, replica=timing.replica,
                replica_batch_size=timing.replica_batch_size))
        now = engine.now()
        consume = self.outputs.consume
        for output in outputs:
            task = running.get(output.request_id)
            if task is not None:
                consume(task, output, now)
        return True

    def warm_prefix_cache(self) -> None:
        """Prefill each skill set's fixed prompt once so the first real task finds it cached."""
        warming = set()
        for name, skill_set in self.skill_sets.items():
            ids = self.book.prompt_ids(skill_set, "")
            request_id = f"__warmup__{name}"
            # Constrained like real plans, so the grammar is compiled now, not on the first task.
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
                task = self.state.running.get(output.request_id)
                if task is not None:
                    self.outputs.consume(task, output, now)

    def shutdown(self, reason: str = "planner shutting down", trigger: str = "cancel") -> None:
        """End every active task: `cancel` when the planner stops, `fail` when its engine
        failed (each task's reason says which)."""
        for task in self.active_tasks():
            self.book.finish(task, trigger, reason, self.engine.now())

    def _expire_reports(self, now: float) -> None:
        # A robot executes its segments in order: only the first unreported one can be overdue.
        # (A later segment's deadline assumes the earlier ones finished as estimated; it is
        # re-estimated when they are reported, see RobotTimelines.reschedule.) The heap finds
        # them without a scan of every active task, in the order such a scan would.
        for task in self.state.deadlines.overdue(now):
            s = first_unreported(task)
            if s is not None and s.report_deadline_s < now:  # (true: nothing moved it since)
                self.book.finish(task, "fail", (
                    f"robot {task.spec.robot_id} did not report segment {s.sequence} within "
                    f"{s.report_deadline_s - s.dispatched_s:.1f} s of dispatch (estimated "
                    f"execution {s.estimated_execution_s:.1f} s)"), now)

    # ------------------------------------------------------------------ introspection
    def queue_length(self) -> int:
        return len(self.state.queue)

    def running_request_ids(self) -> list[str]:
        return list(self.state.running)

    def snapshots(self, task_ids: Iterable[str] | None = None) -> list[TaskSnapshot]:
        ids = self.tasks if task_ids is None else task_ids
        return [TaskSnapshot.of(self.tasks[i]) for i in ids]


def _context_of(engine: EngineAdapter, skill_sets: dict[str, SkillSet]) -> SchedulerContext:
    kv = engine.kv_usage()
    caps = engine.capabilities()
    return SchedulerContext(
        engine_name=engine.name,
        kv_block_size=max(1, int(kv.block_size)), kv_total_blocks=int(kv.total_blocks),
        max_segment_tokens=max((s.max_segment_tokens for s in skill_sets.values()), default=10),
        max_num_seqs=caps.max_num_seqs, profile=caps.profile,
        supports_pause_handling=caps.pause_handling,
        default_pause_handling=caps.default_pause_handling,
        kv_bytes_per_token=float(caps.kv_bytes_per_token),
        host_link_bytes_per_s=float(caps.host_link_bytes_per_s), engine=engine,
        parked_hold_slots=caps.paused_hold_slots,
        max_num_batched_tokens=engine.max_num_batched_tokens())


def _admission_controller(policy: Policy, context: SchedulerContext,
                          config: SchedulerConfig) -> AdmissionController:
    own = policy.make_admission(context)
    if own is not None:
        if config.batch_cap is not None:
            return with_batch_cap(config.batch_cap, own)
        return own
    if config.batch_cap is not None:
        return FixedBatchCap(config.batch_cap)
    if policy.latency_guided_admission:
        return LatencyGuidedAdmission(max_segment_tokens=context.max_segment_tokens)
    return BlocksOnlyAdmission()


def _rejected_snapshot(spec: TaskSpec, reason: str) -> TaskSnapshot:
    nan = float("nan")
    return TaskSnapshot(task_id=spec.task_id, robot_id=spec.robot_id, state="rejected",
                        reason=reason, response_time_s=nan, utility=nan, waiting_time_s=nan,
                        segments_dispatched=0, segments_completed=0, resumes=0,
                        cached_tokens_last_resume=0, cached_tokens_total=0)
