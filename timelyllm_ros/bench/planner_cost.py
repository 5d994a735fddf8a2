"""The planner's own cost per scheduling pass at fleet scale (`timelyllm fleet --planner-cost`).

A closed population of `active` drone tasks (urgent and normal, the WID1 traces) on a simulated
fleet of `replicas` engines (core/engine/sim/fleet.py) under the default policy: every task that
ends is replaced at once by a new one, so the active count (queued, generating, or suspended
while its robot executes a segment) stays at `active`. Robots report each segment at the end
the scheduler estimated for it. After a warm-up (`warmup_s` virtual seconds, so that the population is a
mix of queued, running and suspended tasks), `ticks` passes are timed:

- planner time = wall time of `tick()` (admission and output handling) and of the robots'
  reports handled since the previous pass, minus the wall time of the engine's own `step()`
  (the simulated engines' arithmetic, which a real deployment does on the GPU servers);
- the engine's step = the virtual duration of the released replica step, as the profile
  predicts it.

A fleet of R replicas releases R steps per step time, and the planner makes one pass per
released step, so one planner keeps up while R x (planner time per pass) < step time: the
largest R is step time / pass time ("R (pass/step)"). A planner that takes every replica's
outputs of a step in one pass (as `ReplicaEngine` does with real servers) pays the pass's fixed
part (admission, reports) once per step time and its per-output part R times: a least-squares
fit of pass time against outputs handled gives both, and "R (batched)" = (step - fixed) /
(per output x outputs per replica step). Wall times on a shared machine: noise only adds, so
the figures are upper bounds. No assertion: a benchmark.
"""

from __future__ import annotations

import dataclasses
import heapq
import statistics
import time
from pathlib import Path

import numpy as np
from typing import Sequence

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.engine.sim.fleet import SimulatedFleet
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.registry import DEFAULT_POLICY, get_policy
from timelyllm_ros.core.sched.interface import SegmentDispatch
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.core.skills.skillset import load_skillsets
from timelyllm_ros.core.task import TaskSnapshot, TaskSpec
from timelyllm_ros.core.tuf import default_config_dir, load_tuf_levels
from timelyllm_ros.lrtrace.traces import load_traces

DRONE_TRACES = range(1, 9)   # WID1's traces: 1-5 normal, 6-8 urgent
LATENCY_S = 0.008


class _TimedFleet(SimulatedFleet):
    """The fleet, with the wall time its engines spend in `step()` counted, and the outputs
    of the last step."""

    engine_wall_s = 0.0
    last_outputs = 0

    def step(self):
        start = time.perf_counter()
        try:
            outputs = super().step()
            self.last_outputs = len(outputs)
            return outputs
        finally:
            self.engine_wall_s += time.perf_counter() - start


class _Robots:
    """Each task's robot reports every segment when the scheduler expects it done."""

    def __init__(self):
        self.reports: list[tuple[float, int, str, int, float]] = []
        self.ended: list[str] = []
        self._n = 0

    def on_segment(self, d: SegmentDispatch) -> None:
        self._n += 1
        start = d.dispatched_s + LATENCY_S
        heapq.heappush(self.reports, (d.estimated_done_s + LATENCY_S, self._n, d.task_id,
                                      d.sequence, start))

    def on_status(self, snapshot: TaskSnapshot) -> None:
        if snapshot.is_terminal:
            self.ended.append(snapshot.task_id)


@dataclasses.dataclass
class CostPoint:
    active: int
    replicas: int
    pass_ms: float          # mean planner time per pass (what a sustained rate depends on)
    pass_p50_ms: float
    pass_p90_ms: float
    fixed_ms: float         # least-squares fit: pass time = fixed + per_output x outputs
    per_output_us: float
    outputs_per_pass: float
    step_ms: float          # mean virtual duration of a replica step
    queued: int
    running: int
    suspended: int

    @property
    def max_replicas(self) -> float:
        """Replicas one planner keeps up with when it makes one pass per replica step (the
        simulated fleet's way): step time / planner time per pass."""
        return self.step_ms / self.pass_ms if self.pass_ms > 0 else float("inf")

    @property
    def max_replicas_batched(self) -> float:
        """Replicas one planner keeps up with when one pass takes every replica's outputs of
        a step together (`ReplicaEngine` polling its servers): the fixed part is paid once per
        step time, the per-output part R times."""
        per_replica = self.per_output_us * 1e-3 * self.outputs_per_pass
        left = self.step_ms - self.fixed_ms
        if left <= 0:
            return 0.0
        return left / per_replica if per_replica > 0 else float("inf")


