"""Deep overload: does every policy drain a backlog, and does the planner come back to idle?

    python -m timelyllm_ros.bench.overload [--workload FILE|PRESET] [--policies P,Q,...]
                                           [--duration-s S] [--robots queue|parallel]

Replays a workload (default: issue 20's mixed drone and arm fleet at about twice the simulated
engine's capacity, `DEEP_OVERLOAD`) on the simulated engine under each policy (default: every
registered one) and prints one row per policy, as each run ends:

- the backlog the planner held at the last arrival (segments not yet generated), how fast it
  generated segments while loaded, and how long after the last arrival its own work
  ended (`plan drain`) against what that backlog at that rate predicts (`ratio`);
- how long after the last arrival every task was terminal (`all terminal`): robots included,
  which execute their tasks one at a time, so it is at least the busiest robot's queued work;
- tasks by how they ended, how many of them were told (a terminal status reached the listener),
  and whether queue, running generations, engine requests, parked generations and KV blocks
  were back to zero at the end (`idle`).

docs/overload.md explains the figures and what graceful degradation means here.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from timelyllm_ros.bench.config import ROBOT_MODES, BenchConfig
from timelyllm_ros.bench.policies import PolicyListError, parse_policy_list
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.results import RunResult
from timelyllm_ros.bench.workloads import load_workload_events, shorten
from timelyllm_ros.core.policies.registry import policy_names
from timelyllm_ros.lrtrace.workload import Event, Workload, compose, workload_from_dict

# Issue 20's workload, as the issue gives it: traces 1-11 (normal and urgent drone tasks, arm
# tasks) at 13 events/s of up to 10 tasks each on 40 robots for 180 s.
DEEP_OVERLOAD = {
    "name": "deep-overload", "eps": 13.0, "max_tpe": 10,
    "traces": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], "agents": 40, "duration_s": 180,
    "seed": 3, "network_latency_s": 0.008,
    "description": "issue 20: mixed drone and arm fleet at about twice the engine's capacity",
}

# The loaded rate is measured over the second half of the arrivals: by then the backlog has
# built up, and the first half's ramp (an empty queue at the start) would flatter it.
LOADED_WINDOW = 0.5

SHED_PREFIX = "overload: shed"  # reason of a task the scheduler shed (admission_step.py)


@dataclass
class DrainRow:
    policy: str
    tasks: int
    last_arrival_s: float
    backlog: int             # segments not yet dispatched at the last arrival (_work_done_at)
    loaded_rate: float       # segments dispatched per second while loaded
    plan_drain_s: float      # last arrival -> the last engine step
    all_terminal_s: float    # last arrival -> every task terminal
    busiest_robot_s: float   # the most execution any one robot was given
    states: dict[str, int] = field(default_factory=dict)
    told: int = 0
    end_state: dict[str, int] = field(default_factory=dict)
    wall_s: float = math.nan

    @property
    def predicted_drain_s(self) -> float:
        """The backlog worked off at the loaded rate."""
        return self.backlog / self.loaded_rate if self.loaded_rate > 0 else math.inf

    @property
    def ratio(self) -> float:
        """Plan drain over its prediction: about 1 when the backlog drains as fast as the loaded
        planner worked; far above 1 when draining slows down (or never ends)."""
        predicted = self.predicted_drain_s
        return self.plan_drain_s / predicted if predicted > 0 else math.nan

    @property
    def idle(self) -> bool:
        return bool(self.end_state) and not any(self.end_state.values())


def drain_row(result: RunResult) -> DrainRow:
    """A run's drain figures (module docstring); the run must come from `bench.replay`."""
    last = result.last_arrival_s
    tasks = result.tasks
    start = last * (1.0 - LOADED_WINDOW)
    window = last - start
    backlog = served = 0
    for at in _work_done_at(tasks):
        backlog += at > last
        served += start < at <= last
    robot_work = Counter()
    for t in tasks:
        if math.isfinite(t.execution_s):
            robot_work[t.robot_id] += t.execution_s
    states = Counter(t.state for t in tasks)
    shed = sum(1 for t in tasks if t.state == "rejected" and t.reason.startswith(SHED_PREFIX))
    if shed:
        states["rejected"] -= shed
        states["shed"] = shed
    return DrainRow(
        policy=result.policy, tasks=len(tasks), last_arrival_s=last, backlog=backlog,
        loaded_rate=served / window if window > 0 else math.nan,
        plan_drain_s=max(0.0, result.last_step_s - last),
        all_terminal_s=result.clock_s - last,
        busiest_robot_s=max(robot_work.values(), default=0.0),
        states={k: v for k, v in sorted(states.items()) if v}, told=result.told,
        end_state=dict(result.end_state), wall_s=result.wall_s)


