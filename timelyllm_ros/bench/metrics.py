"""The paper's metrics (§7.1), per task type and overall, as JSON and as a plain-text table.

- utility: the TUF of the task's response time (Eq. 1);
- response time: task arrival until the first segment reaches the robot;
- waiting time: completion time minus robot execution time (minus time the robot spent on other
  tasks, see replay.py), i.e. the delay LLM planning added to the task;
- p50, p90 and p99 response time, and the deadline-miss rate (share of tasks whose response time
  exceeds the ERT of their TUF);
- scheduling overhead: mean time per priority recompute + sort before a fetch, in ms.

Beside them, per policy, the same figures with the response as the TimelyLLM authors measure it
(`first_action`): from the request to the moment the robot starts its first non-empty segment,
which also counts the time the robot spends finishing earlier work; and the segments each task
is delivered in (`segments_per_task`). docs/fidelity.md reports them.

Metrics are taken over tasks that got a response (a first segment). A task that failed before
that has no response time; such tasks are counted in `tasks_without_response` of the workload
block by the CLI, not silently averaged in.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

METRIC_KEYS = ("utility_mean", "response_time_mean_s", "waiting_time_mean_s",
               "response_time_p50_s", "response_time_p90_s", "response_time_p99_s",
               "deadline_miss_rate")
# The figures of a `first_action` bucket (`first_action_metrics`).
FIRST_ACTION_KEYS = ("utility_mean", "response_time_mean_s", "response_time_p50_s",
                     "response_time_p90_s", "response_time_p99_s", "deadline_miss_rate",
                     "segments_per_task", "tasks", "tasks_without_first_action")
# Display order of the known task types; others follow alphabetically.
TYPE_ORDER = ("drone-normal", "drone-urgent", "arm", "chat")


def _finite(values: Iterable[float]) -> np.ndarray:
    arr = np.asarray([float(v) for v in values], dtype=float)
    return arr[np.isfinite(arr)]


def _mean(values: Iterable[float]) -> float:
    arr = _finite(values)
    return float(arr.mean()) if arr.size else math.nan


def bucket_metrics(tasks: Sequence[Any]) -> dict[str, float]:
    """The metrics of METRIC_KEYS over `tasks` (objects with utility, response_time_s,
    waiting_time_s, ert_s)."""
    responded = [t for t in tasks if math.isfinite(float(t.response_time_s))]
    rt = _finite(t.response_time_s for t in responded)
    miss = [float(t.response_time_s) > float(t.ert_s) for t in responded]
    p50, p90, p99 = np.percentile(rt, (50, 90, 99)) if rt.size else (math.nan,) * 3
    return {
        "utility_mean": _mean(t.utility for t in responded),
        "response_time_mean_s": float(rt.mean()) if rt.size else math.nan,
        "waiting_time_mean_s": _mean(t.waiting_time_s for t in responded),
        "response_time_p50_s": float(p50),
        "response_time_p90_s": float(p90),
        "response_time_p99_s": float(p99),
        "deadline_miss_rate": float(np.mean(miss)) if miss else math.nan,
    }


def first_action_s(task: Any) -> float:
    """The task's response as the TimelyLLM authors measure it: from its request to the moment
    its robot starts executing the first non-empty segment of its plan (their resdata.py:
    "Start executing" of the first piece of plan minus "Generating request"). Unlike
    `response_time_s` (the first segment reaching the robot) it counts the time the robot still
    spends on earlier segments, its own or another task's. NaN if no such segment started."""
    for seg in sorted(task.segments, key=lambda s: s.sequence):
        if seg.text.strip():
            return float(seg.started_s) - float(task.arrival_s)
    return math.nan


def _percentiles(values: np.ndarray, qs: Sequence[float]) -> list[float]:
    """np.percentile's default (linear) percentiles of a non-empty array that may hold inf:
    where a percentile's rank reaches an infinite value it reads inf (numpy would give NaN)."""
    v = np.sort(values)
    out = []
    for q in qs:
        h = (len(v) - 1) * q / 100.0
        lo, hi = math.floor(h), math.ceil(h)
        out.append(math.inf if not math.isfinite(v[hi])
                   else float(v[lo] + (v[hi] - v[lo]) * (h - lo)))
    return out


