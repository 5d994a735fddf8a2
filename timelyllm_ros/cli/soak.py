"""`timelyllm soak`: a fleet of simulated robots against the planner over ROS, for minutes.

    timelyllm soak --robots 200 --duration-s 600 --out docs/soak     (what `make soak` runs)

Prints one progress line every 10 s (a terminal gets it redrawn in place), then the figures and
whether each target passed; writes soak.json, soak.md and soak.png to --out. Exit status 1 when
a target fails, 2 on bad arguments or nodes that do not come up. See experiments/soak.py.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="timelyllm soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--robots", type=int, default=200, help="fleet size (default 200)")
    ap.add_argument("--arm-share", type=float, default=0.25, help="share of arms (default 0.25)")
    ap.add_argument("--duration-s", type=float, default=600.0,
                    help="seconds of load, before the drain (default 600)")
    ap.add_argument("--think-s", type=float, default=10.0,
                    help="mean pause of a robot between its tasks (default 10)")
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="robot seconds slept per modelled second (default 1: real time)")
    ap.add_argument("--warmup-s", type=float, default=None,
                    help="RSS growth is measured after this (default: a fifth, at most 120 s)")
    ap.add_argument("--policy", default="", help="planner policy (default: the planner's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("out/soak"),
                    help="directory for soak.json, soak.md, soak.png (default out/soak)")
    ap.add_argument("--log-dir", type=Path, default=None,
                    help="node logs (default: a temporary directory, printed)")
    args = ap.parse_args(argv)

    from timelyllm_ros.experiments.soak import SoakConfig, run_soak
    from timelyllm_ros.experiments.soak_report import write

    try:
        config = SoakConfig(robots=args.robots, arm_share=args.arm_share,
                            duration_s=args.duration_s, think_s=args.think_s,
                            time_scale=args.time_scale, warmup_s=args.warmup_s,
                            policy=args.policy, seed=args.seed, log_dir=args.log_dir)
    except ValueError as err:
        print(f"timelyllm soak: {err}", file=sys.stderr)
        return 2
    every = 10.0
    last = {"t": -every}

    def progress(phase: str, s) -> None:
        if phase == "load" and s.t - last["t"] < every:
            return
        last["t"] = s.t
        step = "-" if math.isnan(s.fetch_overhead_ms) else f"{s.fetch_overhead_ms:.2f} ms"
        print(f"[soak {phase:5}] t={s.t:6.0f} s  tasks {s.terminal}/{s.submitted} ended  "
              f"active {s.active_tasks:4}  queued {s.queued:4}  KV used {s.kv_used:5}  "
              f"planner RSS {s.planner_rss_mb:6.1f} MB  scheduler {step}", flush=True)

    print(f"soak: {config.robots} robots for {config.duration_s:.0f} s "
          f"(starting the planner and the fleet simulator ...)", flush=True)
    try:
        result = run_soak(config, progress)
    except RuntimeError as err:
        print(f"timelyllm soak: {err}", file=sys.stderr)
        return 2
    command = "timelyllm soak " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    summary = write(result, args.out, command)
    print((args.out / "soak.md").read_text())
    print(f"wrote {args.out}/soak.json, soak.md, soak.png")
    return 0 if all(summary["verdicts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
