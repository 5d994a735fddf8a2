"""The paper's metrics (§7.1), per task type and overall, as JSON and as a plain-text table.

- utility: the TUF of the task's response time (Eq. 1);
- response time: task arrival until the first segment reaches the robot;
- waiting time: completion time minus robot execution time (minus time the robot spent on other
  tasks, see replay.py), i.e. the delay LLM planning added to the task;
- p99 response time, and the deadline-miss rate (share of tasks whose response time exceeds the
  ERT of their TUF);
- scheduling overhead: mean time per priority recompute + sort before a fetch, in ms.

Metrics are taken over tasks that got a response (a first segment). A task that failed before
that has no response time; such tasks are counted in `tasks_without_response` of the workload
block by the CLI, not silently averaged in.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

METRIC_KEYS = ("utility_mean", "response_time_mean_s", "waiting_time_mean_s",
               "response_time_p99_s", "deadline_miss_rate")
# Display order of the known task types; others follow alphabetically.
TYPE_ORDER = ("drone-normal", "drone-urgent", "arm", "chat")


def _finite(values: Iterable[float]) -> np.ndarray:
    arr = np.asarray([float(v) for v in values], dtype=float)
    return arr[np.isfinite(arr)]


def _mean(values: Iterable[float]) -> float:
    arr = _finite(values)
    return float(arr.mean()) if arr.size else math.nan


def bucket_metrics(tasks: Sequence[Any]) -> dict[str, float]:
    """The five metrics over `tasks` (objects with utility, response_time_s, waiting_time_s,
    ert_s)."""
    responded = [t for t in tasks if math.isfinite(float(t.response_time_s))]
    rt = _finite(t.response_time_s for t in responded)
    miss = [float(t.response_time_s) > float(t.ert_s) for t in responded]
    return {
        "utility_mean": _mean(t.utility for t in responded),
        "response_time_mean_s": float(rt.mean()) if rt.size else math.nan,
        "waiting_time_mean_s": _mean(t.waiting_time_s for t in responded),
        "response_time_p99_s": float(np.percentile(rt, 99)) if rt.size else math.nan,
        "deadline_miss_rate": float(np.mean(miss)) if miss else math.nan,
    }


def ordered_types(types: Iterable[str]) -> list[str]:
    present = set(types)
    known = [t for t in TYPE_ORDER if t in present]
    return known + sorted(present - set(TYPE_ORDER))


def compute_metrics(tasks: Sequence[Any], fetch_overhead_s: Sequence[float] = ()) -> dict[str, Any]:
    """`{"overall": {...}, "by_type": {type: {...}}, "scheduling_overhead_ms": x}` for one policy.

    `tasks` are TaskResult-like objects (attributes task_type, utility, response_time_s,
    waiting_time_s, ert_s).
    """
    by_type = {}
    for name in ordered_types(t.task_type for t in tasks):
        by_type[name] = bucket_metrics([t for t in tasks if t.task_type == name])
    overhead = float(np.mean(fetch_overhead_s)) * 1e3 if len(fetch_overhead_s) else 0.0
    return {"overall": bucket_metrics(tasks), "by_type": by_type,
            "scheduling_overhead_ms": overhead}


def results_json(runs: Mapping[str, Any], workload: Mapping[str, Any]) -> dict[str, Any]:
    """The bench's JSON document for RunResults keyed by policy name."""
    policies = {}
    for name, run in runs.items():
        policies[name] = compute_metrics(run.tasks, run.fetch_overhead_s)
        if run.pauses:
            policies[name]["pauses"] = dict(run.pauses)
    return {"policies": policies, "workload": dict(workload)}


