"""`timelyllm submit --robot drone_1 [--urgency urgent] "find the red box"`: send a PlanTask goal,
print each segment as its feedback arrives, then the result. Ctrl-C cancels the goal.

Exit status: 0 when the task is done, 1 otherwise (refused, failed, cancelled, no planner).
"""

from __future__ import annotations

import argparse
import math
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="timelyllm submit", description=__doc__.splitlines()[0])
    parser.add_argument("instruction", nargs="+", help="what the robot should do")
    parser.add_argument("--robot", required=True, help="robot id, e.g. drone_1")
    parser.add_argument("--urgency", default="normal", help="TUF level (normal, urgent, chat); "
                        "'' with --ert/--slope/--utility for an explicit TUF")
    parser.add_argument("--ert", type=float, default=0.0, help="expected response time, s")
    parser.add_argument("--slope", type=float, default=0.0, help="utility decline per s")
    parser.add_argument("--utility", type=float, default=0.0, help="initial utility")
    parser.add_argument("--skill-set", default="", help="robot kind; default: the robot's")
    parser.add_argument("--id", default="", help="task id; default: the planner assigns one")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the result")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.ert or args.slope or args.utility:
        args.urgency = "" if args.urgency == "normal" else args.urgency
    from timelyllm_ros.ros.client import PlannerClient

    client = PlannerClient(node_name="timelyllm_submit")
    printed: set[int] = set()

    def on_feedback(fb) -> None:
        if fb.segments_dispatched and fb.segments_dispatched not in printed:
            printed.add(fb.segments_dispatched)
            print(f"{fb.task_id}: segment {fb.segments_dispatched - 1}: "
                  f"{fb.last_segment_text or '<end>'} ({fb.state})", flush=True)

    try:
        if not client.wait_for_action(15):
            print("timelyllm submit: no planner serving /timelyllm/plan_task (is it active?)",
                  file=sys.stderr)
            return 1
        run = client.plan(args.id, args.robot, " ".join(args.instruction), skill_set=args.skill_set,
                          urgency=args.urgency, ert_s=args.ert, slope=args.slope,
                          initial_utility=args.utility, on_feedback=on_feedback)
        try:
            outcome = run.result(args.timeout)
        except KeyboardInterrupt:
            print("cancelling...", file=sys.stderr, flush=True)
            run.cancel()
            outcome = run.result(30)
        if outcome is None:
            print(f"timelyllm submit: no result within {args.timeout:g} s", file=sys.stderr)
            return 1
        _status, r = outcome
        print(f"{r.task_id}: {r.state}" + (f" ({r.reason})" if r.reason else "")
              + f"; response {_num(r.response_time_s, 's')}, utility {_num(r.utility)}, "
              f"wait {_num(r.waiting_time_s, 's')}, {r.segments} segment(s), "
              f"{r.mean_cached_tokens_per_resume:.0f} cached tokens/resume", flush=True)
        return 0 if r.state == "done" else 1
    finally:
        client.close()


def _num(x: float, unit: str = "") -> str:
    return "-" if math.isnan(x) else f"{x:.3f}{(' ' + unit) if unit else ''}"


if __name__ == "__main__":
    sys.exit(main())
