"""Where a family member's responses lose utility against the alone bound: in the wait to be
admitted, or in the service after it.

    python -m timelyllm_ros.bench.response_split --family-seed 1 --member 31
    python -m timelyllm_ros.bench.response_split --family-seed 1 --member 31 --task-type drone-urgent
    python -m timelyllm_ros.bench.response_split --family-seed 1 --members 0-39 --policies default

The alone bound (bench/bound.py) serves each task's first segment on an idle, warm engine from
the moment it arrives. A replayed response is two parts: the wait until the task's generation
is admitted (the start of its first generation span) and the service from there to the robot.
Per task this prints both parts, the alone bound's response, and the task's utility at three
times: the alone bound; the alone bound plus the wait, as if the service after admission were
as fast as alone; and the response. A loss against the alone bound thus splits into what the
wait cost and what the service cost.

With `--members` (a list such as `1,6,31` or a range such as `0-39`), one line per member and
policy instead: the loss as a share of the member's mean utility, split the same way.

The wait has a floor that no admission decision removes: a task that arrives while a step is
in flight is admitted when that step ends, at the earliest. On an engine whose steps are tens of
milliseconds (a decode step on the A10 profile takes about 36 ms) and whose fixed cost per
step dominates, that wait can cost an urgent task (ERT 0.2 s) more than everything that shares
its steps afterwards. The alone bound does not count it. Only an engine left idle in
anticipation of an arrival would avoid it. So each report also says how much of the replay the
engine was busy (the union of the generations' spans, from its first step to its last) and how
many of the listed tasks arrived while it was: on an engine busy nearly all the time, nearly
every arrival meets a step in flight, whatever the admission order.
"""

from __future__ import annotations

import argparse
import bisect
import math
import sys
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from timelyllm_ros.bench.config import BenchConfig

DEFAULT_POLICIES = "timelyllm-pred,vllm-stream"


@dataclass(frozen=True)
class ResponseSplit:
    """One task's response against its alone bound (module docstring); seconds from arrival."""

    task_id: str
    task_type: str
    wait_s: float       # arrival until its generation was admitted
    service_s: float    # admission until the response
    alone_s: float      # the alone bound's response
    utility_alone: float
    utility_after_wait: float  # at alone_s + wait_s
    utility: float      # at the response

    @property
    def lost_to_wait(self) -> float:
        return self.utility_alone - self.utility_after_wait

    @property
    def lost_to_service(self) -> float:
        return self.utility_after_wait - self.utility


def split_responses(tasks: Sequence, alone: Mapping[str, object]) -> list[ResponseSplit]:
    """A `ResponseSplit` per task of `tasks` (`TaskResult`s) that got a response, has a TUF and
    was admitted; `alone`: task id -> its bound (`BoundTask`, `alone_response_time_s`)."""
    out = []
    for task in tasks:
        bound = alone.get(task.task_id)
        if bound is None or task.tuf is None or not task.generation_spans \
                or not math.isfinite(task.response_time_s):
            continue
        wait = task.generation_spans[0][0] - task.arrival_s
        alone_s = bound.alone_response_time_s
        out.append(ResponseSplit(task.task_id, task.task_type, wait,
                                 task.response_time_s - wait, alone_s,
                                 float(task.tuf.utility(alone_s)),
                                 float(task.tuf.utility(alone_s + wait)),
                                 float(task.tuf.utility(task.response_time_s))))
    return out


def busy_intervals(tasks: Sequence) -> list[tuple[float, float]]:
    """When the engine was busy: the union of every task's generation spans (a generation in
    the engine means the engine steps), as disjoint (start, end) intervals in time order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(span for task in tasks for span in task.generation_spans):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def busy_during(intervals: Sequence[tuple[float, float]], t: float) -> bool:
    """Whether `t` falls strictly inside one of `intervals` (`busy_intervals`)."""
    k = bisect.bisect_right(intervals, (t, math.inf)) - 1
    return k >= 0 and intervals[k][0] < t < intervals[k][1]


def busy_share(intervals: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(seconds busy, seconds from the first step to the last) of `busy_intervals`."""
    return (sum(end - start for start, end in intervals),
            intervals[-1][1] - intervals[0][0] if intervals else 0.0)


def busy_line(tasks: Sequence, splits: Sequence[ResponseSplit], task_type: str | None) -> str:
    """How much of the replay the engine was busy, and how many of `task_type`'s tasks (all,
    if None) arrived while it was: each of those waited for the step in flight."""
    intervals = busy_intervals(tasks)
    if not intervals:
        return "  engine never busy"
    busy, span = busy_share(intervals)
    arrival = {task.task_id: task.arrival_s for task in tasks}
    chosen = [s for s in splits if task_type is None or s.task_type == task_type]
    met = sum(busy_during(intervals, arrival[s.task_id]) for s in chosen)
    return (f"  engine busy {busy:.2f} s of the {span:.2f} s from its first step to its "
            f"last ({busy / span:.1%}); {met} of {len(chosen)} "
            f"{task_type or 'answered'} tasks arrived while it was busy")


def by_type(splits: Sequence[ResponseSplit]) -> dict[str, tuple[int, float, float]]:
    """Task type -> (tasks, summed utility lost to the wait, lost to the service)."""
    out: dict[str, tuple[int, float, float]] = {}
    for s in splits:
        n, wait, service = out.get(s.task_type, (0, 0.0, 0.0))
        out[s.task_type] = (n + 1, wait + s.lost_to_wait, service + s.lost_to_service)
    return out


