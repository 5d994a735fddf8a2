"""`timelyllm demo` (what `make demo` runs): the whole system on real ROS 2 and real vLLM.

The demo itself is timelyllm_ros/experiments/demo.py; this module only parses its arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from timelyllm_ros.experiments.demo import DEFAULT_DESCRIPTION, DEFAULT_OUT, DEFAULT_POLICY, run_demo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="timelyllm demo", description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default=DEFAULT_POLICY)
    parser.add_argument("--description", type=Path, default=DEFAULT_DESCRIPTION)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--task-timeout", type=float, default=240.0)
    parser.add_argument("--quiet", action="store_true", help="do not echo node output")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_demo(policy=args.policy, description=args.description, out=args.out,
                    startup_timeout_s=args.startup_timeout, task_timeout_s=args.task_timeout,
                    echo=not args.quiet)


if __name__ == "__main__":
    sys.exit(main())
