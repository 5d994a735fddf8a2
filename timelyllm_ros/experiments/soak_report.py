"""What a soak (experiments/soak.py) measured, judged against its targets, as JSON, Markdown and
a figure.

Targets (`verdicts`): every task terminal with a reason and none lost; the planner's RSS grows
less than RSS_GROWTH_LIMIT after warm-up; the queue, engine and KV idle at the end.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np

from timelyllm_ros.experiments.soak import Sample, SoakResult

RSS_GROWTH_LIMIT = 0.05


def rss_growth(samples: list[Sample], warmup_s: float, load_s: float) -> dict:
    """The planner's RSS after warm-up: the mean of the first and the last minute of the
    post-warm-up load window (means, so one allocator hiccup does not decide), their relative
    growth, and the least-squares slope over the window in MB per minute."""
    window = [s for s in samples if warmup_s <= s.t <= load_s and not math.isnan(s.planner_rss_mb)]
    if len(window) < 4:
        return {"samples": len(window), "growth": float("nan")}
    span = max(1.0, min(60.0, (window[-1].t - window[0].t) / 4))
    first = [s.planner_rss_mb for s in window if s.t <= window[0].t + span]
    last = [s.planner_rss_mb for s in window if s.t >= window[-1].t - span]
    t = np.array([s.t for s in window])
    rss = np.array([s.planner_rss_mb for s in window])
    slope = float(np.polyfit(t, rss, 1)[0]) * 60.0
    start, end = float(np.mean(first)), float(np.mean(last))
    return {"samples": len(window), "start_mb": start, "end_mb": end,
            "growth": (end - start) / start, "slope_mb_per_min": slope,
            "peak_mb": float(rss.max())}


def summary(result: SoakResult) -> dict:
    cfg = result.config
    overhead = np.array([s.fetch_overhead_ms for s in result.samples
                         if s.t <= result.load_s and not math.isnan(s.fetch_overhead_ms)
                         and s.fetch_overhead_ms > 0])
    active = [s.active_tasks for s in result.samples if s.active_tasks >= 0]
    queued = [s.queued for s in result.samples if s.queued >= 0]
    terminal = sum(result.results.values())
    out = {
        "robots": cfg.robots, "duration_s": cfg.duration_s, "think_s": cfg.think_s,
        "time_scale": cfg.time_scale, "startup_s": round(result.startup_s, 1),
        "drain_s": round(result.drain_s, 1),
        "tasks_submitted": result.submitted, "tasks_terminal": terminal,
        "tasks_per_s": result.submitted / result.load_s if result.load_s else float("nan"),
        "results": dict(result.results),
        "results_by_kind": {k: dict(v) for k, v in sorted(result.results_by_kind.items())},
        "reasons": dict(result.reasons.most_common(10)),
        "lost": len(result.lost), "lost_last_states": dict(result.lost_last_states),
        "lost_examples": result.lost[:10],
        "terminal_without_reason": len(result.no_reason),
        "status_mismatch": len(result.status_missing),
        "mean_utility": float(np.mean(result.utilities)) if result.utilities else float("nan"),
        "p50_response_s": _pct(result.responses_s, 50),
        "p99_response_s": _pct(result.responses_s, 99),
        "max_active_tasks": max(active, default=0), "max_queued": max(queued, default=0),
        "scheduler_ms_mean": float(overhead.mean()) if overhead.size else float("nan"),
        "scheduler_ms_p99": float(np.percentile(overhead, 99)) if overhead.size else float("nan"),
        "planner_rss": rss_growth(result.samples, cfg.warmup_s, result.load_s),
        "fleet_rss_mb": max((s.fleet_rss_mb for s in result.samples
                             if not math.isnan(s.fleet_rss_mb)), default=float("nan")),
        "idle_at_end": result.idle_at_end,
    }
    out["verdicts"] = verdicts(out)
    return out


def verdicts(s: dict) -> dict[str, bool]:
    growth = s["planner_rss"].get("growth", float("nan"))
    return {
        "every task terminal with a reason": (s["lost"] == 0 and s["terminal_without_reason"] == 0
                                              and s["tasks_terminal"] == s["tasks_submitted"]
                                              and s["status_mismatch"] == 0),
        f"planner RSS growth < {RSS_GROWTH_LIMIT:.0%} after warm-up":
            not math.isnan(growth) and growth < RSS_GROWTH_LIMIT,
        "queue, engine and KV idle at the end": bool(s["idle_at_end"].get("idle")),
    }


def _pct(values: list[float], q: float) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.percentile(finite, q)) if finite else float("nan")


def markdown(s: dict, command: str) -> str:
    rss = s["planner_rss"]
    lines = [
        f"Command: `{command}`", "",
        f"{s['robots']} robots, {s['duration_s']:.0f} s of load (think time {s['think_s']:g} s, "
        f"robot time scale {s['time_scale']:g}); nodes up in {s['startup_s']:.1f} s, drained in "
        f"{s['drain_s']:.1f} s.", "",
        "| target | result |", "|---|---|",
    ]
    lines += [f"| {name} | {'**pass**' if ok else '**FAIL**'} |" for name, ok in s["verdicts"].items()]
    lines += [
        "", "| figure | value |", "|---|---|",
        f"| tasks submitted / terminal | {s['tasks_submitted']} / {s['tasks_terminal']} "
        f"({s['tasks_per_s']:.2f} tasks/s) |",
        f"| results | {', '.join(f'{k} {v}' for k, v in sorted(s['results'].items()))} |",
        *(f"| results, {kind}s | {', '.join(f'{k} {v}' for k, v in sorted(c.items()))} |"
          for kind, c in s["results_by_kind"].items()),
        f"| lost / terminal without reason / status mismatch | {s['lost']} / "
        f"{s['terminal_without_reason']} / {s['status_mismatch']}"
        + (f" (last states of the lost: {s['lost_last_states']})" if s["lost"] else "") + " |",
        f"| mean utility, p50 / p99 response | {s['mean_utility']:.3f}, "
        f"{s['p50_response_s']:.3f} s / {s['p99_response_s']:.3f} s |",
        f"| most active tasks, most queued | {s['max_active_tasks']}, {s['max_queued']} |",
        f"| scheduler time per pick, mean / p99 of 1 s means | {s['scheduler_ms_mean']:.3f} ms / "
        f"{s['scheduler_ms_p99']:.3f} ms |",
        f"| planner RSS after warm-up: start, end, growth, slope | {rss.get('start_mb', math.nan):.1f} MB, "
        f"{rss.get('end_mb', math.nan):.1f} MB, {rss.get('growth', math.nan):+.2%}, "
        f"{rss.get('slope_mb_per_min', math.nan):+.3f} MB/min |",
        f"| fleet-simulator RSS (peak) | {s['fleet_rss_mb']:.1f} MB |",
        f"| at the end | {', '.join(f'{k} {v}' for k, v in s['idle_at_end'].items())} |",
    ]
    if s["reasons"]:
        lines += ["", "Reasons of tasks that did not end `done`:", ""]
        lines += [f"- {k}: {v}" for k, v in s["reasons"].items()]
    return "\n".join(lines) + "\n"


def plot(result: SoakResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t / 60 for s in result.samples]
    fig, axes = plt.subplots(4, 1, figsize=(8, 9), sharex=True)
    axes[0].plot(t, [s.planner_rss_mb for s in result.samples], label="planner")
    axes[0].plot(t, [s.fleet_rss_mb for s in result.samples], label="fleet simulator")
    axes[0].set_ylabel("RSS (MB)")
    axes[0].legend(loc="lower right")
    axes[1].plot(t, [max(s.active_tasks, 0) for s in result.samples], label="active tasks")
    axes[1].plot(t, [max(s.queued, 0) for s in result.samples], label="queued generations")
    axes[1].plot(t, [max(s.running, 0) for s in result.samples], label="running in engine")
    axes[1].set_ylabel("count")
    axes[1].legend(loc="upper right")
    axes[2].plot(t, [max(s.kv_used, 0) for s in result.samples])
    axes[2].set_ylabel("KV blocks used")
    axes[3].plot(t, [s.fetch_overhead_ms for s in result.samples])
    axes[3].set_ylabel("scheduler ms/pick")
    axes[3].set_xlabel("minutes since the load started")
    for ax in axes:
        ax.axvline(result.load_s / 60, color="grey", linestyle=":", linewidth=1)
        ax.axvline(result.config.warmup_s / 60, color="grey", linestyle="--", linewidth=1)
    fig.suptitle(f"Soak: {result.config.robots} simulated robots over ROS "
                 f"(dashed: warm-up end; dotted: load end)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: SoakResult, out_dir: Path, command: str) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    s = summary(result)
    payload = {"summary": s, "config": {k: (str(v) if isinstance(v, Path) else v)
                                        for k, v in asdict(result.config).items()},
               "samples": [asdict(x) for x in result.samples]}
    (out_dir / "soak.json").write_text(json.dumps(payload, indent=1, default=str))
    (out_dir / "soak.md").write_text(markdown(s, command))
    plot(result, out_dir / "soak.png")
    return s
