"""What a replay produces: each task's outcome (`TaskResult`), one policy's run (`RunResult`), and
the `workload` block of the results document. The ROS replay (experiments/replay) fills the same
records from a recorded bag, so both report through `bench.metrics`."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.core.tuf import TUF
from timelyllm_ros.lrtrace.workload import Event, Workload

NAN = float("nan")


def task_type(category: str, tuf_level: str) -> str:
    """Task type for reporting: drone tasks split by TUF level (`drone-normal`, `drone-urgent`);
    other categories by name (`arm`, `chat`), with `-<level>` added for a non-default level
    (`arm-urgent`). A level's `/<detail>` suffix (per-request levels such as `rt/17`) is not
    part of the type."""
    tuf_level = tuf_level.split("/", 1)[0]
    if category == "drone":
        return f"drone-{tuf_level}"
    if tuf_level in ("normal", "chat", "") or tuf_level == category:
        return category
    return f"{category}-{tuf_level}"


@dataclass
class SegmentResult:
    sequence: int
    text: str
    is_last: bool
    dispatched_s: float
    started_s: float
    finished_s: float


@dataclass
class TaskResult:
    """One task's outcome. Times are seconds from the start of the replay."""

    task_id: str
    trace_id: int
    category: str
    tuf_level: str
    task_type: str
    robot_id: str
    arrival_s: float
    ert_s: float
    state: str = "done"
    reason: str = ""
    response_time_s: float = NAN
    utility: float = NAN
    # Waiting caused by LLM planning: completion - arrival - execution - robot_blocked.
    waiting_time_s: float = NAN
    # The scheduler's own figure, which includes time the robot spent on other tasks.
    sched_waiting_time_s: float = NAN
    robot_blocked_s: float = 0.0
    execution_s: float = NAN
    completion_s: float = NAN
    resumes: int = 0
    # Arrival until the last segment was dispatched: the request's end-to-end latency as the
    # seed papers measure it (pauses for robot / tool execution in between included).
    latency_s: float = NAN
    generated_tokens: int = 0
    event_id: int = -1
    segments: list[SegmentResult] = field(default_factory=list)
    # Intervals in which the task's generation was running in the engine.
    generation_spans: list[tuple[float, float]] = field(default_factory=list)
    # When the planner was done with it: its plan fully generated, or the task ended first
    # (shed, failed, ...). NaN where the run does not record it.
    planned_s: float = NAN
    # Its time-utility function, where the run knows it (the response as the TimelyLLM authors
    # measure it is valued with it: bench/metrics.py, `first_action_metrics`).
    tuf: TUF | None = None

    @property
    def is_done(self) -> bool:
        return self.state == "done"


@dataclass
class RunResult:
    policy: str
    tasks: list[TaskResult]
    fetch_overhead_s: list[float]
    steps: int
    clock_s: float  # replay duration on the engine's clock
    wall_s: float
    config: dict[str, Any] = field(default_factory=dict)
    # Suspensions by pause handling and the scheduler's evictions of parked generations
    # (`pause_summary`); empty where the run has none to report.
    pauses: dict[str, int] = field(default_factory=dict)
    # How the run drained (NaN / empty where the run does not record it, e.g. the ROS replay).
    # Times are seconds from the start, on the engine's clock: the last arrival, and the end of
    # the last engine step (after the last arrival, when the planner's own backlog was gone;
    # `clock_s` also waits for the robots).
    last_arrival_s: float = NAN
    last_step_s: float = NAN
    # Tasks whose terminal status reached the listener (the clients that were told).
    told: int = 0
    # What the planner still held at the end (bench.replay_outcome.end_state): all zeros when idle.
    end_state: dict[str, int] = field(default_factory=dict)

    @property
    def scheduling_overhead_ms(self) -> float:
        if not self.fetch_overhead_s:
            return 0.0
        return float(np.mean(self.fetch_overhead_s)) * 1e3


def workload_block(workload: Workload, events: Sequence[Event], config: BenchConfig,
                   runs: Mapping[str, RunResult], seed: int) -> dict[str, Any]:
    """The results document's `workload` block: what was replayed, how, and per policy how many
    tasks ended without a response or unfinished, and the replay's duration on its clock."""
    tasks = next(iter(runs.values())).tasks if runs else []
    return {
        **workload.to_dict(),
        "seed": seed,
        "events": len(events),
        "tasks": sum(len(e.tasks) for e in events),
        "tasks_by_type": dict(Counter(t.task_type for t in tasks)),
        "bench": config.describe(),
        "policy_batch_cap": {n: r.config.get("policy_batch_cap") for n, r in runs.items()},
        "tasks_without_response": {n: sum(1 for t in r.tasks if not math.isfinite(t.response_time_s))
                                   for n, r in runs.items()},
        "tasks_not_done": {n: sum(1 for t in r.tasks if t.state != "done")
                           for n, r in runs.items()},
        "virtual_clock_s": {n: r.clock_s for n, r in runs.items()},
    }
