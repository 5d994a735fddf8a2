"""The planner's scheduler on a real vLLM deployment, on the wall clock, with every run metered:
what `timelyllm router-compare` and test/unit/engine/test_vllm_router.py measure.

- `MeteredRuns` wraps an engine and records each run (engine request) of a task: its prompt
  length, its time to first token, how it ended. In sequential mode (one task at a time) it also
  reads every worker's prefix-cache counters (`vllm:prefix_cache_queries_total` /
  `hits_total`) at each new run, so the difference is the previous run's: which worker served it
  and how many of its prompt tokens came from the prefix cache. A suspended run is aborted (the
  planner's openai engine has no sessions), and an aborted stream carries no usage report, so
  the counters are the only per-run source.
- `run_tasks` drives a `SegmentScheduler` like the planner node does: tick, deliver each segment
  to a robot that executes it for `exec_s` seconds of wall time, report back.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from timelyllm_ros.bench.vllm_deployment import prefix_counters
from timelyllm_ros.core.engine.base import EngineAdapter, EngineOutput, EngineRequest
from timelyllm_ros.core.engine.replicas import affinity_key
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.lifecycle import TERMINAL_STATES
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.core.skills.skillset import load_skillsets
from timelyllm_ros.core.task import TaskSpec
from timelyllm_ros.core.tuf import default_config_dir, load_tuf_levels
from timelyllm_ros.lrtrace.traces import load_traces


@dataclass
class RunRecord:
    """One run of a task: `resume` 0 is the plan's first run, n its n-th resume."""

    request_id: str
    prompt_len: int
    added_s: float
    first_token_s: float | None = None
    ended_s: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    worker: int | None = None       # sequential mode: the worker whose counters moved
    cached: int | None = None       # sequential mode: prompt tokens served from the cache

    @property
    def task_id(self) -> str:
        return affinity_key(self.request_id)

    @property
    def resume(self) -> int:
        return int(self.request_id.rsplit("#", 1)[1])

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.added_s

    def full_blocks(self, block_size: int) -> int:
        """What a perfect prefix hit serves: the whole blocks of all but the last prompt token
        (vLLM computes at least one token of every request)."""
        return (self.prompt_len - 1) // block_size * block_size


class MeteredRuns:
    """Records every run the scheduler sends through `engine` (module docstring)."""

    def __init__(self, engine: EngineAdapter, worker_urls: Sequence[str],
                 per_run_counters: bool):
        self.engine = engine
        self.worker_urls = list(worker_urls)
        self.per_run_counters = per_run_counters
        self.runs: dict[str, RunRecord] = {}
        self._open: RunRecord | None = None
        self._counters = self._read() if per_run_counters else []
        self._add, self._step, self._abort = engine.add_request, engine.step, engine.abort_request
        engine.add_request = self.add_request  # type: ignore[method-assign]
        engine.step = self.step  # type: ignore[method-assign]
        engine.abort_request = self.abort_request  # type: ignore[method-assign]

    def _read(self) -> list[tuple[float, float]]:
        return [prefix_counters(u) for u in self.worker_urls]

    def _close_open(self) -> None:
        """Gives the counters' movement since the last run started to that run."""
        if not self.per_run_counters:
            return
        now = self._read()
        if self._open is not None:
            moved = [(q1 - q0, h1 - h0) for (q0, h0), (q1, h1) in zip(self._counters, now)]
            served = [i for i, (q, _) in enumerate(moved) if q > 0]
            if len(served) == 1:
                self._open.worker = served[0]
                self._open.cached = int(moved[served[0]][1])
        self._counters = now

    def add_request(self, request: EngineRequest) -> None:
        self._close_open()
        record = RunRecord(request.request_id, len(request.prompt_token_ids), time.monotonic())
        self.runs[request.request_id] = record
        self._open = record
        self._add(request)

    def abort_request(self, request_id: str) -> None:
        record = self.runs.get(request_id)
        if record is not None and record.ended_s is None:
            record.ended_s, record.finish_reason = time.monotonic(), "abort"
        self._abort(request_id)

    def generating(self, task_id: str) -> bool:
        """A run of the task has streamed a token and not ended."""
        return any(r.task_id == task_id and r.first_token_s is not None and r.ended_s is None
                   for r in self.runs.values())

    def step(self) -> list[EngineOutput]:
        outputs = self._step()
        now = time.monotonic()
        for out in outputs:
            record = self.runs.get(out.request_id)
            if record is None:
                continue
            if out.new_token_ids and record.first_token_s is None:
                record.first_token_s = now
            if out.finished:
                record.ended_s, record.finish_reason, record.error = (now, out.finish_reason,
                                                                      out.error)
        return outputs

    def finish(self) -> list[RunRecord]:
        self._close_open()
        self._open = None
        return list(self.runs.values())