def _work_done_at(tasks) -> list[float]:
    """When each unit of the planner's work was done: one per segment dispatched (a task's
    plan is its segments' worth of work, generated one after another), plus, for a task that
    ended before its plan was complete (shed, failed), one at its end (it left the backlog).
    A segment, not a task, is the unit: a segmented policy that has started many plans and
    finished few is still working."""
    out = []
    for t in tasks:
        out.extend(s.dispatched_s for s in t.segments)
        if t.state != "done" or not t.segments:
            if math.isfinite(t.planned_s):
                out.append(t.planned_s)
    return out


def deep_overload(duration_s: float | None = None) -> tuple[Workload, list[Event]]:
    workload = shorten(workload_from_dict(DEEP_OVERLOAD, origin="DEEP_OVERLOAD"), duration_s)
    return workload, compose(workload)


def run(events: Sequence[Event], workload: Workload, policies: Sequence[str],
        config: BenchConfig, on_row: Callable[[DrainRow], None] | None = None) -> list[DrainRow]:
    rows = []
    for policy in policies:
        row = drain_row(run_policy(events, policy, workload, config))
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


HEADER = ("| policy | tasks | backlog (segments) | loaded segments/s | plan drain s "
          "(predicted) | ratio | all terminal s | busiest robot s | ended | told | idle | "
          "wall s |\n|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|")


def format_row(row: DrainRow) -> str:
    ended = ", ".join(f"{k} {v}" for k, v in row.states.items())
    held = "yes" if row.idle else ", ".join(f"{k} {v}" for k, v in row.end_state.items() if v)
    return (f"| {row.policy} | {row.tasks} | {row.backlog} | {row.loaded_rate:.1f} | "
            f"{row.plan_drain_s:.1f} ({row.predicted_drain_s:.1f}) | {row.ratio:.2f} | "
            f"{row.all_terminal_s:.1f} | {row.busiest_robot_s:.1f} | {ended} | "
            f"{row.told}/{row.tasks} | {held} | {row.wall_s:.0f} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m timelyllm_ros.bench.overload",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default=None,
                        help="preset or workload file (default: issue 20's deep overload)")
    parser.add_argument("--policies", default=None,
                        help="comma-separated (default: every registered policy)")
    parser.add_argument("--duration-s", type=float, default=None,
                        help="replay only the first S seconds of arrivals")
    parser.add_argument("--robots", choices=ROBOT_MODES, default="queue",
                        help="queue (default): a robot runs its tasks one at a time; parallel: "
                             "every task its own robot")
    args = parser.parse_args(argv)
    try:
        policies = parse_policy_list(args.policies) if args.policies else policy_names()
    except PolicyListError as exc:
        parser.error(f"--policies: {exc}")
    if args.duration_s is not None and not args.duration_s > 0:
        parser.error("--duration-s: must be > 0")
    if args.workload is None:
        workload, events = deep_overload(args.duration_s)
    else:
        workload, events = load_workload_events(args.workload, None, args.duration_s)
    started = time.perf_counter()
    print(f"workload {workload.name}: {sum(len(e.tasks) for e in events)} tasks in "
          f"{len(events)} events over {workload.duration_s:g} s on {workload.agents} robots; "
          f"robots {args.robots}; simulated engine, bench defaults\n", flush=True)
    print(HEADER, flush=True)
    rows = run(events, workload, policies, BenchConfig(robots=args.robots),
               on_row=lambda row: print(format_row(row), flush=True))
    print(f"\n{len(rows)} policies in {time.perf_counter() - started:.0f} s wall", flush=True)
    return 0 if all(r.idle and r.told == r.tasks for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
