"""How fast the simulated bench replays: wall-clock seconds per policy on an overloaded workload.

    python -m timelyllm_ros.bench.speed [--workload mixed-30tps] [--policies ...]
                                        [--config modern,paper] [--duration-s S]
    python -m timelyllm_ros.bench.speed --workload mixed-overload \
        --policies vllm-stream,default --config modern

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

Configurations: `modern` is `--prompt-tokens none --baseline-prefix-cache on` (the skill sets'
own prompts, prefix caching for every policy); `paper` is the paper's configuration (2,884-token
prompts, baselines without prefix caching; the bench's defaults when this was written).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Sequence

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
            on_row=None) -> list[SpeedRow]:
    """Replay `workload` once per (configuration, policy) and time each replay. `on_row(row)` is
    called as each one ends."""
    spec, events = load_workload_events(workload, None, duration_s)
    rows = []
    for config_name in configs:
        config = bench_config(config_name)
        for policy in policies:
            started, cpu_started = time.perf_counter(), time.process_time()
            result = run_policy(events, policy, spec, config)
            row = SpeedRow(config_name, policy, len(result.tasks), result.clock_s, result.steps,
                           time.perf_counter() - started, time.process_time() - cpu_started)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


HEADER = (f"{'config':<8} {'policy':<16} {'tasks':>6} {'clock_s':>8} {'steps':>7} "
          f"{'wall_s':>7} {'tasks/wall_s':>12} {'cpu_s':>7}")


def format_row(row: SpeedRow) -> str:
    return (f"{row.config:<8} {row.policy:<16} {row.tasks:>6} {row.clock_s:>8.1f} "
            f"{row.steps:>7} {row.wall_s:>7.1f} {row.tasks_per_wall_s:>12.1f} {row.cpu_s:>7.1f}")


def wall_ratios(rows: Sequence[SpeedRow]) -> list[tuple[str, str, str, float, float]]:
    """(config, policy, reference policy, wall s / reference's, CPU s / reference's) for every
    policy after the first of each configuration, the first being the reference: ratios
    within one run."""
    out = []
    first: dict[str, SpeedRow] = {}
    for row in rows:
        ref = first.setdefault(row.config, row)
        if ref is not row:
            out.append((row.config, row.policy, ref.policy, _ratio(row.wall_s, ref.wall_s),
                        _ratio(row.cpu_s, ref.cpu_s)))
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
    args = parser.parse_args(argv)
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
                   on_row=lambda row: print(format_row(row), flush=True))
    for ratio in wall_ratios(rows):
        print(format_ratio(*ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
