"""The best schedule found by search (bench/burst_search.py) for a family member's bursts,
beside the burst bound and the policies' figures.

    python -m timelyllm_ros.bench.burst_search_report --family-seed 1 --member 39
    python -m timelyllm_ros.bench.burst_search_report --family-seed 1 --member 39 --event 0

Without --event: one line per burst (an event, or events released before the best schedule of
the one before has its first segments out), each figure the burst's summed utility, then the
member's means over every task. With --event: those events as one burst, each task's response,
with the schedule that adds every task at once beside the best.
The policies are replayed on the whole member (`bench.replay.run_policies`), so their figures
include what other events' plans cost them; the searched figures serve each burst alone.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Sequence

from timelyllm_ros.bench.burst_search import (event_tasks, relaxed, replay_on_engine, search,
                                              simulate)
from timelyllm_ros.bench.config import BenchConfig

def bursts(events: Sequence[Event], burst_of, node_limit: int):
    """The events in bursts, each searched: an event joins the burst before it when it is
    released before that burst's best schedule has all its first segments out (the two share
    steps), unless the joint search stops at the node limit; then they are searched apart and
    the earlier burst is marked `overlapped`. Yields (events, BurstEvent, SearchResult,
    overlapped)."""
    pending = sorted(events, key=lambda e: e.time_s)
    while pending:
        group = [pending.pop(0)]
        burst = burst_of(group)
        found = search(burst, node_limit)
        overlapped = False
        while pending:
            done = group[0].time_s + max(t.release_s + r - burst.latency_s
                                         for t, r in zip(burst.tasks, found.responses))
            if pending[0].time_s >= done:
                break
            joint = burst_of(group + pending[:1])
            joint_found = search(joint, node_limit)
            if not joint_found.complete:
                overlapped = True
                break
            group.append(pending.pop(0))
            burst, found = joint, joint_found
        yield group, burst, found, overlapped


def _events_table(events, burst_of, bound, got, node_limit) -> list[str]:
    """One line per burst: the bounds', the searched best and each policy's summed utility;
    then the member's means over every task."""
    lines, sums = [], {}
    n = sum(len(e.tasks) for e in events)
    for group, burst, found, overlapped in bursts(events, burst_of, node_limit):
        ids = [t.task_id for t in burst.tasks]
        loose = search(relaxed(burst), node_limit)
        figures = {"alone bound": sum(bound[i].alone_utility for i in ids),
                   "burst bound": sum(bound[i].utility for i in ids),
                   "relaxed best": loose.utility, "best found": found.utility}
        figures |= {p: sum(got[p][i].utility for i in ids) for p in got}
        for k, v in figures.items():
            sums[k] = sums.get(k, 0.0) + v
        name = ",".join(str(e.event_id) for e in group)
        lines.append(f"  event {name:>6s} ({len(ids)} tasks) " + "  ".join(
            f"{k} {v:.3f}" for k, v in figures.items())
            + ("" if found.complete and loose.complete else " (node limit)")
            + (" (overlaps the next event, searched apart)" if overlapped else ""))
    lines.append("  member means: " + "  ".join(f"{k} {v / n:.4f}" for k, v in sums.items()))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    from timelyllm_ros.bench.bound import upper_bound
    from timelyllm_ros.bench.family import draw_member
    from timelyllm_ros.bench.replay import run_policies
    from timelyllm_ros.lrtrace.workload import compose

    ap = argparse.ArgumentParser(prog="python -m timelyllm_ros.bench.burst_search_report")
    ap.add_argument("--family-seed", type=int, default=1)
    ap.add_argument("--member", type=int, required=True)
    ap.add_argument("--event", default=None,
                    help="event numbers (comma-separated: one burst) to show in detail "
                         "(default: every event, one line per burst)")
    ap.add_argument("--policies", default="timelyllm-pred,vllm-stream")
    ap.add_argument("--node-limit", type=int, default=300_000)
    ap.add_argument("--shared-cache-only", action="store_true",
                    help="the prefix cache holds only the skill sets' shared prompts (the "
                         "bound's assumption), not what earlier events computed")
    args = ap.parse_args(argv)
    member = draw_member(args.family_seed, args.member)
    events = compose(member.workload)
    config = replace(BenchConfig(), profile=member.profile)
    bound = {b.task_id: b for b in upper_bound(events, member.workload, config)}
    runs = run_policies(events, args.policies.split(","), member.workload, config)
    got = {p: {t.task_id: t for t in r.tasks} for p, r in runs.items()}
    print(f"family {args.family_seed} member {args.member}: {len(events)} events, "
          f"{sum(len(e.tasks) for e in events)} tasks")

    def burst_of(group):
        return event_tasks(group, events, member.workload, config,
                           earlier=not args.shared_cache_only)

    if args.event is None:
        print("\n".join(_events_table(events, burst_of, bound, got, args.node_limit)))
        return 0
    chosen = {int(x) for x in args.event.split(",")}
    group = [e for e in events if e.event_id in chosen]
    burst = burst_of(group)
    ids = [t.task_id for t in burst.tasks]
    found = search(burst, args.node_limit)
    loose = search(relaxed(burst), args.node_limit)
    engine = replay_on_engine(burst, found.schedule)
    print(f"events {args.event}: {len(ids)} tasks from {group[0].time_s:.3f} s; summed "
          f"utility, then each task's response (s)")
    rows = [("alone bound", [bound[i].alone_response_time_s for i in ids]),
            ("burst bound", [bound[i].response_time_s for i in ids]),
            ("relaxed best" + ("" if loose.complete else " (node limit)"),
             list(loose.responses)),
            ("best found" + ("" if found.complete else " (node limit)"), list(found.responses)),
            ("  replayed on the engine", engine),
            ("all at once", simulate(burst, [0] * len(ids)))] + \
        [(p, [got[p][i].response_time_s for i in ids]) for p in got]
    for name, times in rows:
        total = sum(t.tuf.utility(r) for t, r in zip(burst.tasks, times))
        print(f"  {name:24s} {total:7.3f}  " + " ".join(f"{r:.3f}" for r in times))
    print(f"  search: {found.nodes} nodes; step each task is added at {list(found.schedule)}; "
          f"tasks {ids}, ERT {[t.tuf.ert_s for t in burst.tasks]} s, released "
          f"{[round(t.release_s, 3) for t in burst.tasks]} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
