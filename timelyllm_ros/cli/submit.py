"""`timelyllm submit --robot drone_1 [--urgency urgent] "find the red box"`: send a PlanTask goal,
print each segment as its feedback arrives, then the result. Ctrl-C cancels the goal.

Ctrl-C (SIGINT) or SIGTERM sends the planner a cancel for the goal, once, and keeps waiting for
the final result (at most --cancel-wait seconds), which is printed with its state and reason as
always; a second signal exits at once (status 128 + the signal's number, 130 for SIGINT). The
handlers are installed whatever the signal's disposition was at start-up, so a `submit` started
in the background of a non-interactive shell (where SIGINT starts ignored) is cancelled by
`kill -INT` as well.

Exit status:
  0  the task is done
  1  the task failed or was rejected (the planner's reason is printed)
  2  bad usage
  3  the task was cancelled (here with Ctrl-C / SIGTERM, or by anyone, e.g. `timelyllm cancel`);
     also a signal before the goal was sent (nothing was submitted)
  4  no result: none within --timeout (the task goes on; `timelyllm cancel TASK` ends it), or
     none within --cancel-wait after a cancel
  5  no planner: /timelyllm/plan_task is not served, or the goal was not answered
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
import time

EXIT_DONE, EXIT_FAILED, EXIT_USAGE, EXIT_CANCELLED, EXIT_NO_RESULT, EXIT_NO_PLANNER = range(6)
CANCEL_WAIT_S = 10.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_POLL_S = 0.05


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(prog="timelyllm submit", description=doc[0],
                                     epilog="\n\n".join(doc[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
    parser.add_argument("--cancel-wait", type=float, default=CANCEL_WAIT_S,
                        help="after Ctrl-C / SIGTERM: seconds to wait for the cancelled task's "
                        f"result (default {CANCEL_WAIT_S:g})")
    return parser


class _Interrupts:
    """SIGINT / SIGTERM: the first is recorded (the main loop cancels the goal), a second one
    exits at once. Installed explicitly, replacing whatever was there (SIG_IGN included)."""

    def __init__(self):
        self.first: int | None = None
        # Python sets handlers from the main thread only; elsewhere (main() called from a
        # thread) the caller's own handling stays.
        self._previous = ({sig: signal.signal(sig, self._on_signal) for sig in _STOP_SIGNALS}
                          if threading.current_thread() is threading.main_thread() else {})

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        if self.first is not None:
            print(f"timelyllm submit: second {signal.Signals(signum).name}: exiting without the "
                  "result", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(128 + signum)
        self.first = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.first).name if self.first is not None else ""

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.ert or args.slope or args.utility:
        args.urgency = "" if args.urgency == "normal" else args.urgency
    # Before anything slow (importing rclpy, discovery): a signal from here on is not lost.
    interrupts = _Interrupts()
    try:
        return _submit(args, interrupts)
    finally:
        interrupts.restore()


def _submit(args, interrupts: _Interrupts) -> int:
    from timelyllm_ros.ros.client import PlannerClient

    client = PlannerClient(node_name="timelyllm_submit", signal_handlers=False)
    printed: set[int] = set()

    def on_feedback(fb) -> None:
        if fb.segments_dispatched and fb.segments_dispatched not in printed:
            printed.add(fb.segments_dispatched)
            print(f"{fb.task_id}: segment {fb.segments_dispatched - 1}: "
                  f"{fb.last_segment_text or '<end>'} ({fb.state})", flush=True)

    try:
        if not client.wait_for_action(15, alive=lambda: interrupts.first is None):
            if interrupts.first is not None:
                print(f"timelyllm submit: {interrupts.name} before the goal was sent; nothing "
                      "submitted", file=sys.stderr)
                return EXIT_CANCELLED
            print("timelyllm submit: no planner serving /timelyllm/plan_task (is it active?)",
                  file=sys.stderr)
            return EXIT_NO_PLANNER
        try:
            run = client.plan(args.id, args.robot, " ".join(args.instruction),
                              skill_set=args.skill_set, urgency=args.urgency, ert_s=args.ert,
                              slope=args.slope, initial_utility=args.utility,
                              on_feedback=on_feedback)
        except (TimeoutError, RuntimeError) as err:
            print(f"timelyllm submit: {err}", file=sys.stderr)
            return EXIT_NO_PLANNER
        outcome = _follow(run, args, interrupts)
        if outcome is None:
            return EXIT_NO_RESULT
        _status, r = outcome
        print(f"{r.task_id}: {r.state}" + (f" ({r.reason})" if r.reason else "")
              + f"; response {_num(r.response_time_s, 's')}, utility {_num(r.utility)}, "
              f"wait {_num(r.waiting_time_s, 's')}, {r.segments} segment(s), "
              f"{r.mean_cached_tokens_per_resume:.0f} cached tokens/resume", flush=True)
        return {"done": EXIT_DONE, "cancelled": EXIT_CANCELLED}.get(r.state, EXIT_FAILED)
    finally:
        client.close()


def _follow(run, args, interrupts: _Interrupts):
    """Wait for the goal's result; on the first signal request the cancel (once) and wait up to
    --cancel-wait more. The result, or None after printing why there is none."""
    deadline = time.monotonic() + args.timeout
    cancel = None       # the CancelGoal response's future, once sent
    refused_seen = False
    while True:
        outcome = run.result(_POLL_S)
        if outcome is not None:
            return outcome
        now = time.monotonic()
        task = run.task_id or "goal"
        if interrupts.first is not None and cancel is None:
            print(f"{task}: {interrupts.name}: cancelling (waiting up to {args.cancel_wait:g} s "
                  "for the result; again to exit at once)...", file=sys.stderr, flush=True)
            cancel = run.request_cancel()
            deadline = now + args.cancel_wait
        if (cancel is not None and not refused_seen and cancel.done()
                and not cancel.result().goals_canceling):
            # Refused: the task ended meanwhile (its result is on its way) or is unknown.
            refused_seen = True
            print(f"{task}: the planner did not take the cancel (has the task ended?)",
                  file=sys.stderr, flush=True)
        if now >= deadline:
            if cancel is None:
                print(f"timelyllm submit: no result within {args.timeout:g} s; {task} goes on "
                      "on the planner (`timelyllm cancel TASK` ends it)", file=sys.stderr)
            else:
                print(f"timelyllm submit: {task}: cancel sent, but no result within "
                      f"{args.cancel_wait:g} s", file=sys.stderr)
            return None


def _num(x: float, unit: str = "") -> str:
    return "-" if math.isnan(x) else f"{x:.3f}{(' ' + unit) if unit else ''}"


if __name__ == "__main__":
    sys.exit(main())
