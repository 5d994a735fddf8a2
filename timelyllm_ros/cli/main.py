"""`timelyllm`: one command for what people do by hand.

`timelyllm <command> ...` runs `timelyllm_ros.cli.<command>.main(argv) -> int`. Each command's
module is imported only when used, so `timelyllm env` stays instant and never loads vLLM or ROS.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> one-line help; the command's code is the module timelyllm_ros.cli.<command>
SUBCOMMANDS: dict[str, str] = {
    "env": "print shell exports for rclpy and the project's msg types",
    "model": "prepare the bundled model (`timelyllm model prepare`)",
    "launch": "start nodes from a launch description without ros2 launch",
    "demo": "run the end-to-end demo: planner, two drones, three tasks",
    "profile": "measure the engine's latency and write its profile",
    "bench": "replay a workload under several policies and report utility / latency",
    "fleet": "how many robots N simulated replicas serve, and the planner's cost per pass",
    "lrtrace": "record, fit, compose and replay robot timing traces",
    "submit": "send a PlanTask goal to the planner and follow it (Ctrl-C cancels)",
    "cancel": "cancel a task by id",
    "update": "change a running task's urgency or TUF",
    "top": "live view of the planner: queue, KV use, tasks",
    "plan": "dry-run a plan on a simulated robot (`timelyllm plan run PROGRAM`)",
    "soak": "run a fleet of simulated robots against the planner over ROS for minutes",
    "faults": "inject faults (planner kill, engine error, lost robot, overload) and tabulate",
    "router-compare": "engine.replicas against vllm-router on two real vLLM workers",
}


def command_module(command: str) -> str:
    return f"timelyllm_ros.cli.{command.replace('-', '_')}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="timelyllm", description="TimelyLLM-ROS: segmented, time-utility LLM serving for robots")
    parser.add_argument("command", choices=sorted(SUBCOMMANDS), metavar="command",
                        help="; ".join(f"{k}: {v}" for k, v in sorted(SUBCOMMANDS.items())))
    parser.add_argument("args", nargs=argparse.REMAINDER)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    ns = parser.parse_args(argv[:1])
    module = importlib.import_module(command_module(ns.command))
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