def measure(profile: EngineProfile, active: int, replicas: int, ticks: int = 200,
            warmup_s: float = 5.0, seed: int = 0) -> CostPoint:
    config_dir = default_config_dir()
    skill_sets = {n: dataclasses.replace(s, observations=False)
                  for n, s in load_skillsets(config_dir / "skillsets").items() if n == "drone"}
    levels = load_tuf_levels(config_dir / "tuf_levels.yaml")
    traces = load_traces()
    fleet = _TimedFleet(lambda _i: SimulatedEngine(profile), replicas)
    robots = _Robots()
    scheduler = SegmentScheduler(
        fleet, get_policy(DEFAULT_POLICY), skill_sets,
        ExecutionTimeModel.from_yaml(config_dir / "exec_model.yaml"), robots,
        SchedulerConfig(network_latency_s=LATENCY_S))
    scheduler.warm_prefix_cache()
    submitted = 0

    def submit() -> None:
        nonlocal submitted
        trace = traces[DRONE_TRACES[(submitted * 7 + seed) % len(DRONE_TRACES)]]
        tid = f"t{submitted:06d}"
        scheduler.submit(TaskSpec(tid, f"robot_{tid}", trace.skill_set, trace.instruction,
                                  levels.get(trace.tuf_level), fleet.now(), trace.tuf_level,
                                  scripted_plan=trace.plan))
        submitted += 1

    for _ in range(active):
        submit()
    pass_s: list[float] = []
    outputs: list[int] = []
    steps: list[float] = []
    start_s = fleet.now()
    while len(pass_s) < ticks:
        begin = time.perf_counter()
        engine_before = fleet.engine_wall_s
        while robots.reports and robots.reports[0][0] <= fleet.now():
            at, _, tid, seq, start = heapq.heappop(robots.reports)
            scheduler.on_report(tid, seq, start, at, True)
        worked = scheduler.tick()
        elapsed = time.perf_counter() - begin - (fleet.engine_wall_s - engine_before)
        for _ in robots.ended:
            submit()
        robots.ended.clear()
        if not worked:
            nxt = robots.reports[0][0] if robots.reports else fleet.now() + 1e-3
            fleet.advance_idle(max(nxt, fleet.now() + 1e-6))
            continue
        if fleet.now() - start_s >= warmup_s:
            pass_s.append(elapsed)
            outputs.append(fleet.last_outputs)
            steps.append(fleet.last_step_timing().duration_s)
    running = len(scheduler.running_request_ids())
    queued = scheduler.queue_length()
    live = len(scheduler.active_tasks())
    quantiles = statistics.quantiles(pass_s, n=10) if len(pass_s) >= 2 else [pass_s[0]] * 9
    slope, intercept = (np.polyfit(outputs, pass_s, 1) if len(set(outputs)) > 1
                        else (0.0, statistics.mean(pass_s)))
    return CostPoint(active, replicas, statistics.mean(pass_s) * 1e3,
                     statistics.median(pass_s) * 1e3, quantiles[8] * 1e3,
                     max(0.0, float(intercept)) * 1e3, max(0.0, float(slope)) * 1e6,
                     statistics.mean(outputs),
                     statistics.mean(steps) * 1e3, queued, running,
                     max(0, live - queued - running))


def run_planner_cost(profile_path: str | Path, actives: Sequence[int], replicas: int,
                     ticks: int, warmup_s: float = 5.0) -> int:
    profile = EngineProfile.from_yaml(profile_path)
    print(f"planner cost per pass, policy {DEFAULT_POLICY}, {replicas} replicas of "
          f"{profile.name}; {ticks} passes timed per point after {warmup_s:g} s of warm-up", flush=True)
    head = (f"{'active':>7} {'queued':>7} {'running':>7} {'suspended':>9} {'mean ms':>8} "
            f"{'p50 ms':>7} {'p90 ms':>7} {'fixed ms':>8} {'us/out':>7} {'out/pass':>8} "
            f"{'step ms':>8} {'R (pass/step)':>13} {'R (batched)':>11}")
    print(head)
    print("-" * len(head))
    for active in actives:
        p = measure(profile, active, replicas, ticks, warmup_s)
        print(f"{p.active:>7} {p.queued:>7} {p.running:>7} {p.suspended:>9} {p.pass_ms:>8.2f} "
              f"{p.pass_p50_ms:>7.2f} {p.pass_p90_ms:>7.2f} {p.fixed_ms:>8.2f} "
              f"{p.per_output_us:>7.1f} {p.outputs_per_pass:>8.1f} {p.step_ms:>8.2f} "
              f"{p.max_replicas:>13.1f} {p.max_replicas_batched:>11.1f}", flush=True)
    return 0
