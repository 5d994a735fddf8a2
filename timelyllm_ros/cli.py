"""`timelyllm`: one command for what people do by hand.

Each subcommand lives in its own module and is imported only when used, so `timelyllm env` stays
instant and never loads vLLM or ROS.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module with `main(argv) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "env": ("timelyllm_ros.cli_env", "print shell exports for rclpy and the project's msg types"),
    "model": ("timelyllm_ros.cli_model", "prepare the bundled model (`timelyllm model prepare`)"),
    "launch": ("timelyllm_ros.launch_runner", "start nodes from a launch description without ros2 launch"),
    "demo": ("timelyllm_ros.demo", "run the end-to-end demo: planner, two drones, three tasks"),
    "submit": ("timelyllm_ros.cli_submit", "publish one task goal and follow its status"),
    "profile": ("timelyllm_ros.profile_cmd", "measure the engine's latency and write its profile"),
    "bench": ("timelyllm_ros.bench.cli", "replay a workload under several policies and report utility / latency"),
    "lrtrace": ("timelyllm_ros.lrtrace.cli", "record, fit, compose and replay robot timing traces"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="timelyllm", description="TimelyLLM-ROS: segmented, time-utility LLM serving for robots")
    parser.add_argument("command", choices=sorted(SUBCOMMANDS), metavar="command",
                        help="; ".join(f"{k}: {v[1]}" for k, v in sorted(SUBCOMMANDS.items())))
    parser.add_argument("args", nargs=argparse.REMAINDER)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    ns = parser.parse_args(argv[:1])
    module = importlib.import_module(SUBCOMMANDS[ns.command][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
