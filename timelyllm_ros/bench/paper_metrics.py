"""The seed papers' own headline figures, for runs on their workloads (paper_workloads.py).

- latency: arrival until the request's last segment was delivered (end-to-end latency, tool or
  reading pauses included), mean and p99: MC-SF's total latency, LAMPS's end-to-end latency;
- makespan: first arrival until the last request was delivered: the hybrid paper's total time;
- per task type, the deadline-miss rate of the first segment (for BROS's RT chat, the
  TTFT-attainment counterpart: 1 - attainment) and the utility;
- BE throughput: best-effort output tokens delivered per second of the run (BROS's BE metric).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from timelyllm_ros.bench.metrics import ordered_types

PAPER_COLUMNS = (
    ("utility_mean", "utility", "{:.3f}"),
    ("latency_mean_s", "lat_s", "{:.2f}"),
    ("latency_p99_s", "p99_lat_s", "{:.2f}"),
    ("makespan_s", "makespan_s", "{:.1f}"),
    ("be_tokens_per_s", "BE_tok/s", "{:.0f}"),
)


def _nanmean(values: Sequence[float]) -> float:
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    return float(arr.mean()) if arr.size else math.nan


def paper_metrics(tasks: Sequence[Any]) -> dict[str, Any]:
    """Headline figures of one run; `tasks` are bench.results.TaskResult objects."""
    lat = np.asarray([t.latency_s for t in tasks], dtype=float)
    lat = lat[np.isfinite(lat)]
    delivered = [t.arrival_s + t.latency_s for t in tasks if math.isfinite(t.latency_s)]
    start = min((t.arrival_s for t in tasks), default=0.0)
    makespan = (max(delivered) - start) if delivered else math.nan
    be = [t for t in tasks if t.task_type.endswith("-be") and t.state == "done"]
    be_tokens = sum(t.generated_tokens for t in be)
    by_type = {}
    for name in ordered_types(t.task_type for t in tasks):
        sub = [t for t in tasks if t.task_type == name]
        responded = [t for t in sub if math.isfinite(t.response_time_s)]
        by_type[name] = {
            "tasks": len(sub),
            "done": sum(t.state == "done" for t in sub),
            "utility_mean": _nanmean([t.utility for t in responded]),
            "latency_mean_s": _nanmean([t.latency_s for t in sub]),
            "first_segment_miss_rate": (float(np.mean([t.response_time_s > t.ert_s
                                                        for t in responded]))
                                        if responded else math.nan),
        }
    return {
        "utility_mean": _nanmean([t.utility for t in tasks]),
        "latency_mean_s": float(lat.mean()) if lat.size else math.nan,
        "latency_p99_s": float(np.percentile(lat, 99)) if lat.size else math.nan,
        "makespan_s": makespan,
        "be_tokens_per_s": (be_tokens / makespan) if be and makespan > 0 else math.nan,
        "done": sum(t.state == "done" for t in tasks),
        "tasks": len(tasks),
        "by_type": by_type,
    }


def format_paper_table(per_policy: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per policy with the headline figures, then each type's first-segment miss rate."""
    types = ordered_types({t for m in per_policy.values() for t in m["by_type"]})
    header = ["policy", *(c[1] for c in PAPER_COLUMNS), *(f"miss%:{t}" for t in types)]
    rows = []
    for name, m in per_policy.items():
        cells = [name]
        for key, _, fmt in PAPER_COLUMNS:
            v = m[key]
            cells.append("-" if v is None or not math.isfinite(v) else fmt.format(v))
        for t in types:
            v = m["by_type"].get(t, {}).get("first_segment_miss_rate", math.nan)
            cells.append("-" if not math.isfinite(v) else f"{100 * v:.1f}")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for j, r in enumerate([header, *rows]):
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                               for i, c in enumerate(r)))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
