"""`timelyllm top`: a live terminal view of the fleet, refreshed each second: queue, running,
suspended, KV use, and each task's state, robot, utility so far and segments.

It listens to /timelyllm/planner_metrics and /timelyllm/task_status (transient local, so a late
start still shows recent tasks). `--iterations N` prints N frames and exits (0: until Ctrl-C).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

TERMINAL = {"done", "failed", "rejected", "cancelled"}


def render(metrics, statuses: dict, max_tasks: int = 30) -> str:
    lines = []
    if metrics is None:
        lines.append("planner: no metrics yet (is it configured?)")
    else:
        kv_used = metrics.kv_total_blocks - metrics.kv_free_blocks
        kv_pct = 100.0 * kv_used / metrics.kv_total_blocks if metrics.kv_total_blocks else 0.0
        suspended = sum(1 for s in statuses.values() if s.state == "suspended")
        lines.append(f"policy {metrics.policy}  engine {metrics.engine}  queued {metrics.queued}  "
                     f"running {metrics.running}  suspended {suspended}  active {metrics.active_tasks}  "
                     f"kv {kv_used}/{metrics.kv_total_blocks} blocks ({kv_pct:.0f}%)  "
                     f"fetch {metrics.fetch_overhead_ms:.2f} ms")
    header = f"{'task':<20} {'robot':<12} {'state':<15} {'urgency':<8} {'utility':>8} {'segs':>9}"
    lines += [header, "-" * len(header)]
    ordered = sorted(statuses.values(), key=lambda s: (s.state in TERMINAL,
                                                       -(s.stamp.sec + s.stamp.nanosec * 1e-9)))
    for s in ordered[:max_tasks]:
        utility = "-" if math.isnan(s.utility) else f"{s.utility:.3f}"
        lines.append(f"{s.task_id[:20]:<20} {s.robot_id[:12]:<12} {s.state:<15} "
                     f"{(s.urgency or '-')[:8]:<8} {utility:>8} "
                     f"{s.segments_completed:>4}/{s.segments_dispatched:<4}")
    if len(ordered) > max_tasks:
        lines.append(f"... {len(ordered) - max_tasks} more")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="timelyllm top", description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=0, help="frames to print (0: forever)")
    parser.add_argument("--period", type=float, default=1.0)
    args = parser.parse_args(argv)
    from timelyllm_ros.ros.client import PlannerClient

    client = PlannerClient(node_name="timelyllm_top")
    clear = sys.stdout.isatty()
    frames = 0
    try:
        # Discovery, then the transient-local statuses and a metrics sample (1 Hz) arrive.
        client.wait_for(lambda seen: bool(seen.metrics), 5.0)
        while True:
            with client._lock:  # noqa: SLF001 - the client's own recording lock
                metrics = client.seen.metrics[-1] if client.seen.metrics else None
                statuses = {t: seen[-1] for t, seen in client.seen.statuses.items() if seen}
            frame = render(metrics, statuses)
            print(("\033[H\033[2J" if clear else "") + time.strftime("%H:%M:%S ") + frame, flush=True)
            frames += 1
            if args.iterations and frames >= args.iterations:
                return 0
            time.sleep(args.period)
    except KeyboardInterrupt:
        return 0
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
