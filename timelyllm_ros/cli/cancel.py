"""`timelyllm cancel TASK [--reason TEXT]`: cancel a task by id (PlanTask goal or TaskGoal).

Exit status 0 when the planner cancelled it; 1 with the planner's reason otherwise (unknown
task, already ended, no planner).
"""

from __future__ import annotations

import argparse
import sys

from timelyllm_ros.cli.planner_call import call_planner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="timelyllm cancel", description=__doc__.splitlines()[0])
    parser.add_argument("task_id")
    parser.add_argument("--reason", default="", help="recorded as the task's reason")
    args = parser.parse_args(argv)
    response = call_planner("cancel", lambda c: c.cancel_task(args.task_id, args.reason))
    if response is None:
        return 1
    print(f"{args.task_id}: {response.state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
