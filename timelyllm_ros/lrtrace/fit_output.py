"""What comes out of an execution-time model fit (lrtrace/fit.py): the model file the planner
loads, the summary table `timelyllm lrtrace fit` prints, and one plot per fitted skill.

Separate from fit.py, which computes the fit from timing rows: this only writes and shows a
`FitResult`, in the forms people and the planner read (YAML laid out like config/exec_model.yaml,
a fixed-width table, matplotlib PNGs).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.lrtrace.fit import FitResult, default_base_path


class _ModelDumper(yaml.SafeDumper):
    """Block mappings (one key per line, like config/exec_model.yaml), flow lists (samples on a
    few lines), no anchors/aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_ModelDumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True))


def write_model(result: FitResult, path: str | os.PathLike, base_path: str | os.PathLike | None = None) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    header = [
        "Execution-time model fitted by `timelyllm lrtrace fit` (schema: config/exec_model.yaml).",
        f"source: {result.source}",
        f"base (entries kept for skills not fitted): {base_path or default_base_path()}",
        f"written: {stamp}",
        f"fitted: {', '.join(sorted(result.fits)) or 'none'}",
    ]
    if result.kept:
        header.append("kept from base: " + ", ".join(f"{k} ({v})" for k, v in sorted(result.kept.items())))
    text = "".join(f"# {line}\n" for line in header)
    text += yaml.dump(result.config, Dumper=_ModelDumper, sort_keys=False, width=100,
                      allow_unicode=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)
    ExecutionTimeModel.from_yaml(p)  # what the planner will do with it
    return p


def format_summary(result: FitResult) -> str:
    head = (f"{'skill':<18} {'kind':<9} {'n':>4} {'fixed_s':>8} {'per_unit_s':>10} {'RMSE s':>7} "
            f"{'R2':>6} {'jitter':>6} {'min_s':>7}  notes")
    lines = [head, "-" * len(head)]
    for name in sorted(result.fits):
        f = result.fits[name]
        if f.kind == "linear":
            notes = "constrained >= 0" if f.constrained else ""
            if f.dropped:
                notes = (notes + "; " if notes else "") + f"{f.dropped} non-numeric args skipped"
            lines.append(f"{name:<18} {'linear':<9} {f.n:>4} {f.fixed_s:>8.4f} {f.per_unit_s:>10.5f} "
                         f"{f.rmse:>7.4f} {f.r2:>6.3f} {f.jitter_sigma:>6.3f} {f.minimum_s:>7.3f}  {notes}")
        else:
            lines.append(f"{name:<18} {'empirical':<9} {f.n:>4} {'-':>8} {'-':>10} {'-':>7} {'-':>6} "
                         f"{'-':>6} {f.minimum_s:>7.3f}  {len(f.samples)} samples, mean "
                         f"{np.mean(f.ys):.3f} s, sd {np.std(f.ys):.3f} s")
    for name, why in sorted(result.kept.items()):
        lines.append(f"{name:<18} {'(kept)':<9} {'':>4} {'':>8} {'':>10} {'':>7} {'':>6} {'':>6} {'':>7}  {why}")
    lines.append(f"rows: {result.rows_total} ({result.rows_failed} failed, {result.rows_multi} "
                 f"multi-call segments not used for per-skill fits)")
    if result.multi_check:
        n, ratio = result.multi_check
        lines.append(f"multi-call check: {n} segments, median observed / predicted = {ratio:.3f}")
    lines.append("min_s: what the scheduler plans with at argument 0 (linear) or the fastest "
                 "sample (empirical); jitter: lognormal sigma for simulated robots")
    return "\n".join(lines)


def _safe_name(skill: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", skill) or "skill"


def plot_fits(result: FitResult, out_dir: str | os.PathLike) -> list[Path]:
    """One PNG per fitted skill: scatter + fitted line (linear), histogram (empirical)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in sorted(result.fits):
        f = result.fits[name]
        fig, ax = plt.subplots(figsize=(5, 3.5), dpi=100)
        try:
            if f.kind == "linear":
                ax.scatter(np.abs(f.xs), f.ys, s=14, alpha=0.7, label="observed")
                grid = np.linspace(0.0, float(np.max(np.abs(f.xs))) * 1.05, 50)
                ax.plot(grid, f.predict(grid), color="C3",
                        label=f"{f.fixed_s:.3f} + {f.per_unit_s:.5f}·|arg|")
                ax.set_xlabel(f"|argument {f.arg}|")
                ax.set_title(f"{name}: n={f.n}, RMSE={f.rmse:.3f} s, R²={f.r2:.3f}", fontsize=9)
            else:
                ax.hist(f.ys, bins=min(30, max(5, f.n // 2)), alpha=0.8, label="observed")
                ax.axvline(f.minimum_s, color="C3", linestyle="--",
                           label=f"planning minimum {f.minimum_s:.3f} s")
                ax.set_xlabel("duration (s)")
                ax.set_title(f"{name}: n={f.n}, empirical", fontsize=9)
            ax.set_ylabel("duration (s)" if f.kind == "linear" else "count")
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = out / f"{_safe_name(name)}.png"
            fig.savefig(path)
            written.append(path)
        finally:
            plt.close(fig)
    return written
