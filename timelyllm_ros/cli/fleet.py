"""`timelyllm fleet`: how many robots N simulated replicas serve (docs/fleet-scale.md).

    timelyllm fleet [--workload WID1] [--profile config/engine_profiles/llama3-8b-h100.yaml] \\
        [--replicas 1,8,32] [--policies timelyllm-wc,vllm-stream] [--duration-s 60] \\
        [--guess 400] [--tolerance 0.1] [--max-probes 8] [--fleet-probes 3] \
        [--per-replica N] [--robots N] [--tasks-per-event K] [--json FILE]
    timelyllm fleet --planner-cost [--active 1000,5000,20000] [--replicas 32] [--ticks 200] \
        [--warmup-s 5]

For each replica count, the largest fleet (robots, each issuing tasks at the workload's rate per
robot) with at most 5 % of urgent tasks late: probe, bracket by doubling or halving, bisect. One
replica starts at `--guess` and brackets by doubling or halving; R replicas start at R times
what one replica served and step by 1 + `--tolerance`. `--robots N`
probes that fleet only (R x N robots on R replicas). `--planner-cost` measures the scheduler's
own time per pass instead (bench/planner_cost.py). Exit status 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.fleet_scale import (Probe, Search, URGENT_LATE_LIMIT, format_rows,
                                             largest_fleet, per_robot_task_rate, probe,
                                             scaling_rows, single_task_events)
from timelyllm_ros.bench.policies import PolicyListError, parse_policy_list
from timelyllm_ros.bench.workloads import WorkloadSourceError, load_bench_workload
from timelyllm_ros.core.engine.cost_model import EngineProfile, EngineProfileError
from timelyllm_ros.core.policies.registry import DEFAULT_POLICY
from timelyllm_ros.core.tuf import default_config_dir

DEFAULT_PROFILE = default_config_dir() / "engine_profiles" / "llama3-8b-h100.yaml"


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="timelyllm fleet", description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="WID1",
                   help="a one-stream robot workload whose robot count is scaled (default WID1)")
    p.add_argument("--profile", default=str(DEFAULT_PROFILE),
                   help="engine profile of one replica (default: Llama-3-8B on one H100)")
    p.add_argument("--replicas", type=_ints, default=[1, 8, 32], metavar="1,8,32")
    p.add_argument("--policies", default=f"{DEFAULT_POLICY},vllm-stream")
    p.add_argument("--tasks-per-event", type=int, default=None, metavar="K",
                   help="at most K simultaneous tasks per event (rate per robot kept)")
    p.add_argument("--duration-s", type=float, default=60.0,
                   help="virtual seconds of arrivals per probe (default 60)")
    p.add_argument("--guess", type=int, default=400, help="first fleet probed on one replica")
    p.add_argument("--tolerance", type=float, default=0.1,
                   help="stop bisecting when the bracket is within this share (default 0.1)")
    p.add_argument("--max-probes", type=int, default=8,
                   help="most probes of the one-replica search (default 8)")
    p.add_argument("--fleet-probes", type=int, default=3,
                   help="most probes of each search with several replicas (default 3: a probe "
                        "of 32 replicas replays ~100,000 tasks)")
    p.add_argument("--per-replica", type=int, default=None, metavar="N",
                   help="what one replica serves, from an earlier search: R replicas start at "
                        "R x N (without it, from the one-replica search of this run)")
    p.add_argument("--robots", type=int, default=None, metavar="N",
                   help="probe N robots per replica only (no search)")
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    p.add_argument("--planner-cost", action="store_true",
                   help="measure the planner's own time per scheduling pass instead")
    p.add_argument("--active", type=_ints, default=[1000, 5000, 20000], metavar="1000,5000",
                   help="--planner-cost: active task counts (default 1000,5000,20000)")
    p.add_argument("--ticks", type=int, default=200,
                   help="--planner-cost: scheduling passes timed per point (default 200)")
    p.add_argument("--warmup-s", type=float, default=5.0,
                   help="--planner-cost: virtual seconds before the timing starts (default 5)")
    return p


def _announce(policy: str):
    def say(p: Probe) -> None:
        verdict = "ok" if p.passed else "LATE"
        print(f"  {policy} x{p.replicas}: {p.robots} robots, {p.tasks} tasks, urgent late "
              f"{p.urgent_late}/{p.urgent} = {p.urgent_late_share:.1%} {verdict} "
              f"(replay {p.wall_s:.0f} s)", flush=True)
    return say


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.planner_cost:
        from timelyllm_ros.bench.planner_cost import run_planner_cost
        return run_planner_cost(args.profile, args.active, max(args.replicas), args.ticks,
                                args.warmup_s)
    try:
        policies = parse_policy_list(args.policies)
        profile = EngineProfile.from_yaml(args.profile)
        base, _events, run_kwargs = load_bench_workload(args.workload, None, None)
    except (PolicyListError, EngineProfileError, WorkloadSourceError) as exc:
        print(f"timelyllm fleet: error: {exc}", file=sys.stderr)
        return 2
    if run_kwargs or not base.eps > 0 or base.streams:
        print(f"timelyllm fleet: error: --workload {args.workload}: needs a one-stream workload "
              "with an event rate (a preset or workload file such as WID1), whose robots can be "
              "scaled", file=sys.stderr)
        return 2
    if args.tasks_per_event is not None:
        base = single_task_events(base, args.tasks_per_event)
    config = BenchConfig(profile=profile)
    rate = per_robot_task_rate(base)
    print(f"workload {base.name}: {rate * 60:.2f} tasks per robot per minute, "
          f"{args.duration_s:.0f} s of arrivals per probe; profile {profile.name} per replica; "
          f"urgent late limit {URGENT_LATE_LIMIT:.0%}", flush=True)
    report: dict = {"workload": base.name, "profile": profile.name,
                    "duration_s": args.duration_s, "tasks_per_robot_per_s": rate,
                    "urgent_late_limit": URGENT_LATE_LIMIT, "policies": {}}
    for policy in policies:
        searches: dict[int, Search] = {}
        say = _announce(policy)
        one_replica: int | None = args.per_replica
        for replicas in args.replicas:
            def run_probe(robots: int, replicas=replicas, policy=policy) -> Probe:
                return probe(base, robots, replicas, policy, config, args.duration_s)
            if args.robots is not None:
                probes = [run_probe(args.robots * replicas)]
                say(probes[0])
            else:
                scaled = one_replica is not None
                per_replica = one_replica if scaled else args.guess
                probes = largest_fleet(
                    run_probe, per_replica * replicas, minimum=base.max_tpe,
                    tolerance=args.tolerance,
                    max_probes=args.fleet_probes if scaled else args.max_probes,
                    factor=1 + args.tolerance if scaled else 2.0, announce=say)
            searches[replicas] = Search(replicas, probes)
            best = searches[replicas].best
            if replicas == 1 and best is not None and args.per_replica is None:
                one_replica = best.robots
            elif one_replica is None and best is not None:
                one_replica = max(base.max_tpe, best.robots // replicas)
        rows = scaling_rows(searches, args.per_replica)
        print(format_rows(policy, rows), flush=True)
        report["policies"][policy] = {
            "rows": rows,
            "probes": {r: [vars(p) | {"urgent_late_share": p.urgent_late_share}
                           for p in s.probes] for r, s in searches.items()}}
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0
