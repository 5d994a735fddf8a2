"""`python -m timelyllm_ros.papers.mcsf`: seed 001's chat experiment (docs/seeds-001-003.md)."""

from __future__ import annotations

import argparse
from typing import Sequence

from timelyllm_ros.papers.mcsf.chat_experiment import run_chat_experiment, run_weighted_experiment


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m timelyllm_ros.papers.mcsf",
                                 description="Seed 001: MC-SF vs vLLM-like baselines, chat workload")
    ap.add_argument("--rates", type=float, nargs="+", default=[1.0, 0.3],
                    help="Poisson arrivals per round (high demand, low demand)")
    ap.add_argument("--ns", type=int, nargs="+", default=[1000, 2000, 3000])
    ap.add_argument("--seeds", type=int, default=2)
    a = ap.parse_args(argv)
    for rate in a.rates:
        r = run_chat_experiment(rate, a.ns, range(a.seeds))
        print(f"\nrate={rate}/round M={r['M']} ns={r['ns']} seeds={a.seeds}"
              f"  (alpha-greedy loops for alpha in {r['alpha_loops']}; alpha*={r['alpha_star']})")
        print(f"  MC-SF: max usage {r['max_usage_mcsf']} <= M, clears {r['clears_mcsf']}")
        for name, row in r["table"].items():
            if row is None:
                print(f"  {name:>18}: loops / unfinished")
            else:
                lat = " ".join(f"{x:8.1f}" for x in row["mean_latency"])
                print(f"  {name:>18}: {lat}   slope {row['slope']:.3f}")
        if r["best_baseline"]:
            ratio = r["table"]["mc-sf"]["slope"] / r["table"][r["best_baseline"]]["slope"]
            print(f"  slope ratio MC-SF / best baseline ({r['best_baseline']}) = {ratio:.3f}")
        wr = run_weighted_experiment(rate, seeds=range(a.seeds))
        print(f"  weights {{1,4}}: weighted mean latency MC-SF {wr['mc-sf']:.1f},"
              f" MC-WSF {wr['mc-wsf']:.1f}; unweighted {wr['mc-sf_unweighted']:.1f} vs"
              f" {wr['mc-wsf_unweighted']:.1f}")



if __name__ == "__main__":
    main()
