"""`timelyllm bench --family N --family-seed S`: the workload family (bench/family.py), each
member replayed under the subject policy and the baselines, with the bound; the report of
bench/family_report.py (docs/family.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.family import (MEMBER_DURATION_S, describe_distribution, draw_member,
                                        member_yaml)
from timelyllm_ros.bench.family_report import (format_family, plot_family, replay_member,
                                               summarise)
from timelyllm_ros.bench.load_sweep import BASELINES
from timelyllm_ros.bench.metrics import json_safe
from timelyllm_ros.bench.policies import PolicyListError, parse_policy_list
from timelyllm_ros.bench.progress import ReplayProgress

# Options that choose a workload, an engine or a seed: a member brings its own.
_NOT_WITH_FAMILY = (("workload", "--workload"), ("profile", "--profile"),
                    ("kv_blocks", "--kv-blocks"), ("seed", "--seed"),
                    ("load_scale", "--load-scale"), ("sweep_batch_cap", "--sweep-batch-cap"),
                    ("requests", "--requests"))


def usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the family's arguments, or None."""
    for attr, flag in _NOT_WITH_FAMILY:
        if getattr(args, attr, None) is not None:
            return f"{flag}: not with --family (each member has its own workload, profile and seed)"
    if args.engine != "sim":
        return "--family: the family replays on the simulated engine only"
    if args.family is not None and args.family < 1:
        return f"--family: must be >= 1, got {args.family}"
    if args.family_seed < 0:
        return f"--family-seed: must be >= 0, got {args.family_seed}"
    if args.family_member is not None and args.family_member < 0:
        return f"--family-member: must be >= 0, got {args.family_member}"
    if args.duration_s is not None and not args.duration_s > 0:
        return f"--duration-s: must be > 0, got {args.duration_s}"
    try:
        subject = parse_policy_list(args.family_subject)
    except PolicyListError as exc:
        return f"--family-subject: {exc}"
    if len(subject) != 1:
        return f"--family-subject: one policy, got {args.family_subject!r}"
    return None


def _config_block(config: BenchConfig) -> dict:
    """The run's configuration without the default profile's figures: each member has its own
    profile (its `profile` field)."""
    block = {k: v for k, v in config.describe().items()
             if k not in ("kv_blocks", "max_num_batched_tokens")}
    return block | {"profile": "per member"}


def run(args: argparse.Namespace, config: BenchConfig) -> int:
    error = usage_error(args)
    if error:
        print(f"timelyllm bench: error: {error}", file=sys.stderr)
        return 2
    subject = parse_policy_list(args.family_subject)[0]
    duration = args.duration_s if args.duration_s is not None else MEMBER_DURATION_S
    indices = [args.family_member] if args.family_member is not None else range(args.family)
    started = time.perf_counter()
    print(f"family seed {args.family_seed}: {len(indices)} member(s) of {duration:g} s; subject "
          f"{subject} against {', '.join(BASELINES)}, with the bound", file=sys.stderr)
    rows = []
    for done, k in enumerate(indices, 1):
        member = draw_member(args.family_seed, k, duration)
        if args.family_member is not None:
            print(member_yaml(member))
        p = member.params
        print(f"member {k} ({done}/{len(indices)}): {p.mix} on {p.profile}, max_tpe "
              f"{p.max_tpe}, context {p.context}, load {p.load:.3f} x capacity "
              f"({p.eps:.3g} events/s)", file=sys.stderr)

        def progress_bar(policy: str, k=k) -> ReplayProgress:
            return ReplayProgress(f"#{k:02d} {policy}", enabled=not args.no_progress)

        row = replay_member(member, subject, config, progress_factory=progress_bar)
        rows.append(row)
        print(f"member {k}: {row['tasks']} tasks; {subject} "
              f"{row['policies'][subject]['utility_mean']:.3f}, {row['best_baseline']} "
              f"{row['policies'][row['best_baseline']]['utility_mean']:.3f} ({row['delta']:+.3f}, "
              f"{row['outcome']}), bound {row['bound']['utility_mean']:.3f}", file=sys.stderr)
    wall = time.perf_counter() - started
    doc = {"family": {"seed": args.family_seed, "members": len(rows), "duration_s": duration,
                      "subject": subject, "subject_given": args.family_subject,
                      "baselines": list(BASELINES), "distribution": describe_distribution(),
                      "config": _config_block(config)},
           "members": rows, "summary": summarise(rows), "wall_s": wall}
    print(format_family(doc))
    print(f"wall time {wall:.0f} s", file=sys.stderr)
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(json_safe(doc), indent=1) + "\n",
                                        encoding="utf-8")
        print(f"wrote {args.json_path}", file=sys.stderr)
    if args.plots:
        path = plot_family(doc, Path(args.plots) / "family.png")
        print(f"wrote {path}", file=sys.stderr)
    return 0
