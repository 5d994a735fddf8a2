"""The figure of `timelyllm bench --fidelity`: per policy, the response-time distribution (ECDF)
of every real run and of the simulated run, with their p50 and p90 marked."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from timelyllm_ros.bench.fidelity_stats import PolicyFidelity

REAL_COLOURS = ("#1f4e79", "#5b9bd5", "#9dc3e6", "#2e75b6")
SIM_COLOUR = "#c55a11"


def ecdf(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(sorted finite values, cumulative share of them at each)."""
    arr = np.sort(np.asarray([v for v in values if math.isfinite(v)], dtype=float))
    return arr, np.arange(1, arr.size + 1) / max(arr.size, 1)


def plot_distributions(policies: Sequence[PolicyFidelity], path: str | Path,
                       title: str = "") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(policies), 1)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.0), sharey=True, squeeze=False)
    for ax, p in zip(axes[0], policies):
        runs = len(p.real)
        for i in range(runs):
            x, y = ecdf([pair.real_s[i] for pair in p.pairs])
            ax.step(x * 1e3, y, where="post", color=REAL_COLOURS[i % len(REAL_COLOURS)],
                    label=f"real run {i + 1}")
        x, y = ecdf([pair.sim_s for pair in p.pairs])
        ax.step(x * 1e3, y, where="post", color=SIM_COLOUR, linestyle="--", linewidth=2,
                label="simulated")
        for q in (0.5, 0.9):
            ax.axhline(q, color="#bbbbbb", linewidth=0.6, zorder=0)
        err50, err90 = p.error("p50_s"), p.error("p90_s")
        ax.set_title(f"{p.policy}\nsim error p50 {_pct(err50)}, p90 {_pct(err90)}", fontsize=10)
        ax.set_xlabel("response time (ms)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[0][0].set_ylabel("share of tasks")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _pct(x: float) -> str:
    return f"{x * 100:+.0f} %" if math.isfinite(x) else "-"
