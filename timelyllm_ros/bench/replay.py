"""Discrete-event replay of a composed workload against one scheduling policy.

The replay drives the very `SegmentScheduler` the ROS planner node runs, with:

- an engine (bench/engines.py): the calibrated `SimulatedEngine` (virtual clock; plans are the
  traces' scripted plans) or the real vLLM engine (wall clock; plans are generated, the loop
  sleeps until events);
- simulated robots (bench/simulated_robots.py): each robot executes the segments dispatched to
  it in order, one at a time, with durations drawn from the execution-time model, and reports
  each finished segment back. One-way network latency (the workload's, 8 ms in the paper) is
  added on the way to the robot and on the way back.

Loop: handle every event due at `engine.now()` (task arrivals -> `submit`, robot reports arriving
at the planner -> `on_report`), then `tick()` the scheduler (one engine step). When nothing can run,
jump (or, on the real engine, sleep) to the next event or scheduler timer. The run stops when
every task is terminal, and is aborted as stuck when it stops progressing (`max_stall_s`, and
engine steps that take no time; a deep backlog that still drains is not stuck, docs/overload.md).
Once the run ends, each task's outcome is read off the scheduler (bench/replay_outcome.py).

Determinism: event lists come from `compose` (seeded); robot durations are drawn per (seed, task
number, call index), so every policy sees exactly the same robot execution times. The simulated
engine is deterministic too, so the same seed gives the same results.

Busy robots: `compose` draws robots per event without tracking whether a robot is still busy with
a task from an earlier event. By default (`robots="queue"`) a robot serves its tasks in arrival
order, like a real robot that does not interleave two plans. The time a segment spends waiting
for *another* task is not the LLM's doing, so it is recorded per task (`robot_blocked_s`) and
subtracted from the reported waiting time; response time and utility (the LLM's first response)
are unaffected by it. `robots="parallel"` gives every task its own executor instead (no blocking).
The scheduler is not told about such blocking, so the bench raises the scheduler's report
timeout (`report_timeout_min_s`) so that a segment queued behind another task is not declared lost.

The paper's configuration (defaults in bench/config.py, see docs/bench.md): prompts of 2884
tokens (the paper's latency profile, bench/prompts.py), the `vllm` / `vllm-stream` baselines
without automatic prefix caching (vLLM V0's default in 2024), TimelyLLM's segmented policies with
it (their resumption design), and every policy's own admission (latency-guided for `timelyllm*`).
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.engines import EnginePool, build_engine
from timelyllm_ros.bench.policies import make_policy
from timelyllm_ros.bench.prompts import pad_skill_sets
from timelyllm_ros.bench.replay_outcome import end_state, pause_summary, stuck_state, task_result
from timelyllm_ros.bench.results import RunResult
from timelyllm_ros.bench.simulated_robots import SimulatedRobots
from timelyllm_ros.core.engine.base import EngineAdapter
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.sched.interface import SegmentDispatch, TaskRejected
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.core.skills.skillset import SkillSet, load_skillsets
from timelyllm_ros.core.task import TaskSnapshot, TaskSpec
from timelyllm_ros.core.tuf import TufLevels, default_config_dir, load_tuf_levels
from timelyllm_ros.lrtrace.traces import Trace, load_traces
from timelyllm_ros.lrtrace.workload import Event, Workload

# progress(tasks ended, tasks in all, seconds on the engine's clock since the start)
ProgressFn = Callable[[int, int, float], None]

# Engine steps in a row that took no time: a step computes nothing then (the simulated engine's
# clock advances by what it computes). A healthy run has at most a few in a row (a step in which
# every running request was preempted); this many means the scheduler waits on requests the
# engine no longer works on, which `max_stall_s` cannot see because the clock stands still.
STILL_STEPS_LIMIT = 1000


class _Listener:
    """The scheduler's listener: segments go to the robots; a task that ends without finishing
    frees its robot; every first terminal status is passed on. Both count as progress for the
    replay's stall check (`progress()` is called with no argument)."""

    def __init__(self, robots: SimulatedRobots, on_terminal: Callable[[TaskSnapshot], None],
                 progress: Callable[[], None]):
        self.robots = robots
        self.on_terminal = on_terminal
        self.progress = progress
        self.terminal: set[str] = set()

    def on_segment(self, dispatch: SegmentDispatch) -> None:
        self.progress()
        self.robots.dispatch(dispatch)

    def on_status(self, snapshot: TaskSnapshot) -> None:
        if snapshot.is_terminal and snapshot.task_id not in self.terminal:
            self.progress()
            self.terminal.add(snapshot.task_id)
            if snapshot.state != "done":
                self.robots.drop(snapshot.task_id)
            self.on_terminal(snapshot)


