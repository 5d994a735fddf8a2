"""The paper's figures from bench results (matplotlib, Agg backend; nothing is shown on screen).

- `plot_by_type`       (cf. Fig. 5): mean utility, response time and waiting time per task type,
                       one bar per policy.
- `plot_timeline`      (cf. Fig. 6): for a few tasks of one event, when each segment was being
                       generated and when the robot executed it, one panel per policy.
- `plot_batch_sweep`   (cf. Fig. 8): mean utility (and waiting time) against the batch cap.
- `plot_algorithms`    (cf. Fig. 8, algorithms): overall utility and waiting time per policy,
                       with per-type utility, for the scheduling variants incl. slack scalings.
- `plot_load_sweep`    mean utility and p99 response time against the load (events/s), per
                       policy, with the upper bound; overloaded loads shaded.

Each function writes one PNG and returns its path.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import ScalarFormatter  # noqa: E402

from timelyllm_ros.bench.metrics import compute_metrics, ordered_types  # noqa: E402


def _nan_to_zero(v: Any) -> float:
    return 0.0 if v is None or (isinstance(v, float) and not math.isfinite(v)) else float(v)


def _grouped_bars(ax, groups: Sequence[str], series: Mapping[str, Sequence[float]], ylabel: str,
                  scale: float = 1.0) -> None:
    n = max(1, len(series))
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [_nan_to_zero(v) * scale for v in values], width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel(ylabel)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.grid(axis="y", alpha=0.3)


def _auto_scale(ax, values: Sequence[Any], kind: str, scale: float = 1.0) -> None:
    """Keep bars of very different size readable: symlog for a utility far below zero (the TUF is
    not clipped: an overloaded baseline reaches -40 next to TimelyLLM's 1.4), log for times that
    span more than a factor of 20."""
    vals = [_nan_to_zero(v) * scale for v in values]
    if not vals:
        return
    if kind == "utility" and min(vals) < -3:
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylabel(ax.get_ylabel() + " (symlog)")
    elif kind == "time":
        positive = [v for v in vals if v > 0]
        if positive and max(positive) / min(positive) > 20:
            ax.set_yscale("log")
            ax.set_ylim(bottom=min(positive) / 2)
            ax.set_ylabel(ax.get_ylabel() + " (log)")


def plot_by_type(doc: Mapping[str, Any], path: str | Path, title: str = "") -> Path:
    """Fig. 5: utility / response time / waiting time per task type (and overall) per policy."""
    policies = doc["policies"]
    types = ordered_types(t for m in policies.values() for t in m["by_type"])
    groups = [*types, "overall"]

    def series(key: str) -> dict[str, list[float]]:
        return {name: [*(m["by_type"].get(t, {}).get(key) for t in types), m["overall"][key]]
                for name, m in policies.items()}

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    _grouped_bars(axes[0], groups, series("utility_mean"), "mean time utility")
    _grouped_bars(axes[1], groups, series("response_time_mean_s"), "mean response time (ms)", 1e3)
    _grouped_bars(axes[2], groups, series("waiting_time_mean_s"), "mean waiting time (ms)", 1e3)
    for ax, key, kind in ((axes[0], "utility_mean", "utility"),
                          (axes[1], "response_time_mean_s", "time"),
                          (axes[2], "waiting_time_mean_s", "time")):
        _auto_scale(ax, [v for vs in series(key).values() for v in vs], kind,
                    1e3 if kind == "time" else 1.0)
    axes[0].set_title("(a) time utility")
    axes[1].set_title("(b) response time")
    axes[2].set_title("(c) waiting time")
    axes[0].legend(fontsize=8, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def pick_timeline_tasks(runs: Mapping[str, Any], max_tasks: int = 4) -> list[str]:
    """Task ids of one event worth showing: the event (with at least two tasks) that mixes the
    most task types, preferring the one where the first policy's utility was worst."""
    first = next(iter(runs.values()))
    by_event: dict[int, list[Any]] = {}
    for t in first.tasks:
        by_event.setdefault(t.event_id, []).append(t)
    candidates = [ts for ts in by_event.values() if len(ts) >= 2] or list(by_event.values())
    if not candidates:
        return []

    def score(ts):
        # Prefer robots free for the task (the interleaving of generation and execution shows),
        # then the widest type mix, then the worst utility under the first policy.
        utilities = [t.utility for t in ts if math.isfinite(t.utility)]
        unblocked = sum(1 for t in ts if t.robot_blocked_s == 0)
        return (min(unblocked, max_tasks), len({t.task_type for t in ts}),
                -min(utilities, default=0.0), len(ts))

    chosen = max(candidates, key=score)
    # Keep the type mix when trimming: one task of each type first, then the rest.
    chosen.sort(key=lambda t: t.task_id)
    picked, seen = [], set()
    for t in chosen:
        if t.task_type not in seen:
            picked.append(t)
            seen.add(t.task_type)
    picked += [t for t in chosen if t not in picked]
    return sorted(t.task_id for t in picked[:max_tasks])


def plot_timeline(runs: Mapping[str, Any], path: str | Path, task_ids: Sequence[str] | None = None,
                  policies: Sequence[str] | None = None, window_s: float | None = None) -> Path:
    """Fig. 6: generation spans and robot execution spans of a few tasks, one panel per policy.

    Time is relative to the tasks' arrival. Dashed lines mark each task's ERT. The x axis spans
    `window_s` seconds (default: until every shown generation ended, plus 1 s), so the
    interleaving of generation and execution stays readable; robot execution goes on beyond.
    """
    names = list(policies) if policies else list(runs)
    task_ids = list(task_ids) if task_ids else pick_timeline_tasks(runs)
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 1.2 + 0.55 * len(task_ids) * len(names)),
                             squeeze=False, sharex=True)
    colors = {"gen": "tab:orange", "exec": "tab:blue"}
    for ax, name in zip(axes[:, 0], names):
        tasks = {t.task_id: t for t in runs[name].tasks}
        shown = [tasks[i] for i in task_ids if i in tasks]
        origin = min((t.arrival_s for t in shown), default=0.0)
        for row, t in enumerate(shown):
            gen = [(a - origin, b - a) for a, b in t.generation_spans]
            ex = [(s.started_s - origin, s.finished_s - s.started_s) for s in t.segments
                  if math.isfinite(s.started_s) and s.finished_s > s.started_s]
            ax.broken_barh(gen, (row - 0.35, 0.3), facecolors=colors["gen"], edgecolor="black",
                           linewidth=0.5)
            ax.broken_barh(ex, (row + 0.05, 0.3), facecolors=colors["exec"], edgecolor="white",
                           linewidth=0.5)
            ax.plot([t.arrival_s - origin] * 2, [row - 0.4, row + 0.4], color="black", lw=1)
            ax.plot([t.arrival_s - origin + t.ert_s] * 2, [row - 0.4, row + 0.4], color="red",
                    lw=1, ls="--")
            if math.isfinite(t.response_time_s):
                ax.plot(t.arrival_s - origin + t.response_time_s, row - 0.2, marker="v",
                        color="black", ms=4)
        ax.set_yticks(range(len(shown)))
        ax.set_yticklabels([f"{t.task_id} ({t.task_type}, U={t.utility:.2f})" for t in shown],
                           fontsize=8)
        ax.invert_yaxis()
        ax.set_title(name, fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    if window_s is None:
        ends = [b - min(t.arrival_s for t in run_tasks) for run_tasks in
                ([t for t in runs[n].tasks if t.task_id in task_ids] for n in names)
                for t in run_tasks for _, b in t.generation_spans]
        window_s = max([1.5, *ends]) + 1.0
    axes[-1, 0].set_xlim(-0.05, window_s)
    axes[-1, 0].set_xlabel("time since arrival (s)")
    handles = [Patch(color=colors["gen"], label="generation (engine)"),
               Patch(color=colors["exec"], label="robot execution"),
               plt.Line2D([], [], color="red", ls="--", label="ERT"),
               plt.Line2D([], [], color="black", marker="v", ls="", label="first segment at robot")]
    axes[0, 0].legend(handles=handles, fontsize=8, loc="lower right")
    fig.tight_layout()
    return _save(fig, path)


def plot_batch_sweep(sweep: Mapping[str, Any], path: str | Path, title: str = "") -> Path:
    """Fig. 8: overall mean utility (left) and waiting time (right) against the batch cap."""
    caps = list(sweep["batch_cap"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, values in sweep["policies"].items():
        axes[0].plot(caps, [_nan_to_zero(v) for v in values["utility_mean"]], marker="o", label=name)
        axes[1].plot(caps, [_nan_to_zero(v) * 1e3 for v in values["waiting_time_mean_s"]],
                     marker="o", label=name)
    axes[0].set_ylabel("mean time utility (symlog: linear in [-1, 1])")
    # Overloaded caps drive the unclipped TUF far below zero; symlog keeps [0, 2] readable.
    axes[0].set_yscale("symlog", linthresh=1.0)
    axes[1].set_ylabel("mean waiting time (ms)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("batch cap (running generations)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(caps)
        ax.set_xticklabels([str(c) for c in caps])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_algorithms(doc: Mapping[str, Any], path: str | Path, title: str = "") -> Path:
    """Scheduling algorithms: overall utility, waiting time, and utility per task type."""
    policies = doc["policies"]
    names = list(policies)
    types = ordered_types(t for m in policies.values() for t in m["by_type"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    xs = range(len(names))
    axes[0].bar(xs, [_nan_to_zero(policies[n]["overall"]["utility_mean"]) for n in names],
                color="tab:green")
    axes[0].set_ylabel("overall mean time utility")
    axes[1].bar(xs, [_nan_to_zero(policies[n]["overall"]["waiting_time_mean_s"]) * 1e3
                     for n in names], color="tab:purple")
    axes[1].set_ylabel("overall mean waiting time (ms)")
    _auto_scale(axes[0], [policies[n]["overall"]["utility_mean"] for n in names], "utility")
    _auto_scale(axes[1], [policies[n]["overall"]["waiting_time_mean_s"] for n in names], "time",
                1e3)
    for ax in axes[:2]:
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.grid(axis="y", alpha=0.3)
    _grouped_bars(axes[2], names, {t: [policies[n]["by_type"].get(t, {}).get("utility_mean")
                                       for n in names] for t in types}, "mean time utility")
    axes[2].set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    _auto_scale(axes[2], [policies[n]["by_type"].get(t, {}).get("utility_mean")
                          for n in names for t in types], "utility")
    axes[2].legend(fontsize=8)
    axes[2].set_title("utility per task type")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_load_sweep(sweep: Mapping[str, Any], path: str | Path, title: str = "") -> Path:
    """Load sweep: overall mean utility, the same as a fraction of the upper bound, and p99
    response time against the event rate, one line per policy and the bound (dashed); loads at
    which the best baseline misses more than 10 % of deadlines are shaded. Policies whose lines
    coincide stay visible: each has its own marker, drawn smaller than the one before."""
    loads = list(sweep["events_per_s"])
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    markers = ("o", "s", "^", "D", "v", "P", "X", "*")
    # The fraction panel shows [floor, 1]: zoomed in near 1, never below 0 (an overloaded
    # policy's fraction can be -36; it is drawn at the floor with its value).
    lowest = min([_nan_to_zero(v) for e in sweep["policies"].values()
                  for v in e["utility_fraction_of_bound"]], default=1.0)
    floor = max(0.0, min(lowest, 0.99) - 0.02)
    utilities = []
    for k, (name, values) in enumerate(sweep["policies"].items()):
        style = {"marker": markers[k % len(markers)], "markersize": max(3.0, 9.0 - 1.5 * k),
                 "linewidth": max(1.0, 2.6 - 0.5 * k), "label": name}
        u = [_nan_to_zero(v) for v in values["utility_mean"]]
        utilities += u
        axes[0].plot(loads, u, **style)
        fractions = [_nan_to_zero(v) for v in values["utility_fraction_of_bound"]]
        line, = axes[1].plot(loads, [max(f, floor) for f in fractions], **style)
        for x, f in zip(loads, fractions):
            if f < floor:  # off the scale: drawn at its bottom, with the value written
                axes[1].annotate(f"{f:.2f}", (x, floor), textcoords="offset points",
                                 xytext=(-4, 6), ha="right", fontsize=7,
                                 color=line.get_color())
        axes[2].plot(loads, [_nan_to_zero(v) * 1e3 for v in values["response_time_p99_s"]],
                     **style)
    bound = sweep["bound"]
    bound_style = {"color": "black", "ls": "--", "marker": "x", "label": "bound (each task alone)"}
    axes[0].plot(loads, [_nan_to_zero(v) for v in bound["utility_mean"]], **bound_style)
    axes[1].plot(loads, [1.0] * len(loads), **bound_style)
    axes[2].plot(loads, [_nan_to_zero(v) * 1e3 for v in bound["response_time_p99_s"]],
                 **bound_style)
    over = [x for x, o in zip(loads, sweep["overload"]) if o]
    if over:
        # From halfway (geometrically) below the first overloaded load to the right edge.
        i = loads.index(over[0])
        left = math.sqrt(loads[i - 1] * loads[i]) if i > 0 else loads[i] / 1.2
        for ax in axes:
            ax.axvspan(left, max(loads) * 1.2, color="tab:red", alpha=0.08,
                       label=f"overload (best baseline misses > "
                             f"{sweep['overload_miss_rate'] * 100:g} %)")
    axes[0].set_ylabel("mean time utility")
    if utilities and min(utilities) < -3:
        axes[0].set_yscale("symlog", linthresh=1.0)
        axes[0].set_ylabel("mean time utility (symlog: linear in [-1, 1])")
    axes[1].set_ylabel("mean utility / bound's")
    axes[1].set_ylim(floor, 1.0 + 0.05 * (1.0 - floor))
    axes[2].set_ylabel("p99 response time (ms, log)")
    axes[2].set_yscale("log")
    axes[2].yaxis.set_major_formatter(ScalarFormatter())
    p99 = [v for v in (_nan_to_zero(x) for e in [*sweep["policies"].values(), bound]
                       for x in e["response_time_p99_s"]) if v > 0]
    if p99 and max(p99) / min(p99) < 10:  # less than a decade: label the minor ticks too
        axes[2].yaxis.set_minor_formatter(ScalarFormatter())
    for ax in axes:
        ax.set_xlabel("load (events/s)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(loads)
        ax.set_xticklabels([f"{x:g}\n(x{s:g})" for x, s in zip(loads, sweep["load_scale"])],
                           fontsize=8)
        ax.set_xlim(min(loads) / 1.2, max(loads) * 1.2)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def write_all(runs: Mapping[str, Any], doc: Mapping[str, Any], out_dir: str | Path,
              sweep: Mapping[str, Any] | None = None, title: str = "",
              load_sweep: Mapping[str, Any] | None = None) -> list[Path]:
    """Every figure the bench can draw from these results, into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_by_type(doc, out / "fig5_by_type.png", title),
             plot_algorithms(doc, out / "algorithms.png", title)]
    timeline_policies = [p for p in ("vllm", "timelyllm") if p in runs] or list(runs)[:2]
    if runs:
        paths.append(plot_timeline(runs, out / "fig6_timeline.png",
                                   policies=timeline_policies))
    if sweep:
        paths.append(plot_batch_sweep(sweep, out / "fig8_batch_cap.png", title))
    if load_sweep:
        paths.append(plot_load_sweep(load_sweep, out / "load_sweep.png", title))
    return paths


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def metrics_of(runs: Mapping[str, Any]) -> dict[str, Any]:
    """Per-policy metrics of RunResults (for callers that have runs but no JSON doc)."""
    return {"policies": {n: compute_metrics(r.tasks, r.fetch_overhead_s) for n, r in runs.items()}}
