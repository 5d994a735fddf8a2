"""Every policy on every workload: the robot workloads WID1-3 and the seed papers' own
(paper_workloads.py), as one table and one figure (docs/policies.md).

    python -m timelyllm_ros.bench.compare --out out/compare \\
        --figure docs/figures/policies-all.png [--policies a,b,...] [--workloads ...] [--jobs 2]

A workload written `NAME@kvN` is NAME on a KV cache of N blocks (e.g. `seed002-rtbe@kv320`: how
much BROS's bidirectional blocks matter depends on KV pressure).

Each (workload, policy) run is independent and deterministic, so runs are spread over `--jobs`
processes; results are cached as JSON per run in `--out` (delete a file to rerun it). A run that
cannot finish (a policy that livelocks, such as alpha-greedy clearing forever) is recorded with
its error instead of stopping the comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Sequence

ROBOT_WORKLOADS = ("WID1", "WID2", "WID3")
PAPER_WORKLOADS = ("seed001-chat", "seed002-rtbe", "seed003-gsm8k", "seed004-api")
# Paper workloads again on a tight KV cache (an eighth of the default 2560 blocks).
TIGHT_KV_WORKLOADS = ("seed002-rtbe@kv320",)
POLICIES = ("vllm", "vllm-stream", "fcfs-seg", "edf-seg", "timelyllm", "mcsf", "mcsf-utility",
            "mcsf-shared", "mcsf-alpha-greedy", "mcsf-alpha-beta", "bros", "bros-recompute",
            "hybrid", "hybrid-nogate", "lamps", "infercept", "timelyllm-mcsf", "timelyllm-bros",
            "timelyllm-lamps")
# Virtual seconds past the last arrival before a run is declared stuck.
MAX_OVERRUN_S = 900.0

# The headline figure per workload: (key in the run's summary, label, lower is better).
HEADLINE = {
    "WID1": ("utility_mean", "mean utility", False),
    "WID2": ("utility_mean", "mean utility", False),
    "WID3": ("utility_mean", "mean utility", False),
    "seed001-chat": ("latency_mean_s", "mean latency (s)", True),
    "seed002-rtbe": ("rt_miss_rate", "RT first-sentence SLO miss", True),
    "seed003-gsm8k": ("makespan_s", "makespan (s)", True),
    "seed004-api": ("latency_mean_s", "mean latency (s)", True),
}


def split_workload(workload: str) -> tuple[str, int | None]:
    """`NAME@kvN` -> (NAME, N); a plain name -> (name, None). ValueError names what is wrong."""
    base, sep, kv = workload.partition("@kv")
    if not sep:
        return workload, None
    if not kv.isdigit() or int(kv) < 1:
        raise ValueError(f"workload {workload}: '@kv' must be followed by a block count >= 1")
    return base, int(kv)


def headline(workload: str) -> tuple[str, str, bool]:
    return HEADLINE[split_workload(workload)[0]]


def run_one(workload: str, policy: str) -> dict[str, Any]:
    """One replay, summarised (runs in a worker process)."""
    from timelyllm_ros.bench.config import BenchConfig
    from timelyllm_ros.bench.replay import run_policy
    from timelyllm_ros.bench.metrics import compute_metrics
    from timelyllm_ros.bench.paper_metrics import paper_metrics
    from timelyllm_ros.core.policies.registry import get_policy
    from timelyllm_ros.lrtrace.workload import compose, load_workload

    started = time.perf_counter()
    config = BenchConfig(max_overrun_s=MAX_OVERRUN_S)
    workload, kv_blocks = split_workload(workload)
    if workload in PAPER_WORKLOADS:
        from timelyllm_ros.bench.paper_workloads import build_scenario
        scenario = build_scenario(workload)
        if scenario.pauses_required and get_policy(policy).dispatch != "segment":
            return {"skipped": "cannot pause a generation for a tool call"}
        events, wl, kwargs = scenario.events, scenario.workload, scenario.run_kwargs()
        config = scenario.configure(config)
    else:
        wl = load_workload(workload)
        events, kwargs = compose(wl), {}
    if kv_blocks is not None:  # after the scenario's own profile, as `timelyllm bench --kv-blocks`
        config = dataclasses.replace(config, profile=dataclasses.replace(
            config.load_profile(), kv_total_blocks=kv_blocks))
    try:
        run = run_policy(events, policy, wl, config, **kwargs)
    except (RuntimeError, ValueError) as exc:
        return {"error": str(exc)[:300], "wall_s": time.perf_counter() - started}
    overall = compute_metrics(run.tasks, run.fetch_overhead_s)
    paper = paper_metrics(run.tasks)
    rt = paper["by_type"].get("chat-rt", {})
    return {
        "utility_mean": overall["overall"]["utility_mean"],
        "waiting_time_mean_s": overall["overall"]["waiting_time_mean_s"],
        "response_time_mean_s": overall["overall"]["response_time_mean_s"],
        "latency_mean_s": paper["latency_mean_s"],
        "latency_p99_s": paper["latency_p99_s"],
        "makespan_s": paper["makespan_s"],
        "be_tokens_per_s": paper["be_tokens_per_s"],
        "rt_miss_rate": rt.get("first_segment_miss_rate", math.nan),
        "done": paper["done"], "tasks": paper["tasks"],
        "scheduling_overhead_ms": overall["scheduling_overhead_ms"],
        "wall_s": time.perf_counter() - started,
    }


def _cell_path(out: Path, workload: str, policy: str) -> Path:
    return out / f"{workload}__{policy}.json"


def run_all(workloads: Sequence[str], policies: Sequence[str], out: Path, jobs: int
            ) -> dict[str, dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {w: {} for w in workloads}
    todo = []
    for w in workloads:
        for p in policies:
            path = _cell_path(out, w, p)
            if path.is_file():
                results[w][p] = json.loads(path.read_text())
            else:
                todo.append((w, p))
    total = len(todo)
    if total:
        print(f"compare: {total} runs on {jobs} processes ({len(workloads) * len(policies) - total}"
              " cached)", file=sys.stderr)
    # Spawned, not forked: a fork copies the parent's threads' locks mid-use (a process that
    # has used rclpy or vLLM has DDS and engine threads), and such a child can die at once
    # (seen as BrokenProcessPool in the test suite, after the ROS tests).
    with ProcessPoolExecutor(max_workers=max(1, jobs),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_one, w, p): (w, p) for w, p in todo}
        for done, fut in enumerate(as_completed(futures), 1):
            w, p = futures[fut]
            cell = fut.result()
            results[w][p] = cell
            _cell_path(out, w, p).write_text(json.dumps(_json_safe(cell), indent=1) + "\n")
            key, label, _ = headline(w)
            state = cell.get("error") or cell.get("skipped") or \
                f"{label} {cell.get(key, math.nan):.3f}"
            print(f"[{done}/{total}] {w} {p}: {state} ({cell.get('wall_s', 0):.0f} s)",
                  file=sys.stderr, flush=True)
    return results


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def _num(cell: dict[str, Any], key: str) -> float:
    v = cell.get(key)
    return float(v) if isinstance(v, (int, float)) and v is not None else math.nan


def markdown_table(results: dict[str, dict[str, Any]], policies: Sequence[str]) -> str:
    """Rows: policies. Robot workloads: utility / waiting ms; paper workloads: their headline."""
    cols = list(results)
    header = ["policy"]
    for w in cols:
        if w in ROBOT_WORKLOADS:
            header.append(f"{w} util / wait ms")
        elif split_workload(w)[0] == "seed002-rtbe":
            header.append(f"{w} RT miss % / BE tok/s")
        else:
            header.append(f"{w} {headline(w)[1]}")
    if all(w in cols for w in ROBOT_WORKLOADS):
        header.insert(4, "WID1-3 mean")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p in policies:
        row = [f"`{p}`"]
        for w in cols:
            cell = results[w].get(p, {})
            if "error" in cell:
                row.append("stuck")
            elif "skipped" in cell:
                row.append("n/a")
            elif w in ROBOT_WORKLOADS:
                row.append(f"{_num(cell, 'utility_mean'):.3f} / "
                           f"{1e3 * _num(cell, 'waiting_time_mean_s'):.0f}")
            elif split_workload(w)[0] == "seed002-rtbe":
                row.append(f"{100 * _num(cell, 'rt_miss_rate'):.1f} / "
                           f"{_num(cell, 'be_tokens_per_s'):.0f}")
            else:
                row.append(f"{_num(cell, headline(w)[0]):.2f}")
        if all(w in cols for w in ROBOT_WORKLOADS):
            cells = [results[w].get(p, {}) for w in ROBOT_WORKLOADS]
            u = [_num(c, "utility_mean") for c in cells]
            t = [_num(c, "waiting_time_mean_s") for c in cells]
            row.insert(4, f"{sum(u) / 3:.3f} / {1e3 * sum(t) / 3:.0f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], policies: Sequence[str], path: Path) -> Path:
    """One panel per workload: its headline figure per policy (best bar highlighted)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(results)
    ncols = 4
    nrows = math.ceil(len(workloads) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 0.32 * len(policies) * nrows + 1.5),
                             squeeze=False)
    for ax in axes.flat[len(workloads):]:
        ax.axis("off")
    for ax, w in zip(axes.flat, workloads):
        key, label, lower = headline(w)
        values = [_num(results[w].get(p, {}), key) for p in policies]
        finite = [v for v in values if math.isfinite(v)]
        best = (min(finite) if lower else max(finite)) if finite else math.nan
        shown = [max(v, -1.0) if key == "utility_mean" and math.isfinite(v) else v
                 for v in values]
        colors = ["tab:green" if math.isfinite(v) and v == best else "tab:blue" for v in values]
        y = range(len(policies))
        ax.barh(list(y), [v if math.isfinite(v) else 0 for v in shown], color=colors)
        for i, (v, s) in enumerate(zip(values, shown)):
            cell = results[w].get(policies[i], {})
            text = "n/a" if "skipped" in cell else "stuck" if "error" in cell else \
                (f"{v:.3g}" if math.isfinite(v) else "-")
            ax.text(s if math.isfinite(s) else 0, i, f" {text}", va="center", fontsize=7)
        ax.set_yticks(list(y))
        ax.set_yticklabels(policies if ax in axes[:, 0] else [], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{w}: {label}" + (" (lower better)" if lower else " (clipped at -1)"),
                     fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle("Every policy on the robot workloads (WID1-3) and each seed paper's own "
                 "workload (simulated engine)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m timelyllm_ros.bench.compare",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="out/compare", help="folder for per-run JSON (cache)")
    p.add_argument("--figure", default=None, help="write the figure here (PNG)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--workloads",
                   default=",".join(ROBOT_WORKLOADS + PAPER_WORKLOADS + TIGHT_KV_WORKLOADS))
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    from timelyllm_ros.bench.policies import PolicyListError, parse_policy_list
    try:
        policies = parse_policy_list(args.policies)
    except PolicyListError as exc:
        print(f"compare: --policies: {exc}", file=sys.stderr)
        return 2
    workloads = [x for x in args.workloads.split(",") if x]
    try:
        bad = [w for w in workloads if split_workload(w)[0] not in HEADLINE]
    except ValueError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    if bad:
        print(f"compare: unknown workload {bad[0]}", file=sys.stderr)
        return 2
    results = run_all(workloads, policies, Path(args.out), args.jobs)
    print(markdown_table(results, policies))
    if args.figure:
        print(f"wrote {plot(results, policies, Path(args.figure))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
