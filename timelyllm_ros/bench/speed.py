"""How fast the simulated bench replays: wall-clock seconds per policy on an overloaded workload.

    python -m timelyllm_ros.bench.speed [--workload mixed-30tps] [--policies ...]
                                        [--config modern,paper] [--duration-s S]
    python -m timelyllm_ros.bench.speed --workload mixed-overload \
        --policies vllm-stream,default --config modern [--repeats 3]

A load sweep (issue 11) replays a workload at up to 16 times its rate, so the bench must keep up
with overload: thousands of queued generations and active tasks. This replays the `mixed-30tps`
preset (the drone and arm fleet at ~30 tasks/s for 200 s, ~6,200 tasks) per policy and prints,
for each, the tasks, the virtual time it covered, the engine steps, the wall-clock seconds and
tasks per wall-clock second and the CPU seconds of this process (what other jobs on a shared
machine take from the wall-clock time, they do not add to these), then, per configuration, each
policy's times as a multiple of the first policy's, measured in the same run. It prints figures only; it asserts nothing about them (a shared 2-core
machine is too noisy for a timed test). `default` in `--policies` names the planner's default
policy. docs/bench.md, "Bench speed", has the figures before and after the profile-guided fixes;
`mixed-overload` is issue 22's 6,333-task load with 64 robots per kind, whose deep robot queues
were the slow part.

`--repeats N` replays every (configuration, policy) N times, interleaved: round by round, every
other round in reverse order (A B, B A, A B, ...), so that a machine that slows down or speeds
up during the run (another tenant, a frequency change) weighs on every policy alike. It then
prints each policy's median and fastest CPU seconds over the rounds and the ratios of both to
the reference's. On a shared VM whose speed moves by a third from one minute to the next, a
single pair of replays can put the ratio anywhere in that range. Each policy's fastest replay
is its time least disturbed by other jobs (they only ever add time), but the ratio of two
fastest replays rests on two single replays, and one lucky one moves it (docs/bench.md: 1.46
against a median of 1.33 over five rounds). The median ratio is the steadier figure.

Configurations: `modern` is `--prompt-tokens none --baseline-prefix-cache on` (the skill sets'
own prompts, prefix caching for every policy); `paper` is the paper's configuration (2,884-token
prompts, baselines without prefix caching; the bench's defaults when this was written).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from timelyllm_ros.bench.config import PAPER_PROMPT_TOKENS, BenchConfig
from timelyllm_ros.bench.policies import PolicyListError, parse_policy_list
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.workloads import load_workload_events

DEFAULT_WORKLOAD = "mixed-30tps"
DEFAULT_POLICIES = ("vllm-stream", "timelyllm", "timelyllm-bros")
CONFIGS = ("modern", "paper")


@dataclass(frozen=True)
class SpeedRow:
    config: str
    policy: str
    tasks: int
    clock_s: float  # virtual time the replay covered
    steps: int      # engine steps
    wall_s: float   # wall-clock seconds of the replay (events composed beforehand)
    cpu_s: float = float("nan")  # CPU seconds of this process during the replay
    round: int = 0  # which of the interleaved repeats (0-based)

    @property
    def tasks_per_wall_s(self) -> float:
        return self.tasks / self.wall_s if self.wall_s > 0 else float("inf")


def bench_config(name: str) -> BenchConfig:
    if name == "modern":
        return BenchConfig(prompt_tokens=None, baseline_prefix_cache=True)
    if name == "paper":
        return BenchConfig(prompt_tokens=PAPER_PROMPT_TOKENS, baseline_prefix_cache=False)
    raise ValueError(f"config: must be one of {', '.join(CONFIGS)}, got {name!r}")


def measure(workload: str = DEFAULT_WORKLOAD, policies: Sequence[str] = DEFAULT_POLICIES,
            configs: Sequence[str] = CONFIGS, duration_s: float | None = None,
            on_row=None, repeats: int = 1) -> list[SpeedRow]:
    """Replay `workload` once per (configuration, policy) and round, and time each replay.
    `repeats` rounds, interleaved (module docstring). `on_row(row)` is called as each one
    ends."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats: must be an integer >= 1, got {repeats!r}")
    spec, events = load_workload_events(workload, None, duration_s)
    runs = [(config_name, policy) for config_name in configs for policy in policies]
    rows = []
    for round_ in range(repeats):
        for config_name, policy in (runs if round_ % 2 == 0 else runs[::-1]):
            started, cpu_started = time.perf_counter(), time.process_time()
            result = run_policy(events, policy, spec, bench_config(config_name))
            row = SpeedRow(config_name, policy, len(result.tasks), result.clock_s, result.steps,
                           time.perf_counter() - started, time.process_time() - cpu_started,
                           round_)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


@dataclass(frozen=True)
class RepeatSummary:
    """One (configuration, policy) over the rounds of `measure(..., repeats=N)`."""
    config: str
    policy: str
    rounds: int
    median_cpu_s: float
    fastest_cpu_s: float
    median_wall_s: float
    fastest_wall_s: float