class _ClosedLoop:
    """Which events wait for another event's tasks to end (`Event.after_event`)."""

    def __init__(self, events: Sequence[Event]):
        self.open_events = [e for e in events if e.after_event is None]
        self._waiting_on: dict[int, list[Event]] = {}
        for e in events:
            if e.after_event is not None:
                self._waiting_on.setdefault(e.after_event, []).append(e)
        known = {e.event_id for e in events}
        missing = sorted(set(self._waiting_on) - known)
        if missing:
            raise ValueError(f"events: after_event {missing[0]} names no event")
        self._left = {e.event_id: len(e.tasks) for e in events}
        self._event_of: dict[str, int] = {}
        self._ready: list[Event] = []

    def submitted(self, task_id: str, event_id: int) -> None:
        self._event_of[task_id] = event_id

    def task_ended(self, task_id: str) -> None:
        event_id = self._event_of.pop(task_id, None)
        if event_id is None:
            return
        self._left[event_id] -= 1
        if self._left[event_id] == 0:
            self._ready.extend(self._waiting_on.pop(event_id, ()))

    def has_ready(self) -> bool:
        return bool(self._ready)

    def take_ready(self) -> list[Event]:
        ready, self._ready = self._ready, []
        return ready

    def drop(self, event: Event) -> int:
        """Forget `event` and every event waiting on it; returns how many events that was."""
        dropped = 1
        for child in self._waiting_on.pop(event.event_id, ()):
            dropped += self.drop(child)
        return dropped


def _replay_skill_sets(events: Sequence[Event], traces: Mapping[int, Trace], config: BenchConfig,
                       skill_sets: Mapping[str, SkillSet] | None) -> dict[str, SkillSet]:
    """The skill sets the planner of this replay serves, padded to the configured prompt length.
    By default those of config/skillsets that the workload's traces use: a planner serving only
    drones has only the drone set, and the scheduler sizes its admission check by the largest
    max_segment_tokens of its sets."""
    if skill_sets is None:
        skill_sets = load_skillsets(config.skillsets_dir or default_config_dir() / "skillsets")
        used = {traces[t.trace_id].skill_set for e in events for t in e.tasks}
        skill_sets = {n: s for n, s in skill_sets.items() if n in used} or skill_sets
        # LRTrace replays timings, not what the robot saw: a robot report carries no values to
        # feed back, so the skill sets' `observations` would only add the wait for the report.
        # The planner serves them on; `timelyllm bench` compares scheduling without them.
        skill_sets = {n: dataclasses.replace(s, observations=False) for n, s in skill_sets.items()}
    instructions: dict[str, set[str]] = {}
    for event in events:
        for t in event.tasks:
            trace = traces[t.trace_id]
            instructions.setdefault(trace.skill_set, set()).add(trace.instruction)
    return pad_skill_sets(skill_sets, config.effective_prompt_tokens, instructions)