def format_report(policy: str, splits: Sequence[ResponseSplit], member_tasks: int,
                  task_type: str | None) -> list[str]:
    lines = [f"{policy}: utility lost against the alone bound, summed (and as a share of the "
             f"member's mean over its {member_tasks} tasks)"]
    total_wait = total_service = 0.0
    for kind, (n, wait, service) in sorted(by_type(splits).items()):
        total_wait += wait
        total_service += service
        lines.append(f"  {kind:20s} {n:4d} tasks: wait {wait:7.3f} ({wait / member_tasks:.4f}), "
                     f"service {service:7.3f} ({service / member_tasks:.4f})")
    lines.append(f"  {'all':20s} {len(splits):4d} tasks: wait {total_wait:7.3f} "
                 f"({total_wait / member_tasks:.4f}), service {total_service:7.3f} "
                 f"({total_service / member_tasks:.4f})")
    if task_type is not None:
        lines.append(f"  {task_type}, per task (ms; utility at the alone bound, after the wait, "
                     f"at the response):")
        for s in splits:
            if s.task_type == task_type:
                lines.append(
                    f"    {s.task_id}: wait {s.wait_s * 1e3:6.1f}, service {s.service_s * 1e3:7.1f}"
                    f", alone {s.alone_s * 1e3:7.1f}; utility {s.utility_alone:.3f} / "
                    f"{s.utility_after_wait:.3f} / {s.utility:.3f}")
    return lines


def parse_members(text: str) -> list[int]:
    """`1,6,31` or `0-39` (or both, `0-3,31`) -> member indices, in order, each once."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            span = range(int(lo), int(hi) + 1) if dash else [int(part)]
        except ValueError:
            raise ValueError(f"{part!r} is not a member number or a range a-b") from None
        if not len(span):
            raise ValueError(f"{part!r} is an empty range")
        out.extend(k for k in span if k not in out)
    return out


def summary_line(member: int, policy: str, splits: Sequence[ResponseSplit],
                 member_tasks: int, tasks: Sequence | None = None) -> str:
    """One member's loss as a share of its mean; with its `tasks`, also the share of the time
    from the engine's first step to its last that it was busy."""
    wait = sum(s.lost_to_wait for s in splits) / member_tasks
    service = sum(s.lost_to_service for s in splits) / member_tasks
    urgent = sum(s.lost_to_wait for s in splits if s.task_type == "drone-urgent") / member_tasks
    line = (f"member {member:3d} {policy}: {member_tasks:5d} tasks, {len(splits):5d} answered; "
            f"lost {wait + service:.4f} of the mean: wait {wait:.4f} (urgent drones "
            f"{urgent:.4f}), service {service:.4f}")
    busy, span = busy_share(busy_intervals(tasks) if tasks is not None else [])
    return line + (f"; engine busy {busy / span:.1%}" if span > 0 else "")


def _member(family_seed: int, k: int):
    """Family member `k`, as the family's replays see it: (member, events, config, alone
    bound by task id, tasks)."""
    from timelyllm_ros.bench.bound import upper_bound
    from timelyllm_ros.bench.family import draw_member
    from timelyllm_ros.lrtrace.workload import compose

    member = draw_member(family_seed, k)
    events = compose(member.workload)
    config = replace(BenchConfig(), profile=member.profile)
    alone = {b.task_id: b for b in upper_bound(events, member.workload, config)}
    return member, events, config, alone, sum(len(e.tasks) for e in events)


def main(argv: Sequence[str] | None = None) -> int:
    from timelyllm_ros.bench.policies import PolicyListError, parse_policy_list
    from timelyllm_ros.bench.replay import run_policies

    ap = argparse.ArgumentParser(prog="python -m timelyllm_ros.bench.response_split",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--family-seed", type=int, default=1)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--member", type=int)
    which.add_argument("--members", default=None,
                       help="several members, one line each: '1,6,31' or '0-39'")
    ap.add_argument("--policies", default=DEFAULT_POLICIES,
                    help=f"comma-separated ('default' = the planner's default; default: "
                         f"{DEFAULT_POLICIES})")
    ap.add_argument("--task-type", default=None,
                    help="also list every task of this type (e.g. drone-urgent)")
    args = ap.parse_args(argv)
    try:
        members = [args.member] if args.members is None else parse_members(args.members)
    except ValueError as exc:
        ap.error(f"--members: {exc}")
    if min(members) < 0:
        ap.error(f"--member: must be >= 0, got {min(members)}")
    try:
        policies = parse_policy_list(args.policies)
    except PolicyListError as exc:
        ap.error(f"--policies: {exc}")
    if args.members is not None:
        for k in members:
            member, events, config, alone, n = _member(args.family_seed, k)
            for policy, run in run_policies(events, policies, member.workload, config).items():
                print(summary_line(k, policy, split_responses(run.tasks, alone), n, run.tasks),
                      flush=True)
        return 0
    member, events, config, alone, n = _member(args.family_seed, args.member)
    types = sorted({b.task_type for b in alone.values()})
    if args.task_type is not None and args.task_type not in types:
        ap.error(f"--task-type: member {args.member} has no {args.task_type!r} task; its "
                 f"types: {', '.join(types)}")
    p = member.params
    print(f"family {args.family_seed} member {args.member}: {p.mix} on {p.profile}, load "
          f"{p.load:.3f} x capacity, {len(events)} events, {n} tasks")
    for policy, run in run_policies(events, policies, member.workload, config).items():
        splits = split_responses(run.tasks, alone)
        print("\n".join(format_report(policy, splits, n, args.task_type)))
        print(busy_line(run.tasks, splits, args.task_type))
    return 0

if __name__ == "__main__":
    sys.exit(main())