def first_action_bucket(tasks: Sequence[Any]) -> dict[str, float]:
    """The figures of FIRST_ACTION_KEYS over `tasks`, with the response of `first_action_s` and
    utility = the task's TUF of it (`task.tuf`; NaN where the run does not record TUFs).

    A task whose robot never started a segment (shed, failed, rejected) is not left out, as
    the authors' summary leaves out a task it dropped: it is counted in
    `tasks_without_first_action`, as late, as an infinite response in the percentiles (so a
    percentile it reaches reads inf), and with the utility the bench gave it (for a shed task,
    its TUF at the moment it was refused, <= 0)."""
    if not tasks:
        return {k: math.nan for k in FIRST_ACTION_KEYS} | {"tasks": 0,
                                                           "tasks_without_first_action": 0}
    tasks = list(tasks)
    first = np.array([first_action_s(t) for t in tasks], dtype=float)
    started = np.isfinite(first)
    rt = np.where(started, first, np.inf)
    utilities = []
    for t, r, ok in zip(tasks, first, started):
        if ok:
            utilities.append(float(t.tuf.utility(r)) if t.tuf is not None else math.nan)
        else:
            utilities.append(float(t.utility))
    late = ~started | (rt > np.array([float(t.ert_s) for t in tasks]))
    p50, p90, p99 = _percentiles(rt, (50, 90, 99))
    return {
        "utility_mean": _mean(utilities) if all(t.tuf is not None for t in tasks) else math.nan,
        "response_time_mean_s": float(first[started].mean()) if started.any() else math.nan,
        "response_time_p50_s": float(p50),
        "response_time_p90_s": float(p90),
        "response_time_p99_s": float(p99),
        "deadline_miss_rate": float(np.mean(late)),
        "segments_per_task": segments_per_task(tasks),
        "tasks": len(tasks),
        "tasks_without_first_action": int(np.count_nonzero(~started)),
    }


def deliveries(task: Any) -> int:
    """How many pieces the task's plan reached its robot in: segments dispatched at the same
    moment (a whole plan sent at once) count as one, as the authors count one output each."""
    return len({float(s.dispatched_s) for s in task.segments})


def segments_per_task(tasks: Sequence[Any]) -> float:
    """Mean `deliveries` over the tasks that got at least one segment."""
    counts = [deliveries(t) for t in tasks if t.segments]
    return float(np.mean(counts)) if counts else math.nan


def first_action_metrics(tasks: Sequence[Any]) -> dict[str, Any]:
    """`{"overall": {...}, "by_type": {type: {...}}}` of `first_action_bucket`."""
    return {"overall": first_action_bucket(tasks),
            "by_type": {name: first_action_bucket([t for t in tasks if t.task_type == name])
                        for name in ordered_types(t.task_type for t in tasks)}}


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


def results_json(runs: Mapping[str, Any], workload: Mapping[str, Any],
                 first_action: bool = False) -> dict[str, Any]:
    """The bench's JSON document for RunResults keyed by policy name; with `first_action`
    (`timelyllm bench` asks for it) each policy also carries `first_action_metrics`."""
    policies = {}
    for name, run in runs.items():
        policies[name] = compute_metrics(run.tasks, run.fetch_overhead_s)
        if first_action:
            policies[name]["first_action"] = first_action_metrics(run.tasks)
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


_FIRST_ACTION_COLUMNS = (
    ("utility_mean", "utility", "{:.3f}"),
    ("response_time_p50_s", "p50_ms", "ms"),
    ("response_time_p90_s", "p90_ms", "ms"),
    ("response_time_p99_s", "p99_ms", "ms"),
    ("deadline_miss_rate", "late%", "pct"),
    ("segments_per_task", "segs/task", "{:.2f}"),
    ("tasks_without_first_action", "no_action", "{:d}"),
)


def format_first_action_table(doc: Mapping[str, Any]) -> str:
    """The `first_action` figures of every policy as plain-text columns (one row per policy and
    task type, overall first), under a line that says what the response is; "" if the document
    has none."""
    rows = []
    for name, m in doc["policies"].items():
        fa = m.get("first_action")
        if not fa:
            continue
        for i, (tname, bucket) in enumerate([("overall", fa["overall"]), *fa["by_type"].items()]):
            rows.append([name if i == 0 else "", tname,
                         *("inf" if bucket.get(k) == math.inf else format_cell(bucket.get(k), how)
                           for k, _, how in _FIRST_ACTION_COLUMNS)])
    if not rows:
        return ""
    header = ["policy", "type", *(c[1] for c in _FIRST_ACTION_COLUMNS)]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["Response as the TimelyLLM authors measure it: request to the robot starting its "
             "first non-empty segment"]
    for j, r in enumerate([header, *rows]):
        lines.append("  ".join(str(c).ljust(widths[i]) if i < 2 else str(c).rjust(widths[i])
                               for i, c in enumerate(r)).rstrip())
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