def run_policy(events: Sequence[Event], policy_name: str, workload: Workload,
               config: BenchConfig | None = None, *, traces: Mapping[int, Trace] | None = None,
               tuf_levels: TufLevels | None = None,
               skill_sets: Mapping[str, SkillSet] | None = None,
               engine: EngineAdapter | EnginePool | None = None,
               progress: ProgressFn | None = None,
               exec_model_factory: Callable[[], ExecutionTimeModel] | None = None,
               call_durations: Mapping[tuple[int, int], float] | None = None) -> RunResult:
    """Replay `events` under `policy_name` and return every task's outcome.

    `engine`: an engine to reuse, or an `EnginePool` (the real vLLM engine is expensive to
    build); by default a fresh one is built from `config` (always pass none for the simulated
    engine, whose clock and cache must start fresh for every policy).

    `skill_sets`: default = those of config/skillsets that the workload's traces use, padded to
    `config.effective_prompt_tokens`.

    `exec_model_factory`: the scheduler's execution-time model (a fresh one per run, it learns
    online; default: config.exec_model_path). `call_durations`: (task number, call index) ->
    seconds the simulated robot takes for that call, instead of sampling the model.

    Events with `after_event` are released that many seconds after every task of the event they
    name has ended (closed loop); one that would be released after `workload.duration_s` is not
    submitted, nor is anything waiting on it.
    """
    config = config or BenchConfig()
    wall_start = time.perf_counter()
    traces = traces if traces is not None else load_traces()
    tuf_levels = tuf_levels if tuf_levels is not None else load_tuf_levels(config.tuf_levels_path)
    skill_sets = _replay_skill_sets(events, traces, config, skill_sets)
    exec_model = (exec_model_factory() if exec_model_factory is not None  # fresh: it learns online
                  else ExecutionTimeModel.from_yaml(config.exec_model_path))
    policy = make_policy(policy_name, config)
    latency = workload.network_latency_s if config.network_latency_s is None \
        else config.network_latency_s
    seed = workload.seed if config.seed is None else config.seed
    own_engine = engine is None
    prefix_cache = (config.baseline_prefix_cache or policy.dispatch == "segment"
                    or policy.always_prefix_cache)
    if isinstance(engine, EnginePool):
        engine = engine.get(prefix_cache, policy)
    elif engine is None:
        engine = build_engine(config, prefix_cache=prefix_cache, policy=policy)
    simulated = config.engine == "sim"

    # (due time, insertion order, "arrival" | "report", payload): the order breaks ties so that
    # events due at the same time are handled as they were scheduled.
    heap: list[tuple[float, int, str, Any]] = []
    order = 0

    def push(at: float, kind: str, payload: Any) -> None:
        nonlocal order
        heapq.heappush(heap, (at, order, kind, payload))
        order += 1

    total = sum(len(e.tasks) for e in events)
    done_count = 0
    t0 = 0.0

    def on_terminal(_snap: TaskSnapshot) -> None:
        nonlocal done_count
        done_count += 1
        if progress is not None:
            progress(done_count, total, engine.now() - t0)

    robots = SimulatedRobots(exec_model, seed, latency, config.robots,
                             lambda at, tid, seq, st, fin: push(at, "report", (tid, seq, st, fin)),
                             call_durations=call_durations)
    loop = _ClosedLoop(events)
    # Engine-clock times of the last progress (a task arrived or ended, a segment went out, a
    # robot reported) and of the last engine step: a run is stuck when the first stops moving,
    # and the second, after the last arrival, is when the planner's backlog had drained.
    last_progress = last_step = engine.now()

    def note_progress() -> None:
        nonlocal last_progress
        last_progress = engine.now()

    listener = _Listener(robots, lambda snap: (on_terminal(snap), loop.task_ended(snap.task_id)),
                         note_progress)
    scheduler = SegmentScheduler(
        engine, policy, dict(skill_sets), exec_model, listener,
        SchedulerConfig(network_latency_s=latency, batch_cap=config.cap_for(policy),
                        resume_lead_s=config.resume_lead_s, evict_parked=config.evict_parked,
                        report_timeout_min_s=config.report_timeout_min_s))
    scheduler.warm_prefix_cache()

    t0 = last_progress = last_step = engine.now()
    still = 0  # engine steps in a row that took no time
    meta: dict[str, tuple[Any, Trace, int]] = {}
    for event in loop.open_events:
        push(t0 + event.time_s, "arrival", event)
    arrivals_left = len(events)
    last_arrival = t0 + (max((e.time_s for e in loop.open_events), default=0.0))
    horizon = t0 + workload.duration_s

    def release_ready(now: float) -> None:
        nonlocal arrivals_left, last_arrival
        for event in loop.take_ready():
            at = now + event.time_s
            if at > horizon:
                arrivals_left -= loop.drop(event)
                continue
            push(at, "arrival", event)
            last_arrival = max(last_arrival, at)

    try:
        while True:
            now = engine.now()
            while heap and heap[0][0] <= now:
                at, _, kind, payload = heapq.heappop(heap)
                last_progress = now
                if kind == "arrival":
                    arrivals_left -= 1
                    for spec in payload.tasks:  # before submit: a rejection ends a task at once
                        loop.submitted(_task_id(spec), payload.event_id)
                    _submit_event(scheduler, robots, payload, at, traces, tuf_levels, simulated,
                                  meta)
                else:
                    task_id, seq, started, finished = payload
                    scheduler.on_report(task_id, seq, started, finished, True)
            if arrivals_left == 0 and len(listener.terminal) >= len(scheduler.tasks):
                break
            if config.max_overrun_s is not None and now > last_arrival + config.max_overrun_s:
                raise RuntimeError(f"{policy_name}: replay still running {config.max_overrun_s:.0f} s "
                                   f"after the last arrival ({stuck_state(scheduler, engine)})")
            progressed = scheduler.tick()
            if progressed:
                still = still + 1 if engine.now() == last_step else 0
                last_step = engine.now()
                if still >= STILL_STEPS_LIMIT:
                    raise RuntimeError(f"{policy_name}: replay stuck: {still} engine steps in a row "
                                       f"took no time ({stuck_state(scheduler, engine)})")
            # After the tick: an overdue report deadline it acted on ended a task (progress).
            if engine.now() > last_progress + config.max_stall_s:
                raise RuntimeError(f"{policy_name}: replay stuck: nothing progressed for "
                                   f"{engine.now() - last_progress:.0f} s "
                                   f"({stuck_state(scheduler, engine)})")
            if loop.has_ready():
                release_ready(engine.now())
                continue
            if progressed:
                continue
            candidates = [heap[0][0]] if heap else []
            timer = scheduler.next_timer_s()
            if timer is not None:
                candidates.append(timer)
            if not candidates:
                raise RuntimeError(f"{policy_name}: nothing runs, nothing is due, and tasks "
                                   f"{[t.task_id for t in scheduler.active_tasks()][:5]} are "
                                   "not finished")
            target = min(candidates)
            if target <= now:
                # A timer already due that the scheduler could not act on (e.g. KV blocks);
                # let a little time pass rather than spin.
                target = now + 1e-3
            engine.advance_idle(target)
    finally:
        if own_engine and not simulated:
            engine.shutdown()

    clock_s = engine.now() - t0
    tasks = [task_result(scheduler.tasks[tid], meta[tid], robots, t0) for tid in scheduler.tasks]
    return RunResult(policy=policy_name, tasks=tasks,
                     fetch_overhead_s=list(scheduler.fetch_overhead_s), steps=scheduler.steps,
                     clock_s=clock_s, wall_s=time.perf_counter() - wall_start,
                     pauses=pause_summary(scheduler),
                     last_arrival_s=last_arrival - t0, last_step_s=last_step - t0,
                     told=len(listener.terminal), end_state=end_state(scheduler, engine),
                     config={**config.describe(), "seed": seed, "network_latency_s": latency,
                             "policy_batch_cap": config.cap_for(policy),
                             "engine_prefix_cache": prefix_cache,
                             "prompt_tokens_min": min(
                                 (len(t.prompt_ids) for t in scheduler.tasks.values()
                                  if t.prompt_ids), default=0)})