def json_safe(value: Any) -> Any:
    """NaN/inf -> None, recursively (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return json_safe(value.item())
    return value


# ------------------------------------------------------------------------------- the table

_COLUMNS = (
    ("utility_mean", "utility", "{:.3f}"),
    ("response_time_mean_s", "resp_ms", "ms"),
    ("waiting_time_mean_s", "wait_ms", "ms"),
    ("response_time_p99_s", "p99_ms", "ms"),
    ("deadline_miss_rate", "miss%", "pct"),
)


def format_cell(value: Any, how: str, ms_digits: int = 1) -> str:
    """One table cell: "-" for a missing or non-finite value; "ms" seconds as milliseconds,
    "pct" a rate as a percentage, otherwise `how` is a format string."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if how == "ms":
        return f"{value * 1e3:.{ms_digits}f}"
    if how == "pct":
        return f"{value * 100:.1f}"
    return how.format(value)


_NOTE_ROWS = ("sched overhead", "KV pauses")


def format_table(doc: Mapping[str, Any]) -> str:
    """Plain-text columns: one row per (policy, type), overall first, then the overhead. With an
    upper bound in the document (`doc["bound"]`, bench/bound.py) it is the last row, and each
    policy's overall row has its utility as a fraction of the bound's."""
    bound = doc.get("bound")
    extra = ["of_bound"] if bound is not None else []
    header = ["policy", "type", *(c[1] for c in _COLUMNS), *extra]

    def cells(bucket: Mapping[str, Any]) -> list[str]:
        return [format_cell(bucket.get(k), how) for k, _, how in _COLUMNS]

    rows = []
    for name, m in doc["policies"].items():
        rows.append([name, "overall", *cells(m["overall"]),
                     *([format_cell(m.get("utility_fraction_of_bound"), "{:.3f}")] if extra else [])])
        for tname, bucket in m["by_type"].items():
            rows.append(["", tname, *cells(bucket), *([""] if extra else [])])
        rows.append(["", "sched overhead", f"{m['scheduling_overhead_ms']:.3f} ms/fetch",
                     "", "", "", "", *([""] if extra else [])])
        if m.get("pauses"):
            rows.append(["", "KV pauses", format_pauses(m["pauses"]),
                         "", "", "", "", *([""] if extra else [])])
    if bound is not None:
        rows.append(["bound", "overall", *cells(bound["overall"]), "1.000"])
        for tname, bucket in bound["by_type"].items():
            rows.append(["", tname, *cells(bucket), ""])
    # (The two note rows print their text across the columns: they do not set the widths.)
    table = [header, *(r for r in rows if r[1] not in _NOTE_ROWS)]
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header))]
    lines = []
    for j, r in enumerate([header, *rows]):
        cells_ = [str(c).ljust(widths[i]) if i < 2 else str(c).rjust(widths[i])
                  for i, c in enumerate(r)]
        if r[1] in _NOTE_ROWS:
            cells_ = [str(r[0]).ljust(widths[0]), str(r[1]).ljust(widths[1]), r[2]]
        lines.append("  ".join(cells_).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_pauses(p: Mapping[str, int]) -> str:
    """'preserve 120, discard 30; 4 evicted at admission, 212 tokens recomputed'."""
    held = ", ".join(f"{h} {p[h]}" for h in ("preserve", "discard", "swap") if p.get(h))
    return (f"{held or 'no suspensions'}; {p.get('evictions', 0)} evicted at admission, "
            f"{p.get('recomputed_tokens', 0)} tokens recomputed")


def format_ratios(doc: Mapping[str, Any], baseline: str = "vllm",
                  target: str = "timelyllm") -> str:
    """One line comparing `target` with `baseline` on the headline numbers, if both ran."""
    pols = doc["policies"]
    if baseline not in pols or target not in pols:
        return ""
    a, b = pols[target]["overall"], pols[baseline]["overall"]
    parts = []
    if b["utility_mean"] and math.isfinite(b["utility_mean"]) and b["utility_mean"] > 0:
        parts.append(f"utility {a['utility_mean'] / b['utility_mean']:.2f}x")
    else:
        parts.append(f"utility {a['utility_mean']:.3f} vs {b['utility_mean']:.3f}")
    if b["waiting_time_mean_s"] and b["waiting_time_mean_s"] > 0:
        parts.append(f"waiting time {100 * (1 - a['waiting_time_mean_s'] / b['waiting_time_mean_s']):.1f}% lower")
    return f"{target} vs {baseline}: " + ", ".join(parts)
