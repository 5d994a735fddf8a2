"""What the scheduler knows about one task: its request, its segments, and its outcome."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from timelyllm_ros.core.generation import GeneratedText
from timelyllm_ros.core.lifecycle import TaskLifecycle
from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.core.tuf import TUF

NAN = float("nan")


@dataclass(frozen=True)
class TaskSpec:
    """A validated task goal, in the scheduler's clock."""

    task_id: str
    robot_id: str
    skill_set: str
    instruction: str
    tuf: TUF
    arrival_s: float
    urgency: str = ""
    # Simulated engine only: the plan text it will "generate" (from an LRTrace trace).
    scripted_plan: str | None = None
    # This task's own output budget (an API client's max_tokens), below the skill set's
    # max_plan_tokens; None = the skill set's. It is also the hard output bound MC-SF plans with.
    max_plan_tokens: int | None = None
    # What the robot sees of its surroundings (TypeFly's scene description), put into the
    # prompt's user message after the skill set's shared system prompt; empty: none.
    scene: str = ""

    @property
    def is_urgent(self) -> bool:
        return self.urgency == "urgent"


# Slots: a robot's report re-estimates every segment queued on it (hundreds in overload,
# core/sched/robot_timeline.py), so these attributes are written more than any other.
@dataclass(slots=True)
class SegmentRecord:
    sequence: int
    text: str
    calls: tuple[SkillCall, ...]
    is_last: bool
    estimated_execution_s: float
    dispatched_s: float
    # Planner-side estimate of when the robot finishes it; replaced by the report.
    estimated_done_s: float
    report_deadline_s: float
    started_s: float | None = None
    finished_s: float | None = None
    success: bool | None = None
    # Variables the segment stores skill results in, and the values the robot reported.
    binds: tuple[str, ...] = ()
    values: dict | None = None

    @property
    def reported(self) -> bool:
        return self.finished_s is not None


@dataclass
class TaskRecord:
    spec: TaskSpec
    lifecycle: TaskLifecycle
    prompt_ids: list[int] = field(default_factory=list)
    generated: GeneratedText = field(default_factory=GeneratedText)
    segments: list[SegmentRecord] = field(default_factory=list)
    # Segments found while dispatch is "whole": sent together when the plan is complete.
    held_segments: list[tuple[str, tuple[SkillCall, ...]]] = field(default_factory=list)
    engine_request_id: str | None = None
    engine_requests: int = 0
    queue_slot: int | None = None
    # Characters a resumed generation must produce first (see GeneratedText.cut_for_resume).
    owed_text: str = ""
    tokens_this_run: int = 0
    # When the current run was admitted; NaN once its first segment has been timed.
    run_started_s: float = NAN
    resumes: int = 0
    cached_tokens_last_resume: int = 0
    cached_tokens_total: int = 0
    # Tokens of the previous context the engine computed again on resumes, from the engine's
    # own accounting where it reports it (EngineOutput.recomputed_tokens), else 0.
    recomputed_tokens_last_resume: int = 0
    recomputed_tokens_total: int = 0
    awaiting_cached_count: bool = False
    generation_finished: bool = False
    response_time_s: float = NAN
    utility: float = NAN
    waiting_time_s: float = NAN
    # Order of submission to the scheduler (ties in priority are served in this order).
    submit_index: int = 0
    # When the generation now queued (or running) was queued: kept when it is preempted, so it
    # does not lose its place among equals.
    queued_since_s: float = NAN
    # Times a running generation was stopped mid-segment for more urgent work (recompute).
    preemptions: int = 0
    # Robot reports appended to the context (skill-set option `observations`): (position in
    # generated.token_ids, the report's tokens), in order; and the segment whose report a
    # suspended generation waits for, out of the queue (None: not waiting).
    observations: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    awaiting_report: int | None = None

    @property
    def observation_tokens(self) -> int:
        if not self.observations:  # (most tasks: the scheduler asks on every step it sizes)
            return 0
        return sum(len(tokens) for _, tokens in self.observations)

    def context_ids(self) -> list[int]:
        """The generation's whole context: the prompt, then the generated tokens with the
        robot reports inserted where they were appended."""
        ids, at = list(self.prompt_ids), 0
        generated = self.generated.token_ids
        for position, tokens in self.observations:
            ids.extend(generated[at:position])
            ids.extend(tokens)
            at = position
        ids.extend(generated[at:])
        return ids

    @property
    def task_id(self) -> str:
        return self.spec.task_id

    @property
    def state(self) -> str:
        return self.lifecycle.state

    @property
    def segments_completed(self) -> int:
        return sum(1 for s in self.segments if s.reported)

    def robot_free_at(self, default: float) -> float:
        """When the robot is expected to have finished every segment dispatched so far."""
        if not self.segments:
            return default
        last = self.segments[-1]
        # `is None`, not `or`: a report that finished at t = 0.0 (virtual clocks start there)
        # is a real time, not a missing one.
        return last.finished_s if last.finished_s is not None else last.estimated_done_s


@dataclass(frozen=True)
class TaskSnapshot:
    """A task's externally visible status (what TaskStatus carries)."""

    task_id: str
    robot_id: str
    state: str
    reason: str
    response_time_s: float
    utility: float
    waiting_time_s: float
    segments_dispatched: int
    segments_completed: int
    resumes: int
    cached_tokens_last_resume: int
    cached_tokens_total: int
    recomputed_tokens_total: int = 0
    observation_tokens_total: int = 0

    @classmethod
    def of(cls, task: TaskRecord) -> "TaskSnapshot":
        return cls(
            task_id=task.task_id, robot_id=task.spec.robot_id, state=task.state,
            reason=task.lifecycle.reason or "", response_time_s=task.response_time_s,
            utility=task.utility, waiting_time_s=task.waiting_time_s,
            segments_dispatched=len(task.segments), segments_completed=task.segments_completed,
            resumes=task.resumes, cached_tokens_last_resume=task.cached_tokens_last_resume,
            cached_tokens_total=task.cached_tokens_total,
            recomputed_tokens_total=task.recomputed_tokens_total,
            observation_tokens_total=task.observation_tokens,
        )

    @property
    def is_terminal(self) -> bool:
        return self.state in ("done", "failed", "rejected", "cancelled")


def is_finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
