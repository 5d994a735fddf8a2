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

import itertools
import logging
from collections import deque
from dataclasses import dataclass
from typing import Iterable

from timelyllm_ros.core.engine.base import PAUSE_HANDLINGS, EngineAdapter, EngineRequest
from timelyllm_ros.core.engine.eviction import EvictionStats
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.lifecycle import TaskLifecycle
from timelyllm_ros.core.sched.admission import (BlocksOnlyAdmission, FixedBatchCap,
                                                LatencyGuidedAdmission, TokenRateMeter,
                                                with_batch_cap)
from timelyllm_ros.core.sched.admission_step import AdmissionStep
from timelyllm_ros.core.sched.interface import (AdmissionController, CandidateAdmission, Policy,
                                                SchedulerContext, SchedulerListener, StepInfo,
                                                TaskRejected)
from timelyllm_ros.core.sched.outputs import OutputStep
from timelyllm_ros.core.sched.queue_view import QueueArrays, initial_row
from timelyllm_ros.core.sched.report_deadlines import ReportDeadlines
from timelyllm_ros.core.sched.robot_timeline import RobotTimelines
from timelyllm_ros.core.sched.sizes import bound_of, context_of, first_unreported, plan_budget
from timelyllm_ros.core.sched.task_inputs import TaskInputs
from timelyllm_ros.core.skills.skillset import SkillSet
from timelyllm_ros.core.task import TaskRecord, TaskSnapshot, TaskSpec

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


