"""Fleet scale, simulated: how many robots N replicas serve with at most 5 % of urgent tasks
late (`timelyllm fleet`, docs/fleet-scale.md).

The workload grows with the fleet: every robot issues tasks at the base workload's rate per
robot (events/s x mean tasks per event / robots), so `robots` robots are the base workload
with `agents = robots` and its event rate scaled by robots / base agents (same seed, same
tasks per event, same traces). Each probe replays it under one policy on `replicas` simulated
engines in parallel (core/engine/sim/fleet.py) behind the replica router's placement.

An urgent task is late when its first segment reached its robot after its expected response
time (ERT), or never (rejected, shed, failed): the planner's own definition of a miss
(bench/metrics.py), with tasks that got no response counted as missed rather than left out.

The search, per replica count: probe a first guess, step up or down by a factor (x2 for one
replica; for R replicas, whose guess is R times one replica's answer, by 1 + `tolerance`) until
the answer is bracketed, then bisect until the bracket is within `tolerance`; the largest fleet
that passed is the answer. One seed: a single replay per probe, so a result near the threshold can
move by a step of the bracket with another seed (the page says so).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.results import RunResult
from timelyllm_ros.lrtrace.workload import Workload, compose

# The issue's service level: at most this share of urgent tasks late.
URGENT_LATE_LIMIT = 0.05


def per_robot_task_rate(workload: Workload) -> float:
    """Tasks per second one robot of `workload` issues (tasks per event are uniform in
    1..max_tpe)."""
    return workload.eps * (1 + workload.max_tpe) / 2 / workload.agents


def single_task_events(base: Workload, tasks_per_event: int) -> Workload:
    """`base` with at most `tasks_per_event` tasks per event and the event rate raised to keep
    each robot's task rate (bursts of simultaneous tasks are the workload's, not the fleet's)."""
    if tasks_per_event < 1:
        raise ValueError(f"tasks_per_event: must be >= 1, got {tasks_per_event}")
    return replace(base, max_tpe=tasks_per_event,
                   eps=base.eps * (1 + base.max_tpe) / (1 + tasks_per_event))


def fleet_workload(base: Workload, robots: int, duration_s: float) -> Workload:
    """`base` with `robots` robots, each issuing tasks at the base rate per robot."""
    if robots < base.max_tpe:
        raise ValueError(f"robots: {robots} is fewer than the {base.max_tpe} robots one event "
                         f"of {base.name} may start")
    if base.streams:
        raise ValueError(f"workload {base.name}: a mixed workload has no single robot count to "
                         "scale (use a one-stream robot workload such as WID1)")
    return replace(base, agents=int(robots), eps=base.eps * robots / base.agents,
                   duration_s=float(duration_s),
                   name=f"{base.name}-{robots}robots")


@dataclass(frozen=True)
class Probe:
    replicas: int
    robots: int
    tasks: int
    urgent: int
    urgent_late: int
    response_p99_s: float
    wall_s: float
    clock_s: float
    duration_s: float   # of arrivals

    @property
    def urgent_late_share(self) -> float:
        return self.urgent_late / self.urgent if self.urgent else 0.0

    @property
    def passed(self) -> bool:
        return self.urgent_late_share <= URGENT_LATE_LIMIT


def urgent_late(run: RunResult) -> tuple[int, int]:
    """(urgent tasks, of which late: first segment after the ERT or none at all)."""
    urgent = [t for t in run.tasks if t.tuf_level == "urgent"]
    late = sum(1 for t in urgent
               if not math.isfinite(t.response_time_s) or t.response_time_s > t.ert_s)
    return len(urgent), late


def probe(base: Workload, robots: int, replicas: int, policy: str, config: BenchConfig,
          duration_s: float, **run_kwargs) -> Probe:
    workload = fleet_workload(base, robots, duration_s)
    events = compose(workload)
    start = time.perf_counter()
    run = run_policy(events, policy, workload, replace(config, replicas=replicas), **run_kwargs)
    urgent, late = urgent_late(run)
    responses = sorted(t.response_time_s for t in run.tasks)
    p99 = responses[min(len(responses) - 1, int(0.99 * len(responses)))] if responses else math.nan
    return Probe(replicas, robots, len(run.tasks), urgent, late, p99,
                 time.perf_counter() - start, run.clock_s, workload.duration_s)


