"""Sensitivity of `timelyllm-pred` to its knobs (docs/batch-control.md, "Knobs").

    python -m timelyllm_ros.cli.pred_sensitivity --workload WID1 --robots parallel \\
        --load-scale 32,64 [--knob arrival_window_s] [--knob resume_weight=0,0.5,1]
    python -m timelyllm_ros.cli.pred_sensitivity --family-seed 1 --family-members 9,24,31,38

One knob is moved at a time from the policy's defaults (`PredictiveTimelyPolicy`'s fields).
A **run** is a workload at one load scale (`--workload`, `--load-scale`), or a member of the
workload family with its own engine profile (`--family-seed`, `--family-members`;
bench/family.py). Each run replays `timelyllm-pred` once at its defaults, once per other value of
each knob swept, and the baselines `vllm-stream` and `vllm-priority` once; every replay of a run
sees the same events. Per knob, a table: one row per run, one column per value (the default
marked `*`), each cell the mean utility and, in brackets, the deadline misses in % (the figures
of `timelyllm bench`'s table), and the better baseline's figures for reference.

`--knob NAME` sweeps NAME over its standard values (`KNOBS`), `--knob NAME=V1,V2` over the values
given; without `--knob`, every knob of `KNOBS` at its standard values.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from timelyllm_ros.bench.config import ROBOT_MODES, BenchConfig
from timelyllm_ros.bench.family import MEMBER_DURATION_S, draw_member
from timelyllm_ros.bench.load_sweep import BASELINES, scaled_workload
from timelyllm_ros.bench.metrics import bucket_metrics, format_cell, json_safe
from timelyllm_ros.bench.progress import ReplayProgress
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.workloads import WorkloadSourceError, load_bench_workload
from timelyllm_ros.cli.bench_args import comma_separated_scales  # the bench's --load-scale type
from timelyllm_ros.core.policies.predictive import PredictiveTimelyPolicy
from timelyllm_ros.lrtrace.workload import Event, Workload, compose

SUBJECT = "timelyllm-pred"


class UsageError(Exception):
    """Bad arguments: reported on stderr with exit status 2."""


def _value_parser(*, integer: bool = False, minimum: float, strict: bool,
                  none: bool = False) -> Callable[[str], Any]:
    """A parser of one knob value: a number (an integer with `integer`) above `minimum` (or at
    it, unless `strict`), or 'none' where `none`; ValueError saying why not."""
    def parse(text: str) -> Any:
        if none and text.strip().lower() == "none":
            return None
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            kind = "an integer" if integer else "a number"
            raise ValueError(f"{text!r} is not {kind}" + (" or 'none'" if none else "")) from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise ValueError(f"{text!r}: must be {'>' if strict else '>='} {minimum:g}")
        return value
    return parse


@dataclass(frozen=True)
class Knob:
    """A knob of `PredictiveTimelyPolicy`: the values its sweep takes unless told otherwise, and
    the parser of a value given on the command line."""

    name: str
    values: tuple[Any, ...]
    parse: Callable[[str], Any]

    @property
    def default(self) -> Any:
        return _POLICY_DEFAULTS[self.name]


_POLICY_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PredictiveTimelyPolicy)}

# The standard sweeps (docs/batch-control.md): each spans its default by at least a factor of
# 4 on both sides where the knob allows; None for arrival_window_s turns the pricing of the
# responses that arrive while a resume runs off.
KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("prior_steps", (1.0, 10.0, 50.0, 250.0), _value_parser(minimum=0, strict=True)),
    Knob("memory_steps", (200.0, 2000.0, 20000.0), _value_parser(minimum=1, strict=False)),
    Knob("arrival_window_s", (None, 1.0, 2.0, 5.0, 10.0, 20.0),
         _value_parser(minimum=0, strict=True, none=True)),
    Knob("length_quantiles", (1, 4, 8, 16), _value_parser(integer=True, minimum=1,
                                                          strict=False)),
    Knob("resume_weight", (0.0, 0.25, 1.0), _value_parser(minimum=0, strict=False)),
)}


def parse_knob(text: str) -> tuple[str, tuple[Any, ...]]:
    """`NAME` or `NAME=V1,V2,...` -> (name, values); the default is always among the values."""
    name, _, listed = text.partition("=")
    name = name.strip()
    if name not in KNOBS:
        raise UsageError(f"--knob: unknown knob {name!r} (one of {', '.join(KNOBS)})")
    knob = KNOBS[name]
    if not _:
        values = knob.values
    else:
        items = [v for v in listed.split(",") if v.strip()]
        if not items:
            raise UsageError(f"--knob {name}: no value after '='")
        try:
            values = tuple(knob.parse(v) for v in items)
        except ValueError as exc:
            raise UsageError(f"--knob {name}: {exc}") from None
        if len(set(values)) != len(values):
            raise UsageError(f"--knob {name}: a value is listed twice: {listed!r}")
    if knob.default not in values:
        values = (*values, knob.default)
    return name, values


def _member_indices(text: str) -> list[int]:
    try:
        indices = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not indices or any(k < 0 for k in indices):
        raise argparse.ArgumentTypeError(f"member indices must be integers >= 0, got {text!r}")
    if len(set(indices)) != len(indices):
        raise argparse.ArgumentTypeError(f"a member is listed twice: {text!r}")
    return indices


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m timelyllm_ros.cli.pred_sensitivity",
        description=f"{SUBJECT}'s knobs, one moved at a time from the defaults, over workloads "
                    "and family members; baselines for reference.")
    p.add_argument("--knob", action="append", default=None, metavar="NAME[=V1,V2]",
                   help=f"a knob to sweep, repeatable (default: all of {', '.join(KNOBS)}, "
                        "each at its standard values)")
    p.add_argument("--workload", default=None,
                   help="a preset (WID1, mixed-fleet-long, ...) or a workload file")
    p.add_argument("--load-scale", type=comma_separated_scales, default=None, metavar="32,64",
                   help="with --workload: one run per multiple of its event rate (default: 1)")
    p.add_argument("--profile", default=None, metavar="YAML",
                   help="with --workload: the engine profile (default: the simulated engine's)")
    p.add_argument("--family-seed", type=int, default=None, metavar="S",
                   help="the family's seed (with --family-members)")
    p.add_argument("--family-members", type=_member_indices, default=None, metavar="9,24",
                   help="one run per family member, each on its own engine profile")
    p.add_argument("--robots", choices=ROBOT_MODES, default="queue",
                   help="how the simulated robots serve their tasks (timelyllm bench --robots)")
    p.add_argument("--duration-s", type=float, default=None,
                   help="shorten every run's arrivals to this many seconds")
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE",
                   help="write every run's figures here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


# ------------------------------------------------------------------------------------ the runs

@dataclass(frozen=True)
class Run:
    """One row of the tables: events replayed under every setting with one configuration."""

    label: str
    workload: Workload
    events: list[Event]
    config: BenchConfig
    run_kwargs: Mapping[str, Any]


def _check_sources(args: argparse.Namespace) -> None:
    family = args.family_seed is not None or args.family_members is not None
    if args.workload is None and not family:
        raise UsageError("give --workload, or --family-seed with --family-members")
    if args.workload is not None and family:
        raise UsageError("--workload: not with --family-seed / --family-members (one source "
                         "per sweep)")
    if family and (args.family_seed is None or args.family_members is None):
        raise UsageError("--family-seed and --family-members go together")
    if family and args.family_seed < 0:
        raise UsageError(f"--family-seed: must be >= 0, got {args.family_seed}")
    if family and (args.load_scale is not None or args.profile is not None):
        raise UsageError("--load-scale / --profile: not with the family (a member has its own "
                         "load and engine profile)")
    if args.duration_s is not None and not (args.duration_s > 0 and
                                            math.isfinite(args.duration_s)):
        raise UsageError(f"--duration-s: must be a number > 0, got {args.duration_s}")


def build_runs(args: argparse.Namespace) -> list[Run]:
    """The runs the arguments name (module docstring)."""
    _check_sources(args)
    if args.workload is None:
        runs = []
        for k in args.family_members:
            member = draw_member(args.family_seed, k, args.duration_s or MEMBER_DURATION_S)
            p = member.params
            config = BenchConfig(profile=member.profile, prompt_tokens=None, robots=args.robots)
            runs.append(Run(f"family s{p.family_seed} #{k} ({p.mix}, "
                            f"{p.profile.removeprefix('llama3-')}, load {p.load:.2f})",
                            member.workload, compose(member.workload), config, {}))
        return runs
    try:
        workload, events, run_kwargs = load_bench_workload(args.workload, None, args.duration_s)
    except WorkloadSourceError as exc:
        raise UsageError(f"--workload: {exc}") from None
    profile = None
    if args.profile is not None:
        from timelyllm_ros.core.engine.cost_model import EngineProfile, EngineProfileError
        try:
            profile = EngineProfile.from_yaml(args.profile)
        except EngineProfileError as exc:
            raise UsageError(f"--profile: {exc}") from None
    config = BenchConfig(profile=profile, prompt_tokens=None, robots=args.robots)
    if args.load_scale is None:
        return [Run(workload.name, workload, events, config, run_kwargs)]
    runs = []
    for scale in args.load_scale:
        try:
            scaled = scaled_workload(workload, scale)
        except ValueError as exc:
            raise UsageError(f"--load-scale: {exc}") from None
        runs.append(Run(f"{workload.name} x{scale:g}", scaled,
                        events if scale == 1 else compose(scaled), config, run_kwargs))
    return runs


# ----------------------------------------------------------------------------------- the sweep

def figures(tasks: Sequence[Any]) -> dict[str, float]:
    """What a cell shows: the mean utility and the deadline-miss rate (bench/metrics.py)."""
    m = bucket_metrics(tasks)
    return {"utility_mean": m["utility_mean"], "deadline_miss_rate": m["deadline_miss_rate"]}


def _replay_figures(replay: Callable[[str, BenchConfig, str], Sequence[Any]], policy: str,
                    config: BenchConfig, label: str) -> dict[str, Any]:
    """The figures of one replay; a replay that cannot finish (bench.replay.run_policy raises
    RuntimeError, e.g. stuck) gives NaN figures and its reason under "failed", and the sweep goes
    on: one setting that breaks the policy is itself a finding."""
    try:
        return figures(replay(policy, config, label))
    except RuntimeError as exc:
        return {"utility_mean": math.nan, "deadline_miss_rate": math.nan, "failed": str(exc)}


def sweep_run(run: Run, knobs: Mapping[str, Sequence[Any]], *,
              replay: Callable[[str, BenchConfig, str], Sequence[Any]]) -> dict[str, Any]:
    """One run's row: the baselines', the default's and every other knob value's figures.
    `replay(policy, config, label)` replays the run's events and returns the tasks."""
    row: dict[str, Any] = {"label": run.label, "tasks": sum(len(e.tasks) for e in run.events),
                           "baselines": {}, "knobs": {}}
    for name in BASELINES:
        row["baselines"][name] = _replay_figures(replay, name, run.config, name)
    default = _replay_figures(replay, SUBJECT, run.config, SUBJECT)
    row["default"] = default
    for knob, values in knobs.items():
        cells = []
        for value in values:
            if value == KNOBS[knob].default:
                cells.append(default)
                continue
            config = replace(run.config, policy_params={SUBJECT: {knob: value}})
            cells.append(_replay_figures(replay, SUBJECT, config, f"{knob}={value}"))
        row["knobs"][knob] = cells
    return row


