"""`python -m timelyllm_ros.papers.bros`: the hybrid RT/BE simulation of docs/seeds-002-004.md."""

from __future__ import annotations

import argparse
from typing import Sequence

from timelyllm_ros.papers.bros.reproduction import HYBRID_POLICIES, simulate_hybrid
from timelyllm_ros.papers.bros.reproduction_workload import HybridWorkload


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m timelyllm_ros.papers.bros",
                                 description="BROS hybrid RT/BE simulation (docs/seeds-002-004.md)")
    ap.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--be-batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", nargs="+", default=list(HYBRID_POLICIES))
    args = ap.parse_args(argv)
    for rate in args.rates:
        w = HybridWorkload(rt_rate=rate, duration_s=args.duration, be_batch=args.be_batch,
                           seed=args.seed)
        print(f"RT rate {rate} req/s, BE batch {args.be_batch}, {args.duration:.0f} s")
        for p in args.policies:
            print("  " + simulate_hybrid(p, w).row())


if __name__ == "__main__":
    main()
