"""`python -m timelyllm_ros.papers.hybrid`: seed 003's GSM8K-like batch simulation
(docs/seeds-001-003.md)."""

from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np

from timelyllm_ros.papers.hybrid.gsm8k import PAPER_VARIANTS, run_gsm8k


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m timelyllm_ros.papers.hybrid",
                                 description="Seed 003 GSM8K-like batch simulation")
    ap.add_argument("--n", type=int, default=1319)
    ap.add_argument("--slots", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--prediction-sigma", type=float, default=0.0)
    ap.add_argument("--prefill-cap", type=int, default=5000)
    ap.add_argument("--gate-charge", choices=("marginal", "wall"), default="marginal")
    a = ap.parse_args(argv)
    res = run_gsm8k(a.n, a.slots, range(a.seeds), a.prediction_sigma, a.prefill_cap,
                    gate_charge=a.gate_charge)
    print(f"n={a.n} J={a.slots} seeds={a.seeds} prediction_sigma={a.prediction_sigma}"
          f" gate_charge={a.gate_charge}")
    print(f"{'lists':>11} {'online':>6} {'gate':>5} | {'util %':>7} {'total s':>8} {'tok/s':>7}"
          f" {'prefills':>8} {'prefill s':>9}")
    paper = {(m, on, gt): name for name, m, on, gt in PAPER_VARIANTS}
    for (mode, on, gt), reps in res["rows"].items():
        print(f"{mode:>11} {on!s:>6} {gt!s:>5} | {100 * np.mean([r.utilization for r in reps]):7.2f}"
              f" {np.mean([r.total_s for r in reps]):8.2f} {np.mean([r.tokens_per_s for r in reps]):7.1f}"
              f" {np.mean([r.prefill_stages for r in reps]):8.0f} {np.mean([r.prefill_s for r in reps]):9.2f}"
              f"  {paper.get((mode, on, gt), '')}")
    lb = np.mean([x[0] for x in res["lower_bounds"]]) / 1000
    tp = np.mean([x[1] for x in res["lower_bounds"]]) / 1000
    td = np.mean([x[2] for x in res["lower_bounds"]]) / 1000
    print(f"T_LB = {lb:.2f} s (t_p* = {tp:.2f} s, t_d* >= {td:.2f} s)")


if __name__ == "__main__":
    main()
