"""`timelyllm router-compare`: the planner's own placement (`engine.replicas`) against vllm-router
(`--policy consistent_hash`) on the same two `vllm serve` CPU workers (docs/router.md).

    timelyllm router-compare --out docs/router-compare

Starts the workers (bundled model, KV in bytes) and the router on loopback, runs the same small
workload through both placements in alternating order, kills and restarts a worker under each,
and writes router-compare.json and router-compare.md (a table) to --out, plus the router's added
latency per request. Every process it starts is stopped before it returns. Takes about 10 min on
a 2-core machine. See bench/router_compare.py.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="timelyllm router-compare",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds of (sequential, burst) per placement, order alternating "
                         "(default 2)")
    ap.add_argument("--sequential-tasks", type=int, default=4,
                    help="tasks run one at a time per round (default 4)")
    ap.add_argument("--burst-tasks", type=int, default=6,
                    help="tasks submitted at once per round (default 6)")
    ap.add_argument("--death-tasks", type=int, default=4,
                    help="tasks running when a worker is killed (default 4)")
    ap.add_argument("--kv-cache-bytes", type=int, default=512 << 20,
                    help="each worker's KV cache in bytes (default 512 MiB)")
    ap.add_argument("--max-num-seqs", type=int, default=8,
                    help="each worker's --max-num-seqs (default 8)")
    ap.add_argument("--latency-requests", type=int, default=20,
                    help="request pairs for the router's added latency (default 20)")
    ap.add_argument("--out", type=Path, default=Path("out/router-compare"),
                    help="directory for router-compare.json / .md (default out/router-compare)")
    args = ap.parse_args(argv)
    if min(args.rounds, args.sequential_tasks, args.burst_tasks, args.death_tasks) < 1:
        print("timelyllm router-compare: --rounds and the task counts must be >= 1",
              file=sys.stderr)
        return 2

    from timelyllm_ros.bench.router_compare import compare, markdown_table
    from timelyllm_ros.bench.router_probe import router_overhead
    from timelyllm_ros.bench.vllm_deployment import Deployment
    from timelyllm_ros.core.engine.model_prep import DEFAULT_MODEL_DIR

    block = 32
    log_dir = Path(tempfile.mkdtemp(prefix="router-compare-"))
    print(f"logs in {log_dir}", file=sys.stderr)
    start = time.monotonic()
    dep = Deployment(DEFAULT_MODEL_DIR, log_dir, workers=2, kv_cache_bytes=args.kv_cache_bytes,
                     max_num_seqs=args.max_num_seqs, worker_flags=("--block-size", str(block)))
    with dep:
        print(f"workers and router up in {time.monotonic() - start:.0f} s", file=sys.stderr)
        latency = router_overhead(dep.router.url, dep.worker_urls(),
                                  requests=args.latency_requests).summary()
        summary = compare(dep, rounds=args.rounds, sequential_tasks=args.sequential_tasks,
                          burst_tasks=args.burst_tasks, death_tasks=args.death_tasks,
                          block_size=block, log=lambda m: print(m, file=sys.stderr, flush=True))
    command = "timelyllm router-compare " + shlex.join(argv or [])
    table = markdown_table(summary)
    latency_line = (f"Router's added latency ({latency['requests']} interleaved pairs, 8 output "
                    f"tokens): time to first token +{latency['ttft_added_p50_ms']:.1f} ms p50, "
                    f"+{latency['ttft_added_p90_ms']:.1f} ms p90 (direct p50 "
                    f"{latency['ttft_direct_p50_ms']:.1f} ms); whole request "
                    f"+{latency['total_added_p50_ms']:.1f} ms p50, "
                    f"+{latency['total_added_p90_ms']:.1f} ms p90 (direct p50 "
                    f"{latency['total_direct_p50_ms']:.1f} ms).")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "router-compare.json").write_text(json.dumps(
        {"command": command.strip(), "wall_s": round(time.monotonic() - start, 1),
         "router_latency": latency, "placements": summary}, indent=2))
    (args.out / "router-compare.md").write_text(
        f"`{command.strip()}`\n\n{table}\n\n{latency_line}\n")
    print(table)
    print(latency_line)
    print(f"wrote {args.out}/router-compare.json and .md "
          f"({time.monotonic() - start:.0f} s)", file=sys.stderr)
    return 0
