"""`timelyllm lrtrace replay EVENTS|WORKLOAD|WID1 ...`: the arguments of the replay over ROS,
the checks of the ones that cannot go together, and the hand-over to
`experiments.replay.run_replay`, imported only when the replay runs.

Separate from `cli/lrtrace.py` (the offline data commands: record, info, table, fit, compose)
because the replay drives the planner and robots over ROS and has options and checks of its own
(planner settings, --attach), reported without the usage line.
"""

from __future__ import annotations

import argparse
import math
import sys

HELP = "replay an event list against the planner"
REPLAY_PROG = "timelyllm lrtrace replay"
DEFAULT_REPLAY_POLICY = "timelyllm"


class _Usage(Exception):
    """Bad arguments found after parsing: exit status 2."""


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", help="event list YAML (with `events:`, see `lrtrace compose`), "
                   "workload YAML, or preset name (WID1, WID2, WID3)")
    p.add_argument("--policy", default=None,
                   help=f"planner scheduling policy (default {DEFAULT_REPLAY_POLICY}; not with "
                        "--attach)")
    p.add_argument("--engine", choices=("sim", "vllm"), default=None,
                   help="planner engine: sim = the calibrated cost-model engine paced to the wall "
                        "clock, generating each trace's plan (default); vllm = the real engine")
    p.add_argument("--model", default=None,
                   help="--engine vllm: local model directory (default: the bundled model)")
    p.add_argument("--profile", default=None,
                   help="--engine sim: engine profile YAML (default: the planner's, "
                        "Llama3-8B on an RTX 4090)")
    p.add_argument("--attach", action="store_true",
                   help="use the planner already running in this ROS domain instead of starting one")
    p.add_argument("--no-robots", action="store_true",
                   help="with --attach: start no executors (the robots are already running)")
    p.add_argument("--exec-model", default=None, metavar="model.yaml",
                   help="execution-time model for the simulated robots and the planner (e.g. one "
                        "written by `lrtrace fit`; default config/exec_model.yaml); with "
                        "--durations-from, the fallback for segments never recorded")
    p.add_argument("--durations-from", default=None, metavar="run.mcap|table.csv",
                   help="robots replay the exact durations recorded in this bag or timing table "
                        "(executor backend `replay`)")
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE",
                   help="write the metrics as JSON (the schema of `timelyllm bench --json`, plus "
                        "a `replay` block)")
    p.add_argument("--record", default=None, metavar="out.mcap",
                   help="keep the recorded bag (out.mcap -> directory out/); by default it is "
                        "recorded to a temporary directory and removed after the metrics")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="S",
                   help="scale robot execution times by S (executor time_scale; default 1); "
                        "the arrival schedule is not scaled")
    p.add_argument("--duration-s", type=float, default=None, metavar="S",
                   help="replay only the events of the first S seconds")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of event composition (workloads) and of the simulated robots "
                        "(default: the workload's)")
    p.add_argument("--startup-timeout", type=float, default=None, metavar="S",
                   help="how long to wait for the nodes (default 180 s; 900 s with --engine vllm)")
    p.add_argument("--task-timeout", type=float, default=600.0, metavar="S",
                   help="after the last goal, how long to wait for every task to end (default 600)")
    p.add_argument("--log-dir", default=None, metavar="DIR",
                   help="keep every node's output here (default: a temporary directory, kept "
                        "only if the replay fails)")
    p.add_argument("--echo", action="store_true", help="echo the nodes' output on stderr")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")


def _replay_warning(text: str) -> None:
    print(f"{REPLAY_PROG}: warning: {text}", file=sys.stderr, flush=True)


def _check_replay_args(args: argparse.Namespace) -> None:
    """Raises _Usage for arguments that cannot go together; warns about ignored ones."""
    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise _Usage(f"--time-scale: must be > 0, got {args.time_scale}")
    if args.duration_s is not None and not (math.isfinite(args.duration_s) and args.duration_s > 0):
        raise _Usage(f"--duration-s: must be > 0, got {args.duration_s}")
    if args.seed is not None and args.seed < 0:
        raise _Usage(f"--seed: must be >= 0, got {args.seed}")
    if not args.task_timeout > 0:
        raise _Usage(f"--task-timeout: must be > 0, got {args.task_timeout}")
    if args.startup_timeout is not None and not args.startup_timeout > 0:
        raise _Usage(f"--startup-timeout: must be > 0, got {args.startup_timeout}")
    if args.no_robots and not args.attach:
        raise _Usage("--no-robots: only with --attach (without it the replay starts the robots)")
    if args.attach:
        planner_settings = {"--policy": args.policy, "--engine": args.engine,
                            "--model": args.model, "--profile": args.profile}
        ignored = [flag for flag, value in planner_settings.items() if value is not None]
        if ignored:
            _replay_warning(f"{', '.join(ignored)} ignored with --attach (the running planner's "
                            "settings apply)")
        if args.no_robots and (args.durations_from or args.exec_model):
            _replay_warning("--exec-model / --durations-from only configure robots this replay "
                            "starts; with --no-robots they apply to nothing")
        return
    if args.policy is not None:
        from timelyllm_ros.bench.policies import PolicyListError, parse_policy_list

        try:
            names = parse_policy_list(args.policy)
        except PolicyListError as err:
            raise _Usage(f"--policy: {err}") from None
        if len(names) != 1:
            raise _Usage("--policy: one policy per replay (run the replay again for another)")
    if args.model is not None and (args.engine or "sim") != "vllm":
        raise _Usage("--model: only with --engine vllm")
    if args.profile is not None and (args.engine or "sim") != "sim":
        raise _Usage("--profile: only with --engine sim")


def run(args: argparse.Namespace) -> int:
    try:
        _check_replay_args(args)
    except _Usage as err:  # reported without the usage line, unlike the other subcommands
        print(f"{REPLAY_PROG}: error: {err}", file=sys.stderr, flush=True)
        return 2
    from timelyllm_ros.experiments.replay import run_replay
    from timelyllm_ros.experiments.replay_plan import ReplayOptions

    return run_replay(ReplayOptions(
        workload=args.workload, policy=args.policy, engine=args.engine, model=args.model,
        profile=args.profile, attach=args.attach, no_robots=args.no_robots,
        exec_model=args.exec_model, durations_from=args.durations_from, json_path=args.json_path,
        record=args.record, time_scale=args.time_scale, duration_s=args.duration_s,
        seed=args.seed, startup_timeout_s=args.startup_timeout, task_timeout_s=args.task_timeout,
        log_dir=args.log_dir, echo=args.echo, show_progress=not args.no_progress))
