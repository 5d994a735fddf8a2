"""What the parts of `SegmentScheduler` share, declared in one place.

The scheduler is composed of steps that each get exactly what they need at construction
(scheduler.py): `TaskBook` (task_book.py: the transitions every step shares), `ParkedEviction`
(parked.py), `AdmissionStep` (admission_step.py), `OutputStep` (outputs.py) and `TaskInputs`
(task_inputs.py). The mutable state they read and change is the `SchedulerState` below: every
field is named and typed here, and nothing else holds state of the scheduler's own, so what a
step may touch is visible from its constructor. Policies never see this object: they get the
frozen records of interface.py.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from timelyllm_ros.core.engine.base import PAUSE_HANDLINGS, EngineAdapter
from timelyllm_ros.core.engine.eviction import EvictionStats
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.sched.admission import TokenRateMeter
from timelyllm_ros.core.sched.interface import Policy, SchedulerContext, SchedulerListener
from timelyllm_ros.core.sched.queue_view import QueueArrays
from timelyllm_ros.core.sched.report_deadlines import ReportDeadlines
from timelyllm_ros.core.sched.robot_timeline import RobotTimelines
from timelyllm_ros.core.skills.skillset import SkillSet
from timelyllm_ros.core.task import TaskRecord

if TYPE_CHECKING:
    from timelyllm_ros.core.sched.scheduler import SchedulerConfig


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


@dataclass(frozen=True)
class PolicyHooks:
    """Which optional `Policy` hooks the policy overrides: a hook it does not override is never
    called, so a policy without hooks runs the original code path at no cost."""

    admitted: bool = False
    step: bool = False
    task_end: bool = False
    pause: bool = False
    service_class: bool = False

    @classmethod
    def of(cls, policy: Policy) -> "PolicyHooks":
        return cls(admitted=_overrides(policy, "on_admitted"), step=_overrides(policy, "on_step"),
                   task_end=_overrides(policy, "on_task_end"),
                   pause=_overrides(policy, "pause_handling"),
                   service_class=_overrides(policy, "service_class"))


@dataclass
class SchedulerStats:
    """Counters the scheduler publishes (the bench's results, the planner's metrics)."""

    steps: int = 0
    preemptions: int = 0           # running generations preempted for more urgent work
    gate_holds: int = 0            # admission passes the policy's gate held back
    # Boundaries at which a generation kept going instead of suspending (work-conserving),
    # and tasks shed because their utility could not be positive any more.
    suspensions_avoided: int = 0
    shed: int = 0
    pause_counts: dict[str, int] = field(
        default_factory=lambda: {h: 0 for h in PAUSE_HANDLINGS})
    # Parked generations the scheduler evicted for an admission (parked.py).
    evictions: EvictionStats = field(default_factory=EvictionStats)
    # Seconds each admission pass spent before its first admission (bounded by
    # SchedulerConfig.overhead_history).
    fetch_overhead_s: list[float] = field(default_factory=list)


@dataclass
class SchedulerState:
    """The scheduler's state and collaborators (module docstring)."""

    engine: EngineAdapter
    policy: Policy
    skill_sets: dict[str, SkillSet]
    exec_model: ExecutionTimeModel
    listener: SchedulerListener
    config: "SchedulerConfig"
    context: SchedulerContext
    hooks: PolicyHooks
    # Every task the scheduler knows (terminal ones too, up to config.max_finished_tasks).
    tasks: dict[str, TaskRecord] = field(default_factory=dict)
    # Non-terminal tasks, in submission order.
    active: dict[str, TaskRecord] = field(default_factory=dict)
    # Their report deadlines, earliest first (see report_deadlines.py for why not a scan).
    deadlines: ReportDeadlines = field(init=False)
    robots: RobotTimelines = field(default_factory=RobotTimelines)
    finished_order: deque[str] = field(default_factory=deque)
    submissions: itertools.count = field(default_factory=itertools.count)
    # Queued generations, one row each (queue_view.py).
    queue: QueueArrays = field(default_factory=QueueArrays)
    running: dict[str, TaskRecord] = field(default_factory=dict)  # engine request id -> task
    # Sum of the running generations' contexts (prompt + generated + reports), kept as they
    # start, generate and stop: a suspension's `PauseInfo.other_tokens` and each step's
    # `StepInfo.context_tokens` without a pass over the batch.
    running_context: int = 0
    # Engine request id -> most tokens that run may generate (RunningGen.bound_tokens).
    run_bound: dict[str, int] = field(default_factory=dict)
    # Suspended generations whose engine request is paused (preserve/swap): task id ->
    # (engine request id, handling).
    paused: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Task id -> context tokens it held when the scheduler evicted it; cleared by the first
    # output of its resumed run (which measures the recompute) or by its end.
    evicted: dict[str, int] = field(default_factory=dict)
    # Skill set -> moving mean of seconds from a run's admission to its first segment.
    run_to_segment: dict[str, float] = field(default_factory=dict)
    # Skill set -> token ids of its fixed prompt (the prefix the cache shares across tasks),
    # and task id -> tokens of its prompt shared that way (full blocks).
    shared_prefix: dict[str, list[int]] = field(default_factory=dict)
    shared_of: dict[str, int] = field(default_factory=dict)
    # Skill set -> [sum, count, observed?] of reported segment durations, and of estimates
    # until the first report.
    seg_time: dict[str, list] = field(default_factory=dict)
    # Measured decode speed of one generation (tokens/s).
    rate: TokenRateMeter = field(init=False)
    # What the last admission pass left waiting (Policy.suspend_when == "contended").
    contention: Contention | None = None
    stats: SchedulerStats = field(default_factory=SchedulerStats)

    def __post_init__(self) -> None:
        self.deadlines = ReportDeadlines(self.active)
        self.rate = TokenRateMeter(self.config.rate_window_steps)


def _overrides(policy: Policy, name: str) -> bool:
    return getattr(type(policy), name, None) is not getattr(Policy, name)