class _Listener:
    def __init__(self):
        self.new: list = []

    def on_segment(self, dispatch) -> None:
        self.new.append(dispatch)

    def on_status(self, snapshot) -> None:
        pass


def lrtrace_tasks(prefix: str, count: int, now: float,
                  skill_sets: Sequence[str] = ("drone",)) -> list[TaskSpec]:
    """`count` tasks `<prefix>-<i>` with distinct LRTrace instructions (normal urgency), their
    skill set taking turns over `skill_sets` (drone segments are at most 10 tokens, chat ones
    60: a chat run is long enough to be caught generating)."""
    levels = load_tuf_levels(default_config_dir() / "tuf_levels.yaml")
    traces = load_traces().values()
    by_set = {name: [t for t in traces if t.skill_set == name] for name in skill_sets}
    specs = []
    for i in range(count):
        name = skill_sets[i % len(skill_sets)]
        trace = by_set[name][(i // len(skill_sets)) % len(by_set[name])]
        specs.append(TaskSpec(f"{prefix}-{i}", f"robot_{prefix}_{i}", name, trace.instruction,
                              levels.get("normal"), now, "normal"))
    return specs


def drone_tasks(prefix: str, count: int, now: float) -> list[TaskSpec]:
    return lrtrace_tasks(prefix, count, now, ("drone",))


def make_scheduler(engine: EngineAdapter) -> SegmentScheduler:
    """The planner's scheduler (policy timelyllm) with the project's skill sets, robot reports
    not fed back into the prompt (so a resume's prompt is exactly the plan so far)."""
    config = default_config_dir()
    skill_sets = {n: dataclasses.replace(s, observations=False)
                  for n, s in load_skillsets(config / "skillsets").items()}
    return SegmentScheduler(engine, get_policy("timelyllm"), skill_sets,
                            ExecutionTimeModel.from_yaml(config / "exec_model.yaml"), _Listener(),
                            SchedulerConfig(report_timeout_min_s=3600.0))


@dataclass
class Robots:
    """Each segment takes `exec_s` of wall time on its robot, then is reported done."""

    exec_s: float
    due: list = field(default_factory=list)     # (time, task_id, sequence, started)

    def take(self, sch: SegmentScheduler) -> None:
        listener = sch.listener
        while listener.new:
            dispatch = listener.new.pop(0)
            start = time.monotonic()
            self.due.append((start + self.exec_s, dispatch.task_id, dispatch.sequence, start))
        self.due.sort()


def run_tasks(sch: SegmentScheduler, robots: Robots, timeout_s: float,
              until: Callable[[SegmentScheduler], bool] | None = None) -> None:
    """Drives `sch` until no task is active (or `until(sch)`); TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    engine = sch.engine
    while sch.active_tasks() and not (until is not None and until(sch)):
        if time.monotonic() > deadline:
            states = {t.spec.task_id: t.state for t in sch.active_tasks()}
            raise TimeoutError(f"tasks still active after {timeout_s:.0f} s: {states}")
        worked = sch.tick()
        robots.take(sch)
        now = time.monotonic()
        while robots.due and robots.due[0][0] <= now:
            _, task_id, sequence, started = robots.due.pop(0)
            if task_id in sch.tasks and sch.tasks[task_id].state not in TERMINAL_STATES:
                sch.on_report(task_id, sequence, started, now, True)
        if not worked and not engine.has_unfinished_requests():
            time.sleep(0.005)


def run_one_after_another(engine: EngineAdapter, worker_urls: Sequence[str], prefix: str,
                          count: int) -> tuple[SegmentScheduler, list[RunRecord]]:
    """`count` drone tasks, each submitted once the one before has ended (every resume finds
    its plan's prefix where the placement put it); the scheduler and the records of the runs
    of these tasks, with each run's own prefix-cache hits."""
    meter = MeteredRuns(engine, worker_urls, per_run_counters=True)
    sch = make_scheduler(engine)
    sch.warm_prefix_cache()
    robots = Robots(exec_s=0.05)
    for spec in drone_tasks(prefix, count, engine.now()):
        sch.submit(spec)
        run_tasks(sch, robots, timeout_s=300)
    return sch, [r for r in meter.finish() if r.request_id.startswith(prefix)]


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None
