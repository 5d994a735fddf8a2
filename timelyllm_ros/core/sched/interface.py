"""The scheduler's contract with policies, admission controllers and listeners.

Everything that crosses the boundary of `SegmentScheduler` is typed here, the way vLLM keeps
`SchedulerInterface` and `SchedulerOutput` apart from its scheduler:

- records the scheduler hands out (frozen: a policy or listener cannot change the scheduler's
  state through them): `SchedulerContext`, `PauseInfo`, `GenerationInfo`, `StepInfo`,
  `RunningGen`, `Candidate`, `AdmissionPass`, `SegmentDispatch`;
- what it calls: `Policy` (base class with every hook and its default), `AdmissionController`
  and `CandidateAdmission` (abstract base classes), `Gate`, `SchedulerListener`.

The admission controllers' part (`RunningGen`, `Candidate`, `AdmissionPass`,
`AdmissionController`, `CandidateAdmission`, `Gate`) lives in core/sched/admission_interface.py
and is re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol, Sequence, TYPE_CHECKING

import numpy as np

from timelyllm_ros.core.engine.base import (DISCARD, ENGINE_SCHEDULING, EngineAdapter,
                                            EngineNeeds)
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.errors import FieldError
from timelyllm_ros.core.sched.admission_interface import (AdmissionController, AdmissionPass,
                                                          Candidate, CandidateAdmission, Gate,
                                                          RunningGen)

__all__ = ["AdmissionController", "AdmissionPass", "Candidate", "CandidateAdmission",
           "DISPATCH_MODES", "Gate", "GenerationInfo", "HOPELESS_RULES", "PauseInfo", "Policy",
           "RunningGen", "SUSPEND_RULES", "SchedulerContext", "SchedulerListener",
           "SegmentDispatch", "StepInfo", "TaskRejected"]
from timelyllm_ros.core.sched.queue_view import QueueView
from timelyllm_ros.core.skills.base import SkillCall

if TYPE_CHECKING:
    from timelyllm_ros.core.task import TaskSnapshot

# whole:   generate the whole plan, then dispatch it (plain vLLM).
# stream:  dispatch each statement as soon as it is complete, but never pause the generation.
# segment: suspend the generation at each segment boundary until the scheduler resumes it.
DISPATCH_MODES = ("whole", "stream", "segment")
# When a "segment" policy suspends a generation at a segment boundary:
# always:    at every boundary (the paper's TimelyLLM);
# contended: only when the last admission pass refused a queued generation that ranks above it
#            (work-conserving: otherwise it keeps generating and dispatches like streaming).
SUSPEND_RULES = ("always", "contended")
# What the scheduler does with a queued first segment whose utility can no longer be positive
# (now >= arrival + ERT + U0/k: whenever it is served, U <= 0):
# serve: nothing special (the policy's order decides; PUD policies rank it last);
# shed:  reject it at once with a reason; it counts as a response at that moment (U <= 0, a miss).
HOPELESS_RULES = ("serve", "shed")


class TaskRejected(FieldError):
    """A goal the scheduler cannot serve; `field` names the offending goal field."""


# ---------------------------------------------------------------------------- records
@dataclass(frozen=True)
class SchedulerContext:
    """What a policy may know about the engine when the scheduler builds its controllers.

    engine: the engine the scheduler drives (policies that model one engine variant, such as
        BROS's bidirectional KV blocks, check its type).
    profile: the engine's cost model when it has one (simulated engine), else None (real engine:
        policies fall back to the default profile or a `profile` parameter).
    supports_pause_handling: the engine can keep a suspended generation's KV (preserve, swap);
        without it every suspension is a discard (abort + resubmit).
    kv_bytes_per_token, host_link_bytes_per_s: KV size and host-link bandwidth used to price a
        swap (the simulated engine's own values when it has them).
    parked_hold_slots: a preserved pause counts against `max_num_seqs` (a parked vLLM session).
    max_num_batched_tokens: tokens one engine step may process (vLLM V1's token budget), None
        where the engine does not say.
    """

    engine_name: str
    kv_block_size: int
    kv_total_blocks: int
    max_segment_tokens: int
    max_num_seqs: int | None = None
    profile: EngineProfile | None = None
    supports_pause_handling: bool = False
    default_pause_handling: str = DISCARD
    kv_bytes_per_token: float = 131072.0
    host_link_bytes_per_s: float = 25e9
    engine: EngineAdapter | None = None
    parked_hold_slots: bool = False
    max_num_batched_tokens: int | None = None

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_block_size * self.kv_total_blocks

    def t_swap(self, tokens: float) -> float:
        """Seconds to copy `tokens` tokens of KV one way over the host link."""
        return float(tokens) * self.kv_bytes_per_token / self.host_link_bytes_per_s


@dataclass(frozen=True)
class PauseInfo:
    """One suspension, as `Policy.pause_handling` sees it (token counts are KV tokens).

    context_tokens: C_i, the generation's prompt + everything it generated so far.
    other_tokens: C_other, the context of the other generations in the running batch.
    pause_s: the execution-time model's (minimum) estimate of how long the robot needs before
        it wants the next segment: the pause the KV must survive if nothing resumes it earlier.
    eligible_in_s: how long until the scheduler may resume it (0 without a resume lead).
    pinned_blocks: KV blocks the engine's preserved pauses hold now, before this one; None
        where the scheduler has no engine to ask.
    """

    task_id: str
    context_tokens: int
    other_tokens: int
    pause_s: float
    eligible_in_s: float
    segment_index: int
    is_urgent: bool
    context: SchedulerContext
    pinned_blocks: int | None = None

    @property
    def batch_tokens(self) -> int:
        return self.context_tokens + self.other_tokens


@dataclass(frozen=True)
class GenerationInfo:
    """A generation about to be (re)started in the engine, as `Policy.service_class` sees it."""

    task_id: str
    is_urgent: bool
    deadline_s: float  # when the robot needs this run's segment (reference + ERT)
    bound_tokens: int  # most tokens this run may generate before its segment ends
    context_tokens: int
    skill_set: str


@dataclass(frozen=True)
class StepInfo:
    """One engine step, reported to `Policy.on_step`."""

    step: int
    duration_s: float
    batch_size: int
    prefill_tokens: int
    context_tokens: int  # sum of the running generations' contexts after the step
    # On a fleet whose replicas step on their own (`StepTiming.replica`): the replica that ran
    # this step and its own batch (`batch_size` is then the whole fleet's running count).
    replica: int | None = None
    replica_batch_size: int = 0


@dataclass(frozen=True)
class SegmentDispatch:
    """A segment on its way to its robot, as listeners receive it (a copy: the scheduler's own
    task and segment records stay private to it)."""

    task_id: str
    robot_id: str
    skill_set: str
    sequence: int
    text: str
    calls: tuple[SkillCall, ...]
    is_last: bool
    estimated_execution_s: float
    dispatched_s: float
    estimated_done_s: float


# ---------------------------------------------------------------------------- what it calls
class SchedulerListener(Protocol):
    """Where the scheduler's output goes: segments to robots, status changes to clients."""

    def on_segment(self, dispatch: SegmentDispatch) -> None: ...

    def on_status(self, snapshot: TaskSnapshot) -> None: ...


# ---------------------------------------------------------------------------- policies
@dataclass
class Policy:
    """Base policy. Subclasses implement `priorities`; higher values are served first.

    Hooks (the seed policies use them; the defaults keep the scheduler's original behaviour, and
    the scheduler skips hooks a policy does not override):

    - `make_admission(ctx)`: the policy's own admission controller, or None for the scheduler's
      default (latency-guided when `latency_guided_admission`, else KV blocks only);
    - `make_gate(ctx)`: a `Gate` consulted before each admission pass, or None;
    - `pause_handling(pause)`: preserve / discard / swap for each suspension (default discard:
      abort and resubmit with the token ids, served mostly from the prefix cache);
    - `on_admitted(task_seqs, now)`: after each admission pass, the tasks admitted (by
      `task_seq`, the queue column);
    - `on_step(step)`: after each engine step;
    - `on_task_end(task_seq)`: a task left the scheduler for good (forget its state);
    - `service_class(gen, now)`: "rt" / "be" for the engine request of a generation being
      started (BROS's bidirectional KV blocks serve the two classes from opposite ends);
    - `engine_needs()`: the engine this policy needs (`EngineNeeds`): vLLM's scheduling policy
      (`engine_scheduling`), the simulated engine variant it must be evaluated on, and the only
      engine it can run on (`requires_engine`, a baseline that exists only in simulation). The
      engine factory builds from it; the scheduler refuses an engine of another name.
    """

    name: str = "policy"
    dispatch: str = "segment"
    latency_guided_admission: bool = False
    # Engine `name` this policy needs (None = any engine); checked when the scheduler is built.
    requires_engine: str | None = None
    engine_scheduling: str = "fcfs"
    suspend_when: str = "always"
    hopeless: str = "serve"
    # Prefix caching stays on even where the bench turns it off for whole-plan baselines
    # (--paper-config): for a policy that reproduces a system run with it (authors-vllm).
    always_prefix_cache: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.dispatch not in DISPATCH_MODES:
            raise ValueError(f"policy {self.name!r}: dispatch must be one of {DISPATCH_MODES},"
                             f" got {self.dispatch!r}")
        if self.suspend_when not in SUSPEND_RULES:
            raise ValueError(f"policy {self.name!r}: suspend_when must be one of "
                             f"{SUSPEND_RULES}, got {self.suspend_when!r}")
        if self.hopeless not in HOPELESS_RULES:
            raise ValueError(f"policy {self.name!r}: hopeless must be one of {HOPELESS_RULES}, "
                             f"got {self.hopeless!r}")
        if self.engine_scheduling not in ENGINE_SCHEDULING:
            raise ValueError(f"policy {self.name!r}: engine_scheduling must be one of "
                             f"{ENGINE_SCHEDULING}, got {self.engine_scheduling!r}")

    @property
    def segmented(self) -> bool:
        return self.dispatch == "segment"

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        raise NotImplementedError

    def select(self, view: QueueView, now: float) -> int | None:
        """Row index of the generation to serve next, or None for an empty queue.
        Ties go to the lowest row index (argmax semantics)."""
        if len(view) == 0:
            return None
        return int(np.argmax(self.priorities(view, now)))

    # ---- hooks (see the class docstring) ----
    def make_admission(self, ctx: SchedulerContext) -> AdmissionController | None:
        return None

    def make_gate(self, ctx: SchedulerContext) -> Gate | None:
        return None

    def pause_handling(self, pause: PauseInfo) -> str:
        return DISCARD

    def on_admitted(self, task_seqs: Sequence[int], now: float) -> None:
        pass

    def on_step(self, step: StepInfo) -> None:
        pass

    def on_task_end(self, task_seq: int) -> None:
        pass

    def service_class(self, gen: GenerationInfo, now: float) -> str | None:
        return None

    def engine_needs(self) -> EngineNeeds:
        return EngineNeeds(scheduling_policy=self.engine_scheduling,
                           only_engine=self.requires_engine)
