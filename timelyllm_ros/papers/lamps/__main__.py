"""`python -m timelyllm_ros.papers.lamps`: the toy example and the API-serving simulation of
docs/seeds-002-004.md."""

from __future__ import annotations

import argparse
from typing import Sequence

from timelyllm_ros.papers.lamps.api_serving import simulate_api_serving
from timelyllm_ros.papers.lamps.pause_workload import PauseWorkload
from timelyllm_ros.papers.lamps.toy import (TOY_TABLE1, simulate_toy, toy_key_fcfs,
                                            toy_key_lamps_score, toy_key_order, toy_key_sjf,
                                            toy_key_sjf_total)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m timelyllm_ros.papers.lamps",
                                 description="LAMPS simulations (docs/seeds-002-004.md)")
    ap.add_argument("--toy", action="store_true", help="print the Table 1 toy results")
    ap.add_argument("--kind", default="infercept", choices=("infercept", "robot"))
    ap.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--pause-median", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", nargs="+",
                    default=["vllm", "infercept", "lamps", "lamps-nostarve"])
    args = ap.parse_args(argv)
    if args.toy:
        for name, key in (("FCFS", toy_key_fcfs), ("SJF", toy_key_sjf),
                          ("SJF-total", toy_key_sjf_total),
                          ("LAMPS R3,R2,R1", toy_key_order(["R3", "R2", "R1"])),
                          ("score [R]", toy_key_lamps_score)):
            res = simulate_toy(TOY_TABLE1, key)
            trace = ''.join(x[-1] for x in res.trace)
            print(f"{name:16s} avg {res.average:6.3f}  {res.completion}  {trace}")
        return
    for rate in args.rates:
        w = PauseWorkload(kind=args.kind, rate=rate, n_requests=args.n,
                          robot_pause_median_s=args.pause_median, seed=args.seed)
        print(f"{args.kind}: rate {rate} req/s, {args.n} requests")
        for p in args.policies:
            print("  " + simulate_api_serving(p, w).row())


if __name__ == "__main__":
    main()