def run_sweep(runs: Sequence[Run], knobs: Mapping[str, Sequence[Any]], *,
              progress: bool = True, log: Callable[[str], None] = lambda line: None
              ) -> dict[str, Any]:
    """Every run's row (`sweep_run`), as a document: {"knobs": {name: {"default", "values"}},
    "runs": [row, ...]}."""
    rows = []
    for run in runs:
        def replay(policy: str, config: BenchConfig, label: str, run: Run = run):
            started = time.perf_counter()
            try:
                result = run_policy(run.events, policy, run.workload, config,
                                    progress=ReplayProgress(f"{run.label} {label}",
                                                            enabled=progress),
                                    **run.run_kwargs)
            except RuntimeError as exc:
                log(f"{run.label} {label}: failed ({exc}), {time.perf_counter() - started:.0f} s")
                raise
            log(f"{run.label} {label}: {_cell(figures(result.tasks))}, "
                f"{time.perf_counter() - started:.0f} s")
            return result.tasks
        rows.append(sweep_run(run, knobs, replay=replay))
    return {"subject": SUBJECT, "baselines": list(BASELINES),
            "knobs": {k: {"default": KNOBS[k].default, "values": list(v)}
                      for k, v in knobs.items()},
            "runs": rows}


# ---------------------------------------------------------------------------------- the tables

