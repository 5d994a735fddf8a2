"""The load sweep: every policy replayed at several multiples of the workload's event rate, with
the upper bound (bench/bound.py) at each, into overload.

Load scale s composes the workload again with `eps * s` and the same seed and duration, so every
policy at one load replays the same events. A load is **overload** when the best of the baselines
that ran (`vllm-stream`, `vllm-priority`: the one with fewer misses) misses more than 10 % of
deadlines (response time > ERT).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from timelyllm_ros.bench.metrics import format_cell
from timelyllm_ros.bench.bound import bound_block, fraction_of_bound, upper_bound
from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.metrics import compute_metrics
from timelyllm_ros.bench.replay import ProgressFn, run_policies
from timelyllm_ros.bench.results import RunResult
from timelyllm_ros.lrtrace.workload import Event, Workload, compose

# The baselines a user would run instead of TimelyLLM; overload is judged by the better of them.
BASELINES = ("vllm-stream", "vllm-priority")
OVERLOAD_MISS_RATE = 0.10
# Per policy and load, from its overall metrics.
SERIES = ("utility_mean", "response_time_mean_s", "response_time_p99_s", "deadline_miss_rate")


def scaled_workload(workload: Workload, scale: float) -> Workload:
    """The workload with its event rate multiplied by `scale` (same seed, same duration)."""
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"load scale must be a positive number, got {scale!r}")
    if not workload.eps > 0:
        raise ValueError(f"workload {workload.name}: an event list has no event rate to scale "
                         "(use a workload preset or workload file)")
    return replace(workload, eps=workload.eps * scale)


def sweep_loads(workload: Workload, policies: Sequence[str], config: BenchConfig,
                scales: Sequence[float], *,
                base: tuple[Sequence[Event], Mapping[str, RunResult]] | None = None,
                progress_factory: Callable[[str], ProgressFn] | None = None,
                announce: Callable[[str], None] | None = None,
                engine: Any = None, **run_kwargs: Any) -> dict[str, Any]:
    """The sweep as the results document's `load_sweep` block:

        {"load_scale": [...], "events_per_s": [...], "events": [...], "tasks": [...],
         "baselines": [...], "best_baseline_miss_rate": [...], "overload": [...],
         "overload_miss_rate": 0.1,
         "bound": {"utility_mean": [...], "response_time_mean_s": [...], ...},
         "policies": {name: {"utility_mean": [...], "response_time_mean_s": [...],
                             "response_time_p99_s": [...], "deadline_miss_rate": [...],
                             "utility_fraction_of_bound": [...], "by_type_utility": [...],
                             "tasks_without_response": [...]}}}

    one entry per scale in each list. `base` = (events, runs) of the run at scale 1, reused when
    1 is among the scales. `progress_factory(label)` gets labels "xS policy"; `announce`
    receives one line per load before its replays."""
    baselines = [b for b in BASELINES if b in policies]
    sweep: dict[str, Any] = {
        "load_scale": [], "events_per_s": [], "events": [], "tasks": [],
        "baselines": baselines, "best_baseline_miss_rate": [], "overload": [],
        "overload_miss_rate": OVERLOAD_MISS_RATE,
        "bound": {k: [] for k in SERIES},
        "policies": {n: {**{k: [] for k in SERIES}, "utility_fraction_of_bound": [],
                         "by_type_utility": [], "tasks_without_response": []}
                     for n in policies}}
    for scale in scales:
        scaled = scaled_workload(workload, scale)
        if base is not None and scale == 1:
            events, runs = base
        else:
            events, runs = compose(scaled), None
        n_tasks = sum(len(e.tasks) for e in events)
        if announce is not None:
            announce(f"load x{scale:g}: {scaled.eps:g} events/s, {len(events)} events, "
                     f"{n_tasks} tasks")
        if runs is None:
            try:
                runs = run_policies(events, policies, scaled, config,
                                    progress_factory=_prefixed(progress_factory, f"x{scale:g} "),
                                    engine=engine, **run_kwargs)
            except RuntimeError as exc:
                hint = ""
                if config.robots == "queue":
                    hint = (f" (the workload's {workload.agents} robots may be saturated at this "
                            "load, each working off its queue long after the last arrival: "
                            "--robots parallel gives every task its own robot)")
                raise RuntimeError(f"load x{scale:g}: {exc}{hint}") from exc
        bound = bound_block(upper_bound(events, scaled, config, **run_kwargs))
        _append_load(sweep, scale, scaled, events, n_tasks, runs, bound)
    return sweep


def _append_load(sweep: dict[str, Any], scale: float, workload: Workload,
                 events: Sequence[Event], n_tasks: int, runs: Mapping[str, RunResult],
                 bound: Mapping[str, Any]) -> None:
    sweep["load_scale"].append(scale)
    sweep["events_per_s"].append(workload.eps)
    sweep["events"].append(len(events))
    sweep["tasks"].append(n_tasks)
    for key in SERIES:
        sweep["bound"][key].append(bound["overall"][key])
    bound_u = bound["overall"]["utility_mean"]
    for name, run in runs.items():
        m = compute_metrics(run.tasks)
        entry = sweep["policies"][name]
        for key in SERIES:
            entry[key].append(m["overall"][key])
        entry["utility_fraction_of_bound"].append(
            fraction_of_bound(m["overall"]["utility_mean"], bound_u))
        entry["by_type_utility"].append({t: b["utility_mean"] for t, b in m["by_type"].items()})
        entry["tasks_without_response"].append(
            sum(1 for t in run.tasks if not math.isfinite(t.response_time_s)))
    best, overload = overload_at({b: sweep["policies"][b]["deadline_miss_rate"][-1]
                                  for b in sweep["baselines"]}, sweep["overload_miss_rate"])
    sweep["best_baseline_miss_rate"].append(best)
    sweep["overload"].append(overload)


def overload_at(baseline_miss_rates: Mapping[str, float | None],
                threshold: float = OVERLOAD_MISS_RATE) -> tuple[float, bool]:
    """(the best baseline's deadline-miss rate, whether that is overload): the best baseline is
    the one that misses fewest; overload when even it misses more than `threshold`. No baseline
    with a miss rate: (NaN, False)."""
    rates = [r for r in baseline_miss_rates.values() if r is not None and math.isfinite(r)]
    if not rates:
        return math.nan, False
    best = min(rates)
    return best, best > threshold


def _prefixed(progress_factory: Callable[[str], ProgressFn] | None,
              prefix: str) -> Callable[[str], ProgressFn] | None:
    if progress_factory is None:
        return None
    return lambda name: progress_factory(prefix + name)


def _cell(value: Any, how: str) -> str:
    # The sweep table's cells: utilities to 3 decimals, times in whole milliseconds.
    return format_cell(value, "{:.3f}" if how == "u" else how, ms_digits=0)


def load_sweep_rows(sweep: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the sweep's table: per load, one row per policy and one for the bound;
    the load cell says "overload" where the best baseline misses > 10 % of deadlines."""
    header = ["load", "events/s", "tasks", "policy", "utility", "of bound", "p99 ms", "miss %"]
    rows = []
    for i, scale in enumerate(sweep["load_scale"]):
        load = f"x{scale:g}" + (" overload" if sweep["overload"][i] else "")
        first = [load, f"{sweep['events_per_s'][i]:g}", str(sweep["tasks"][i])]
        for name, entry in sweep["policies"].items():
            rows.append([*first, name, _cell(entry["utility_mean"][i], "u"),
                         _cell(entry["utility_fraction_of_bound"][i], "u"),
                         _cell(entry["response_time_p99_s"][i], "ms"),
                         _cell(entry["deadline_miss_rate"][i], "pct")])
            first = ["", "", ""]
        b = sweep["bound"]
        rows.append([*first, "bound", _cell(b["utility_mean"][i], "u"), "1.000",
                     _cell(b["response_time_p99_s"][i], "ms"),
                     _cell(b["deadline_miss_rate"][i], "pct")])
    return header, rows


def format_load_sweep(sweep: Mapping[str, Any]) -> str:
    """The sweep as a plain-text table (see `load_sweep_rows`)."""
    header, rows = load_sweep_rows(sweep)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    baselines = " / ".join(sweep["baselines"]) or "no baseline ran"
    lines = [f"load sweep: mean utility, fraction of the bound, p99 response, deadline misses "
             f"(overload: the best of {baselines} misses > "
             f"{sweep['overload_miss_rate'] * 100:g} %)"]
    for j, r in enumerate([header, *rows]):
        lines.append("  ".join(c.ljust(w) if i < 4 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_load_sweep_markdown(sweep: Mapping[str, Any]) -> str:
    """The same table in Markdown (docs/bench.md)."""
    header, rows = load_sweep_rows(sweep)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