def summarise_repeats(rows: Sequence[SpeedRow]) -> list[RepeatSummary]:
    """Median and fastest of every (configuration, policy), in first-run order."""
    runs: dict[tuple[str, str], list[SpeedRow]] = {}
    for row in rows:
        runs.setdefault((row.config, row.policy), []).append(row)
    return [RepeatSummary(config, policy, len(group),
                          float(np.median([r.cpu_s for r in group])),
                          min(r.cpu_s for r in group),
                          float(np.median([r.wall_s for r in group])),
                          min(r.wall_s for r in group))
            for (config, policy), group in runs.items()]


def repeat_ratios(summaries: Sequence[RepeatSummary]) -> list[tuple[str, str, str, float, float]]:
    """(config, policy, reference policy, median CPU s / reference's, fastest CPU s /
    reference's) for every policy after the first of each configuration."""
    return _ratios_to_first(summaries, lambda s: s.median_cpu_s, lambda s: s.fastest_cpu_s)


HEADER = (f"{'config':<8} {'policy':<16} {'tasks':>6} {'clock_s':>8} {'steps':>7} "
          f"{'wall_s':>7} {'tasks/wall_s':>12} {'cpu_s':>7}")


def format_row(row: SpeedRow) -> str:
    return (f"{row.config:<8} {row.policy:<16} {row.tasks:>6} {row.clock_s:>8.1f} "
            f"{row.steps:>7} {row.wall_s:>7.1f} {row.tasks_per_wall_s:>12.1f} {row.cpu_s:>7.1f}")


def format_summary(s: RepeatSummary) -> str:
    return (f"{s.config:<8} {s.policy:<16} {s.rounds} rounds: cpu_s median {s.median_cpu_s:.1f}, "
            f"fastest {s.fastest_cpu_s:.1f}; wall_s median {s.median_wall_s:.1f}, "
            f"fastest {s.fastest_wall_s:.1f}")


def wall_ratios(rows: Sequence[SpeedRow]) -> list[tuple[str, str, str, float, float]]:
    """(config, policy, reference policy, wall s / reference's, CPU s / reference's) for every
    policy after the first of each configuration, the first being the reference: ratios
    within one run."""
    return _ratios_to_first(rows, lambda r: r.wall_s, lambda r: r.cpu_s)


def _ratios_to_first(items, first_figure,
                     second_figure) -> list[tuple[str, str, str, float, float]]:
    """(config, policy, reference policy, each figure / the reference's) for every item after
    the first of its configuration (items: rows or summaries, with `config` and `policy`)."""
    out = []
    first: dict[str, Any] = {}
    for item in items:
        ref = first.setdefault(item.config, item)
        if ref is not item:
            out.append((item.config, item.policy, ref.policy,
                        _ratio(first_figure(item), first_figure(ref)),
                        _ratio(second_figure(item), second_figure(ref))))
    return out


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else float("inf")


def format_ratio(config: str, policy: str, reference: str, wall: float, cpu: float) -> str:
    return f"{config:<8} {policy} / {reference}: wall {wall:.2f}, cpu {cpu:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m timelyllm_ros.bench.speed",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default=DEFAULT_WORKLOAD,
                        help=f"preset or workload file (default: {DEFAULT_WORKLOAD})")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                        help=f"comma-separated, 'default' = the planner's default policy; the first is "
                             f"the reference of the wall-time ratios (default: "
                             f"{','.join(DEFAULT_POLICIES)})")
    parser.add_argument("--config", default=",".join(CONFIGS),
                        help="comma-separated: modern (--prompt-tokens none "
                             "--baseline-prefix-cache on), paper (--prompt-tokens 2884 "
                             "--baseline-prefix-cache off); default: both")
    parser.add_argument("--duration-s", type=float, default=None,
                        help="replay only the first S seconds of the workload")
    parser.add_argument("--repeats", type=int, default=1,
                        help="replay each policy this many times, interleaved, and print each "
                             "one's median and fastest CPU time and their ratios (default: 1)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats: must be >= 1, got {args.repeats}")
    configs = [c.strip() for c in args.config.split(",") if c.strip()]
    for name in configs:
        if name not in CONFIGS:
            parser.error(f"--config: must be among {', '.join(CONFIGS)}, got {name!r}")
    try:
        policies = parse_policy_list(args.policies)
    except PolicyListError as exc:
        parser.error(f"--policies: {exc}")
    print(f"workload {args.workload}"
          + (f", first {args.duration_s:g} s" if args.duration_s is not None else ""))
    print(HEADER)
    rows = measure(args.workload, policies, configs, args.duration_s,
                   on_row=lambda row: print(format_row(row), flush=True), repeats=args.repeats)
    if args.repeats == 1:
        for ratio in wall_ratios(rows):
            print(format_ratio(*ratio))
        return 0
    order = {(config, policy): k for k, (config, policy) in
             enumerate((c, p) for c in configs for p in policies)}
    for round_ in range(args.repeats):  # each round's own ratios: how much one pair varies
        ran = sorted((r for r in rows if r.round == round_),
                     key=lambda r: order[(r.config, r.policy)])  # reference first, as listed
        for config, policy, ref, wall, cpu in wall_ratios(ran):
            print(f"round {round_ + 1}: " + format_ratio(config, policy, ref, wall, cpu))
    summaries = summarise_repeats(rows)
    for s in summaries:
        print(format_summary(s))
    for config, policy, ref, median, fastest in repeat_ratios(summaries):
        print(f"{config:<8} {policy} / {ref} over {args.repeats} rounds: cpu median {median:.2f}, "
              f"fastest {fastest:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