def _task_id(spec) -> str:
    return f"t{spec.task_id:05d}"


def _submit_event(scheduler: SegmentScheduler, robots: SimulatedRobots, event: Event, at: float,
                  traces: Mapping[int, Trace], tuf_levels: TufLevels, simulated: bool,
                  meta: dict) -> None:
    for spec in event.tasks:
        trace = traces[spec.trace_id]
        task_id = _task_id(spec)
        meta[task_id] = (spec, trace, event.event_id)
        robots.add_task(task_id, spec.task_id, spec.robot_id)
        try:
            scheduler.submit(TaskSpec(
                task_id=task_id, robot_id=spec.robot_id, skill_set=trace.skill_set,
                # The trace's instruction plus the task's own context, if its workload has one.
                instruction=spec.instruction_for(trace), tuf=tuf_levels.get(spec.tuf_level),
                arrival_s=at,
                urgency=spec.tuf_level, scripted_plan=trace.plan if simulated else None,
                max_plan_tokens=trace.max_plan_tokens))
        except TaskRejected:
            pass  # recorded by the scheduler as a rejected task; the listener saw it


def run_policies(events: Sequence[Event], policies: Iterable[str], workload: Workload,
                 config: BenchConfig, *, progress_factory: Callable[[str], ProgressFn] | None = None,
                 engine: EngineAdapter | EnginePool | None = None,
                 **kw: Any) -> dict[str, RunResult]:
    """Run each policy on the same events (a fresh simulated engine each; a shared real one).
    `progress_factory(policy name)` gives each run its progress callback."""
    out = {}
    for name in policies:
        progress = progress_factory(name) if progress_factory else None
        out[name] = run_policy(events, name, workload, config, engine=engine, progress=progress,
                               **kw)
    return out
