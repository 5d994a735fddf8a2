"""The family's report (docs/family.md): every member replayed under the subject policy and the
baselines `vllm-stream` and `vllm-priority`, with the upper bound (bench/bound.py); per member its
figures, then win / tie / loss counts, the worst loss and the issue's three goals.

Per member and policy, over every task of the member (a task that never got a response counts as
late, with the utility the bench gave it when it ended, 0 if none):

- mean utility; the **best baseline** is the baseline with the higher one;
- late share: tasks whose response came after their ERT;
- urgent late share: the same over the member's most urgent tasks, those of its shortest ERT (the
  urgent drones, ERT 0.2 s, wherever the mix has drones; every task of an arms-only member).

Outcome: the subject minus the best baseline, a **tie** within `TIE_MARGIN`, else a win or a loss.
Goals (issue 22, "Goals"), each a pass, a fail or n/a (no member it applies to):

- (a) the subject is at least the best baseline minus `TIE_MARGIN` on at least `NON_LOSS_SHARE`
  of the members, and never behind by more than `MAX_LOSS`;
- (b) in every **overloaded** member (the best baseline's late share above
  `OVERLOAD_MISS_RATE`, the load sweep's threshold), urgent tasks are late at most
  `URGENT_LATE_RATIO` times as often as under the best baseline, or the subject's mean utility
  is ahead by at least `OVERLOAD_LEAD`;
- (c) in every **light** member (load at most `LIGHT_LOAD` times the capacity, bench/family.py)
  the subject's mean utility is at least `BOUND_SHARE` of the bound's. The bound is the burst
  bound (bench/bound_burst.py: tasks released together cannot all be served alone); each row
  also keeps the alone bound's figures (`bound_alone`, `subject_of_alone_bound`) and the
  summary how many light members are within `BOUND_SHARE` of it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from timelyllm_ros.bench.bound import alone_tasks, upper_bound
from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.family import Member
from timelyllm_ros.bench.load_sweep import BASELINES, OVERLOAD_MISS_RATE
from timelyllm_ros.bench.replay import ProgressFn, run_policies
from timelyllm_ros.lrtrace.workload import compose

# The goals.
TIE_MARGIN = 0.005
MAX_LOSS = 0.02
NON_LOSS_SHARE = 0.95
URGENT_LATE_RATIO = 0.5
OVERLOAD_LEAD = 0.05
LIGHT_LOAD = 0.25
BOUND_SHARE = 0.99


def task_figures(tasks: Sequence[Any], urgent_ert_s: float) -> dict[str, Any]:
    """Mean utility, late share and urgent late share over `tasks` (objects with utility,
    response_time_s, ert_s); urgent = ERT at most `urgent_ert_s`."""
    utilities, late, urgent_late = [], [], []
    without = 0
    for t in tasks:
        responded = math.isfinite(float(t.response_time_s))
        without += not responded
        u = float(t.utility)
        utilities.append(u if math.isfinite(u) else 0.0)
        is_late = not responded or float(t.response_time_s) > float(t.ert_s)
        late.append(is_late)
        if float(t.ert_s) <= urgent_ert_s:
            urgent_late.append(is_late)

    def share(flags: list[bool]) -> float:
        return sum(flags) / len(flags) if flags else math.nan

    return {"utility_mean": sum(utilities) / len(utilities) if utilities else math.nan,
            "late_share": share(late), "urgent_late_share": share(urgent_late),
            "urgent_tasks": len(urgent_late), "tasks_without_response": without}


def replay_member(member: Member, subject: str, config: BenchConfig, *,
                  progress_factory: Callable[[str], ProgressFn] | None = None) -> dict[str, Any]:
    """Replay one member under the subject and the baselines (one run each, the same events,
    its own engine profile) and compute the bound; the member's row (`member_row`)."""
    events = compose(member.workload)
    config = replace(config, profile=member.profile)
    policies = list(dict.fromkeys([subject, *BASELINES]))
    runs = run_policies(events, policies, member.workload, config,
                        progress_factory=progress_factory)
    bound = upper_bound(events, member.workload, config)
    urgent_ert = min((t.ert_s for t in bound), default=math.inf)
    figures = {}
    for name, run in runs.items():
        figures[name] = {**task_figures(run.tasks, urgent_ert), "wall_s": run.wall_s}
    row = member_row(member.params.describe(), figures, task_figures(bound, urgent_ert), subject)
    alone = task_figures(alone_tasks(bound), urgent_ert)
    row["bound_alone"] = alone
    row["subject_of_alone_bound"] = figures[subject]["utility_mean"] / alone["utility_mean"] \
        if alone["utility_mean"] > 0 else math.nan
    row["events"] = len(events)
    row["tasks"] = sum(len(e.tasks) for e in events)
    row["urgent_ert_s"] = urgent_ert
    return row