class SegmentScheduler(AdmissionStep, OutputStep, TaskInputs):
    """The loop (module docstring). Admission lives in `AdmissionStep` (admission_step.py),
    turning outputs into segments in `OutputStep` (outputs.py), reports, TUF updates and cancels
    in `TaskInputs` (task_inputs.py); this class owns the state and the task lifecycle:
    submission, the tick, completion and release."""

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
        # Non-terminal tasks, in submission order.
        self._active: dict[str, TaskRecord] = {}
        # Their report deadlines, earliest first (see report_deadlines.py for why not a scan).
        self._deadlines = ReportDeadlines(self._active)
        self._robots = RobotTimelines()
        self._finished_order: deque[str] = deque()
        self._submissions = itertools.count()
        self._queue = QueueArrays()
        self._running: dict[str, TaskRecord] = {}  # engine request id -> task
        self._rate = TokenRateMeter(self.config.rate_window_steps)
        self.context = self._make_context()
        only_engine = policy.engine_needs().only_engine
        if only_engine is not None and self.context.engine_name != only_engine:
            raise ValueError(
                f"policy {policy.name!r} runs only on the {only_engine!r} engine "
                f"(simulation-only baseline; this engine is {self.context.engine_name!r}); "
                "evaluate it with `timelyllm bench`")
        self._admission = self._make_admission()
        self._candidate_aware = isinstance(self._admission, CandidateAdmission)
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
        # Parked generations this scheduler evicted for an admission (parked.py), and those
        # whose resume has not yet measured its recompute.
        self.evictions = EvictionStats()
        self._evicted: dict[str, int] = {}
        self._run_to_segment: dict[str, float] = {}
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
        self.fetch_overhead_s: list[float] = []
        self.steps = 0
        # Work-conserving suspension and the overload rule (Policy.suspend_when / .hopeless):
        # what the last admission pass left waiting, boundaries at which a generation kept
        # going instead of suspending, and tasks shed because their utility could not be
        # positive any more.
        self._contention = None
        self.suspensions_avoided = 0
        self.shed = 0

    def _make_context(self) -> SchedulerContext:
        kv = self.engine.kv_usage()
        caps = self.engine.capabilities()
        return SchedulerContext(
            engine_name=self.engine.name,
            kv_block_size=max(1, int(kv.block_size)), kv_total_blocks=int(kv.total_blocks),
            max_segment_tokens=max((s.max_segment_tokens for s in self.skill_sets.values()),
                                   default=10),
            max_num_seqs=caps.max_num_seqs, profile=caps.profile,
            supports_pause_handling=caps.pause_handling,
            default_pause_handling=caps.default_pause_handling,
            kv_bytes_per_token=float(caps.kv_bytes_per_token),
            host_link_bytes_per_s=float(caps.host_link_bytes_per_s), engine=self.engine,
            parked_hold_slots=caps.paused_hold_slots)

    def _make_admission(self) -> AdmissionController:
        own = self.policy.make_admission(self.context)
        if own is not None:
            if self.config.batch_cap is not None:
                return with_batch_cap(self.config.batch_cap, own)
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
            task.prompt_ids = self._prompt_ids(skill_set, spec.instruction, spec.scene)
            if spec.max_plan_tokens is not None and not (
                    isinstance(spec.max_plan_tokens, int) and spec.max_plan_tokens >= 1):
                raise TaskRejected("max_plan_tokens", f"must be an integer >= 1, got "
                                   f"{spec.max_plan_tokens!r}")
            plan_tokens = plan_budget(spec, skill_set)
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

    # ------------------------------------------------------------------ the loop
    def has_work(self) -> bool:
        return bool(self._running) or len(self._queue) > 0

    def active_tasks(self) -> list[TaskRecord]:
        return list(self._active.values())

    def next_timer_s(self) -> float | None:
        """Earliest time something happens without new input (report deadline, resume lead)."""
        times = []
        deadline = self._deadlines.earliest()
        if deadline is not None:
            times.append(deadline)
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
                context_tokens=sum(context_of(t) for t in self._running.values())))
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

    def shutdown(self, reason: str = "planner shutting down", trigger: str = "cancel") -> None:
        """End every active task: `cancel` when the planner stops, `fail` when its engine
        failed (each task's reason says which)."""
        for task in self.active_tasks():
            self._finish(task, trigger, reason, self.engine.now())

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
        # re-estimated when they are reported, see RobotTimelines.reschedule.) The heap finds
        # them without a scan of every active task, in the order such a scan would.
        for task in self._deadlines.overdue(now):
            s = first_unreported(task)
            if s is not None and s.report_deadline_s < now:  # (true: nothing moved it since)
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
        self._evicted.pop(task.task_id, None)
        if self._hook_task_end:
            self.policy.on_task_end(task.submit_index)
        limit = self.config.max_finished_tasks
        if limit is None:
            return
        # A long-running planner keeps recent finished tasks for status and duplicate-id
        # answers, not their token lists (a drone task's prompt alone is ~430 ids).
        task.prompt_ids = []
        task.generated.token_ids, task.generated.token_ends = [], []
        self._finished_order.append(task.task_id)
        while len(self._finished_order) > limit:
            old = self._finished_order.popleft()
            if old in self.tasks and self.tasks[old].lifecycle.is_terminal:
                del self.tasks[old]

    def _sizes(self, task: TaskRecord, skill_set: SkillSet, cached: int) -> dict:
        context = context_of(task)
        return {
            "task_seq": task.submit_index,
            "context_tokens": context,
            "bound_tokens": bound_of(task, skill_set),
            "prefill_tokens": max(1, context - min(cached, context - 1)),
            "pause_s": self._mean_segment_time(task.spec.skill_set),
        }

    def _shared_prefix_len(self, skill_set: SkillSet, prompt_ids: list[int]) -> int:
        """Full blocks of `prompt_ids` shared with the skill set's fixed prompt (the part the
        prefix cache is expected to serve)."""
        shared = self._shared_prefix.get(skill_set.name)
        if shared is None:
            shared = self._shared_prefix[skill_set.name] = self._prompt_ids(skill_set, "")
        bs = self.context.kv_block_size
        # The most whole blocks that both start with: a binary search over block counts, each
        # probe a list comparison at C speed (prompts run to thousands of tokens, and this runs
        # for every task).
        lo, hi = 0, min(len(shared), len(prompt_ids)) // bs
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if prompt_ids[:mid * bs] == shared[:mid * bs]:
                lo = mid
            else:
                hi = mid - 1
        return lo * bs

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

    def _prompt_ids(self, skill_set: SkillSet, instruction: str, scene: str = "") -> list[int]:
        return self.engine.render_chat(skill_set.render_messages(instruction, scene))

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


def _overrides(policy: Policy, name: str) -> bool:
    return getattr(type(policy), name, None) is not getattr(Policy, name)


def _rejected_snapshot(spec: TaskSpec, reason: str) -> TaskSnapshot:
    nan = float("nan")
    return TaskSnapshot(task_id=spec.task_id, robot_id=spec.robot_id, state="rejected",
                        reason=reason, response_time_s=nan, utility=nan, waiting_time_s=nan,
                        segments_dispatched=0, segments_completed=0, resumes=0,
                        cached_tokens_last_resume=0, cached_tokens_total=0)
