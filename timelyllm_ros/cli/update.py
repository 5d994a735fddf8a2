"""`timelyllm update TASK --urgency urgent` (or --urgency '' --ert S --slope K --utility U):
change a running task's time-utility function.

Exit status 0 when the planner applied it; 1 with the reason (naming the field) otherwise.
"""

from __future__ import annotations

import argparse
import sys

from timelyllm_ros.cli.planner_call import call_planner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="timelyllm update", description=__doc__.splitlines()[0])
    parser.add_argument("task_id")
    parser.add_argument("--urgency", default=None, help="TUF level (normal, urgent, chat)")
    parser.add_argument("--ert", type=float, default=0.0, help="expected response time, s")
    parser.add_argument("--slope", type=float, default=0.0, help="utility decline per s")
    parser.add_argument("--utility", type=float, default=0.0, help="initial utility")
    args = parser.parse_args(argv)
    urgency = args.urgency if args.urgency is not None else (
        "" if (args.ert or args.slope or args.utility) else "normal")
    r = call_planner("update", lambda c: c.update_task(
        args.task_id, urgency=urgency, ert_s=args.ert, slope=args.slope,
        initial_utility=args.utility))
    if r is None:
        return 1
    print(f"{args.task_id}: urgency {r.urgency}, ERT {r.expected_response_time_s:g} s, "
          f"slope {r.decline_slope_per_s:g}/s, initial utility {r.initial_utility:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