def member_row(params: Mapping[str, Any], figures: Mapping[str, Mapping[str, Any]],
               bound: Mapping[str, Any], subject: str) -> dict[str, Any]:
    """A member's row from its policies' figures (`task_figures`, keyed by policy, the subject
    and both baselines among them) and the bound's: best baseline, difference, outcome, whether
    it is overloaded or light, and its part of goals (b) and (c) (None where they do not
    apply)."""
    missing = [p for p in (subject, *BASELINES) if p not in figures]
    if missing:
        raise ValueError(f"member {params.get('index')}: no figures for policy {missing[0]}")
    best = max(BASELINES, key=lambda b: figures[b]["utility_mean"])  # first of equals: stream
    s, b = figures[subject], figures[best]
    delta = s["utility_mean"] - b["utility_mean"]
    outcome = "tie" if abs(delta) <= TIE_MARGIN else "win" if delta > 0 else "loss"
    overloaded = b["late_share"] > OVERLOAD_MISS_RATE
    light = params["load"] <= LIGHT_LOAD
    urgent_ok = None
    if overloaded:
        urgent_halved = s["urgent_late_share"] <= URGENT_LATE_RATIO * b["urgent_late_share"]
        urgent_ok = bool(urgent_halved or delta >= OVERLOAD_LEAD)
    bound_share = s["utility_mean"] / bound["utility_mean"] if bound["utility_mean"] > 0 \
        else math.nan
    near_bound = bool(bound_share >= BOUND_SHARE) if light else None
    return {**params, "subject": subject, "best_baseline": best,
            "policies": {k: dict(v) for k, v in figures.items()}, "bound": dict(bound),
            "delta": delta, "outcome": outcome, "overloaded": overloaded, "light": light,
            "subject_of_bound": bound_share, "goal_b": urgent_ok, "goal_c": near_bound}


def summarise(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Win / tie / loss counts, the worst loss and the three goals over the members' rows."""
    if not rows:
        raise ValueError("summarise: no member")
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("win", "tie", "loss")}
    worst = min(rows, key=lambda r: r["delta"])
    non_loss = (counts["win"] + counts["tie"]) / len(rows)

    def goal(flags: list[bool | None]) -> dict[str, Any]:
        judged = [f for f in flags if f is not None]
        return {"members": len(judged), "passed": sum(judged),
                "verdict": "n/a" if not judged else "pass" if all(judged) else "fail"}

    goal_a = {"members": len(rows), "passed": counts["win"] + counts["tie"],
              "non_loss_share": non_loss, "worst_delta": worst["delta"],
              "verdict": "pass" if non_loss >= NON_LOSS_SHARE and worst["delta"] >= -MAX_LOSS
              else "fail"}
    goal_c = goal([r["goal_c"] for r in rows])
    near_alone = _near_alone_bound(rows)
    if near_alone is not None:  # rows with the alone bound's figures
        goal_c["passed_alone_bound"] = near_alone
    return {"members": len(rows), **counts,
            "worst": {"index": worst["index"], "delta": worst["delta"]},
            "tasks": sum(r.get("tasks", 0) for r in rows),
            "overloaded": sum(r["overloaded"] for r in rows),
            "light": sum(r["light"] for r in rows),
            "goals": {"a": goal_a, "b": goal([r["goal_b"] for r in rows]),
                      "c": goal_c}}


