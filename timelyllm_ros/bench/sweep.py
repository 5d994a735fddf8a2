"""The batch-cap sweep (the paper's Fig. 8): every policy replayed again at each fixed cap on
running generations, summarised as mean utility and mean waiting time per cap."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.metrics import compute_metrics
from timelyllm_ros.bench.replay import ProgressFn, run_policies
from timelyllm_ros.lrtrace.workload import Event, Workload


def sweep_batch_caps(events: Sequence[Event], policies: Sequence[str], workload: Workload,
                     config: BenchConfig, caps: Sequence[int], *,
                     progress_factory: Callable[[str], ProgressFn] | None = None,
                     engine: Any = None, **run_kwargs: Any) -> dict[str, Any]:
    """{"batch_cap": caps, "policies": {name: {"utility_mean": [...], "waiting_time_mean_s":
    [...], "by_type_utility": [...]}}}, one entry per cap in each list. `progress_factory(label)`
    gets labels "cap N: policy"."""
    sweep: dict[str, Any] = {
        "batch_cap": list(caps),
        "policies": {n: {"utility_mean": [], "waiting_time_mean_s": [], "by_type_utility": []}
                     for n in policies}}
    for cap in caps:
        capped = replace(config, batch_cap=cap)
        runs = run_policies(events, policies, workload, capped,
                            progress_factory=_prefixed(progress_factory, f"cap {cap}: "),
                            engine=engine, **run_kwargs)
        for name, run in runs.items():
            m = compute_metrics(run.tasks, run.fetch_overhead_s)
            entry = sweep["policies"][name]
            entry["utility_mean"].append(m["overall"]["utility_mean"])
            entry["waiting_time_mean_s"].append(m["overall"]["waiting_time_mean_s"])
            entry["by_type_utility"].append(
                {t: b["utility_mean"] for t, b in m["by_type"].items()})
    return sweep


def _prefixed(progress_factory: Callable[[str], ProgressFn] | None,
              prefix: str) -> Callable[[str], ProgressFn] | None:
    if progress_factory is None:
        return None
    return lambda name: progress_factory(prefix + name)


def format_sweep(sweep: dict[str, Any]) -> str:
    """The sweep as a table: one row per cap, per policy mean utility (mean waiting time, ms)."""
    caps = sweep["batch_cap"]
    names = list(sweep["policies"])
    rows = []
    for i, cap in enumerate(caps):
        cells = [str(cap)]
        for n in names:
            u = sweep["policies"][n]["utility_mean"][i]
            w = sweep["policies"][n]["waiting_time_mean_s"][i]
            cells.append(f"{u:.3f} ({w * 1e3:.0f})")
        rows.append(cells)
    header = ["cap", *names]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["batch-cap sweep: mean utility (mean waiting time, ms)"]
    for r in [header, *rows]:
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    return "\n".join(lines)