def _cell(f: Mapping[str, Any]) -> str:
    if f.get("failed"):
        return "failed"
    return (f"{format_cell(f['utility_mean'], '{:.3f}')} "
            f"({format_cell(f['deadline_miss_rate'], 'pct')})")


def _value_label(value: Any, default: Any) -> str:
    text = "none" if value is None else f"{value:g}"
    return text + ("*" if value == default else "")


def best_baseline(row: Mapping[str, Any]) -> str:
    """The baseline with the higher mean utility (NaN lowest; the first of equals)."""
    def key(name: str) -> float:
        u = row["baselines"][name]["utility_mean"]
        return u if u is not None and math.isfinite(u) else -math.inf
    return max(row["baselines"], key=key)


def knob_table(doc: Mapping[str, Any], knob: str, markdown: bool = False) -> str:
    """The knob's table: one row per run, one column per value, then the best baseline."""
    spec = doc["knobs"][knob]
    header = ["run", *(f"{knob} {_value_label(v, spec['default'])}" if i == 0
                       else _value_label(v, spec["default"])
                       for i, v in enumerate(spec["values"])), "best baseline"]
    rows = []
    for row in doc["runs"]:
        best = best_baseline(row)
        rows.append([row["label"], *(_cell(c) for c in row["knobs"][knob]),
                     f"{_cell(row['baselines'][best])} {best.removeprefix('vllm-')}"])
    if markdown:
        return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                          *("| " + " | ".join(r) + " |" for r in rows)])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for j, r in enumerate([header, *rows]):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_sweep(doc: Mapping[str, Any]) -> str:
    """Every knob's table, with what a cell means."""
    out = [f"{doc['subject']}: mean utility (deadline misses %), one knob moved at a time "
           f"(* the default); best baseline: the better of {' / '.join(doc['baselines'])}"]
    for knob in doc["knobs"]:
        out += ["", knob_table(doc, knob)]
    failed = [(row["label"], knob, value, cell["failed"]) for row in doc["runs"]
              for knob, spec in doc["knobs"].items()
              for value, cell in zip(spec["values"], row["knobs"][knob]) if cell.get("failed")]
    if failed:
        out += ["", "failed replays:"]
        out += [f"  {label}, {knob} {value}: {reason}" for label, knob, value, reason in failed]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        knobs: dict[str, tuple[Any, ...]] = {}
        for text in args.knob or list(KNOBS):
            name, values = parse_knob(text)
            if name in knobs:
                raise UsageError(f"--knob: {name} is given twice")
            knobs[name] = values
        runs = build_runs(args)
    except UsageError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    replays = len(BASELINES) + 1 + sum(sum(v != KNOBS[k].default for v in vs)
                                       for k, vs in knobs.items())
    print(f"{len(runs)} run(s) x {replays} replays", file=sys.stderr)
    try:
        doc = run_sweep(runs, knobs, progress=not args.no_progress,
                        log=lambda line: print(line, file=sys.stderr, flush=True))
    except RuntimeError as exc:  # a replay that cannot finish (bench.replay.run_policy)
        print(f"{parser.prog}: replay failed: {exc}", file=sys.stderr)
        return 1
    doc["command"] = " ".join([parser.prog, *(sys.argv[1:] if argv is None else argv)])
    print(format_sweep(doc))
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(json_safe(doc), indent=1) + "\n",
                                        encoding="utf-8")
        print(f"wrote {args.json_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