def _near_alone_bound(rows: Sequence[Mapping[str, Any]]) -> int | None:
    """How many light members are within `BOUND_SHARE` of the alone bound (None for rows
    without its figures)."""
    light = [r for r in rows if r["light"]]
    if any("subject_of_alone_bound" not in r for r in light):
        return None
    return sum(bool(r["subject_of_alone_bound"] >= BOUND_SHARE) for r in light)


def _pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value * 100:.0f}"


def _short_profile(name: str) -> str:
    return name.removeprefix("llama3-")


def family_rows(doc: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the members' table."""
    header = ["#", "profile", "mix", "tpe", "ctx", "load", "ev/s", "tasks", "subject", "best",
              "baseline", "bound", "diff", "late% s/b", "urgent late% s/b", ""]
    rows = []
    for r in doc["members"]:
        s, b = r["policies"][r["subject"]], r["policies"][r["best_baseline"]]
        notes = [r["outcome"]]
        if r["overloaded"]:
            notes.append("overload" + ("" if r["goal_b"] else " (b) missed"))
        if r["light"]:
            notes.append("light" + ("" if r["goal_c"] else " (c) missed"))
        rows.append([str(r["index"]), _short_profile(r["profile"]), r["mix"], str(r["max_tpe"]),
                     r["context"], f"{r['load']:.3f}", f"{r['events_per_s']:.3g}",
                     str(r.get("tasks", "")), f"{s['utility_mean']:.3f}",
                     f"{b['utility_mean']:.3f}", r["best_baseline"].removeprefix("vllm-"),
                     f"{r['bound']['utility_mean']:.3f}", f"{r['delta']:+.3f}",
                     f"{_pct(s['late_share'])}/{_pct(b['late_share'])}",
                     f"{_pct(s['urgent_late_share'])}/{_pct(b['urgent_late_share'])}",
                     ", ".join(notes)])
    return header, rows


def summary_lines(doc: Mapping[str, Any]) -> list[str]:
    """The counts, the worst loss and the goals, one line each."""
    s, fam = doc["summary"], doc["family"]
    g = s["goals"]
    worst = s["worst"]
    lines = [f"{fam['subject']} against the best of {' / '.join(fam['baselines'])}, "
             f"{s['members']} members ({s['tasks']} tasks): {s['win']} wins, {s['tie']} ties, "
             f"{s['loss']} losses (tie: within {TIE_MARGIN:g}); "
             f"worst: member {worst['index']}, {worst['delta']:+.3f}",
             f"(a) {g['a']['verdict']}: at least the best baseline - {TIE_MARGIN:g} on "
             f"{g['a']['passed']}/{g['a']['members']} members ({g['a']['non_loss_share']:.0%}, "
             f"goal {NON_LOSS_SHARE:.0%}), worst {g['a']['worst_delta']:+.3f} "
             f"(goal >= -{MAX_LOSS:g})",
             f"(b) {g['b']['verdict']}: {g['b']['passed']}/{g['b']['members']} overloaded "
             f"members (best baseline late > {OVERLOAD_MISS_RATE:.0%}) with urgent tasks late "
             f"at most {URGENT_LATE_RATIO:g}x as often, or utility ahead by >= {OVERLOAD_LEAD:g}",
             f"(c) {g['c']['verdict']}: {g['c']['passed']}/{g['c']['members']} light members "
             f"(load <= {LIGHT_LOAD:g} x capacity) within {1 - BOUND_SHARE:.0%} of the bound"
             + ("" if g["c"].get("passed_alone_bound") is None else
                f" ({g['c']['passed_alone_bound']}/{g['c']['members']} within it of the alone "
                "bound)")]
    return lines


def format_family(doc: Mapping[str, Any]) -> str:
    """The members' table and the summary, as plain text."""
    header, rows = family_rows(doc)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    left = {1, 2, 4, 10, 15}
    fam = doc["family"]
    lines = [f"family seed {fam['seed']}, {len(rows)} members of {fam['duration_s']:g} s: "
             f"{fam['subject']} (s) against the best baseline (b) and the bound; load = events "
             "per second / capacity's"]
    for j, r in enumerate([header, *rows]):
        lines.append("  ".join(c.ljust(w) if i in left else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    if "summary" in doc:
        lines += summary_lines(doc)
    return "\n".join(lines)


def format_family_markdown(doc: Mapping[str, Any]) -> str:
    """The members' table in Markdown (docs/family.md)."""
    header, rows = family_rows(doc)
    header[-1] = "outcome"
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


FRACTION_FLOOR = -0.5  # the figure's fraction-of-bound panel: lower values drawn here


def _number(value: Any) -> float:
    """A figure from the document (None in JSON for NaN) as a float."""
    return math.nan if value is None else float(value)


_MIX_COLORS = {"drone": "tab:blue", "arm": "tab:orange", "mixed": "tab:green",
               "fleet": "tab:purple"}
_CONTEXT_MARKERS = {"none": "o", "short": "s", "long": "^"}


def plot_family(doc: Mapping[str, Any], path: str | Path) -> Path:
    """Two panels against the load (x capacity, log): the subject minus the best baseline per
    member (the tie band and the largest loss allowed drawn in), and each member's utility as a
    fraction of the bound, subject filled and best baseline hollow. Colour: the mix; marker: the
    context."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    members = doc["members"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for r in members:
        style = {"color": _MIX_COLORS.get(r["mix"], "grey"),
                 "marker": _CONTEXT_MARKERS.get(r["context"], "o")}
        axes[0].scatter(r["load"], _number(r["delta"]), s=28, **style)
        bound = _number(r["bound"]["utility_mean"])
        base = _number(r["policies"][r["best_baseline"]]["utility_mean"]) / bound \
            if bound > 0 else math.nan
        axes[1].scatter(r["load"], max(_number(r["subject_of_bound"]), FRACTION_FLOOR), s=28,
                        **style)
        axes[1].scatter(r["load"], max(base, FRACTION_FLOOR), s=44, facecolors="none",
                        edgecolors=style["color"], marker=style["marker"])
    axes[0].axhspan(-TIE_MARGIN, TIE_MARGIN, color="grey", alpha=0.3, label="tie")
    axes[0].axhline(-MAX_LOSS, color="tab:red", ls="--", lw=1,
                    label=f"largest loss allowed (-{MAX_LOSS:g})")
    # Symlog: differences of a few thousandths and of tens (an overloaded baseline's utility
    # runs far below zero) on one axis, linear within +-0.01.
    axes[0].set_yscale("symlog", linthresh=0.01)
    axes[0].set_ylabel(f"mean utility: {doc['family']['subject']} - best baseline (symlog)")
    axes[1].axhline(BOUND_SHARE, color="black", ls=":", lw=1, label=f"{BOUND_SHARE:g} x bound")
    axes[1].set_ylabel(f"mean utility / bound's (clipped at {FRACTION_FLOOR:g})\n"
                       "filled: subject, hollow: best baseline")
    for ax in axes:
        ax.set_xscale("log")
        ax.axvline(LIGHT_LOAD, color="grey", ls=":", lw=1)
        ax.set_xlabel("load (events per second / capacity's; light at or below "
                      f"{LIGHT_LOAD:g})")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=m)
               for m, c in _MIX_COLORS.items()]
    handles += [plt.Line2D([], [], color="black", marker=mk, ls="", fillstyle="none",
                           label=f"context {c}") for c, mk in _CONTEXT_MARKERS.items()]
    # One legend under both panels: inside, it would hide members.
    handles += axes[0].get_legend_handles_labels()[0] + axes[1].get_legend_handles_labels()[0]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7)
    fam = doc["family"]
    fig.suptitle(f"Workload family, seed {fam['seed']}: {len(members)} members, subject "
                 f"{fam['subject']} (simulated engine)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