@dataclass
class Search:
    replicas: int
    probes: list[Probe]

    @property
    def best(self) -> Probe | None:
        passed = [p for p in self.probes if p.passed]
        return max(passed, key=lambda p: p.robots) if passed else None

    @property
    def first_failure(self) -> Probe | None:
        """The smallest fleet that failed above the best one (the bracket's top)."""
        best = self.best
        above = [p for p in self.probes if not p.passed
                 and (best is None or p.robots > best.robots)]
        return min(above, key=lambda p: p.robots) if above else None


def largest_fleet(run_probe: Callable[[int], Probe], guess: int, *, minimum: int,
                  tolerance: float = 0.1, max_probes: int = 12, factor: float = 2.0,
                  announce: Callable[[Probe], None] | None = None) -> list[Probe]:
    """Probes, in order, of the search for the largest robot count that passes (module
    docstring): bracket by multiplying or dividing by `factor`, then bisect. `minimum`: the
    fewest robots the workload allows."""
    if not (guess >= minimum and tolerance > 0 and factor > 1):
        raise ValueError(f"guess {guess} must be >= minimum {minimum}, tolerance > 0, "
                         f"factor > 1 (got {tolerance}, {factor})")
    probes: list[Probe] = []

    def run(robots: int) -> Probe:
        p = run_probe(robots)
        probes.append(p)
        if announce is not None:
            announce(p)
        return p

    lo: int | None = None   # largest that passed
    hi: int | None = None   # smallest that failed
    first = run(guess)
    if first.passed:
        lo = guess
        while hi is None and len(probes) < max_probes:
            nxt = max(lo + 1, round(lo * factor))
            if run(nxt).passed:
                lo = nxt
            else:
                hi = nxt
    else:
        hi = guess
        while lo is None and len(probes) < max_probes:
            nxt = max(minimum, min(hi - 1, round(hi / factor)))
            if run(nxt).passed:
                lo = nxt
            elif nxt == minimum:
                return probes  # not even the smallest fleet passes
            else:
                hi = nxt
    while (lo is not None and hi is not None and hi > lo * (1 + tolerance) and hi - lo > 1
           and len(probes) < max_probes):
        mid = (lo + hi) // 2
        if run(mid).passed:
            lo = mid
        else:
            hi = mid
    return probes


def scaling_rows(searches: Mapping[int, Search], one_replica: int | None = None
                 ) -> list[dict[str, float | int | None]]:
    """Per replica count: largest fleet, robots per replica, and the scaling efficiency
    (robots per replica against one replica's: the search's for 1 replica, else
    `one_replica`)."""
    one = searches.get(1)
    base = one.best.robots if one is not None and one.best is not None else one_replica
    rows = []
    for replicas, search in sorted(searches.items()):
        best = search.best
        robots = best.robots if best is not None else None
        fail = search.first_failure
        rows.append({
            "replicas": replicas, "robots": robots,
            "failed_at": fail.robots if fail is not None else None,
            "robots_per_replica": robots / replicas if robots is not None else None,
            "efficiency": (robots / (replicas * base)) if robots and base else None,
            "tasks_per_s": (best.tasks / best.duration_s) if best is not None else None,
            "urgent_late_share": best.urgent_late_share if best is not None else None,
            "probes": len(search.probes),
            "wall_s": sum(p.wall_s for p in search.probes)})
    return rows


def format_rows(policy: str, rows: Sequence[Mapping]) -> str:
    head = (f"{'policy':<14} {'replicas':>8} {'robots':>7} {'failed at':>9} {'per replica':>11} "
            f"{'efficiency':>10} {'tasks/s':>8} {'urgent late':>11} {'probes':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        def cell(key, fmt):
            v = r[key]
            return "-" if v is None else format(v, fmt)
        lines.append(f"{policy:<14} {r['replicas']:>8} {cell('robots', 'd'):>7} "
                     f"{cell('failed_at', 'd'):>9} {cell('robots_per_replica', '.0f'):>11} "
                     f"{cell('efficiency', '.2f'):>10} {cell('tasks_per_s', '.1f'):>8} "
                     f"{cell('urgent_late_share', '.1%'):>11} {r['probes']:>6}")
    return "\n".join(lines)
