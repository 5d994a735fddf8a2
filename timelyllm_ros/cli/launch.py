"""`timelyllm launch FILE`: start a node-set description as processes on a pip-only machine.

The runner is timelyllm_ros/ros/launch_runner.py; this module parses the arguments and reports a
bad description (exit status 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from timelyllm_ros.ros.launch_description import (LaunchDescriptionError, apply_overrides,
                                                  load_description)
from timelyllm_ros.ros.launch_runner import run_until_exit


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="timelyllm launch", description=__doc__.splitlines()[0])
    parser.add_argument("description", type=Path, help="a launch/*.nodes.yaml file")
    parser.add_argument("--set", action="append", default=[], metavar="NODE.PARAM=VALUE",
                        help="override a node parameter (repeatable). NODE is the node's label "
                        "(planner, drone_1/executor); everything after its first dot is the "
                        "parameter, dots included: planner.policy=edf-seg, "
                        "planner.engine.kind=sim. VALUE is read as YAML. A parameter the node "
                        "does not declare is an error (exit status 2) naming the ones it does")
    parser.add_argument("--log-dir", type=Path, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        specs = load_description(args.description)
        apply_overrides(specs, args.set)
    except LaunchDescriptionError as err:
        print(f"timelyllm launch: {err}", file=sys.stderr)
        return 2
    return run_until_exit(specs, log_dir=args.log_dir)


if __name__ == "__main__":
    sys.exit(main())
