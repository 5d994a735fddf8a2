"""`timelyllm faults`: inject faults into a running system over ROS and tabulate what happened.

    timelyllm faults [--only ROW,...] [--out DIR]

Rows: planner-sigterm, planner-sigkill, engine-exception, executor-sigkill, dds-disconnect,
deep-overload, deep-overload-paced (docs/faults.md). Each starts its own planner (simulated
engine), robots and client, puts PlanTask goals in flight, injects the fault and measures every
task's end, which clients were told, which robots stopped and whether queue, KV, robot goals
and threads came back to idle. Prints progress and a table; `--out` writes faults.json (every
figure) and faults_table.md.
Exit status 0 when every row ran (whatever it found), 1 when a row could not run, 2 on bad
arguments. The dds-disconnect row needs root and iproute2 (a network namespace).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from timelyllm_ros.experiments.faults import DEFAULT_DOMAIN_BASE, ROWS, parse_rows

    ap = argparse.ArgumentParser(prog="timelyllm faults", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="rows:\n" + "\n".join(f"  {k:18} {v}"
                                                               for k, v in ROWS.items()))
    ap.add_argument("--only", default="", metavar="ROW,...", help="run only these rows")
    ap.add_argument("--out", type=Path, default=None,
                    help="write faults.json and faults_table.md to this directory")
    ap.add_argument("--log-dir", type=Path, default=None,
                    help="node logs, one folder per row (default: a temporary directory)")
    ap.add_argument("--domain-base", type=int, default=DEFAULT_DOMAIN_BASE,
                    help=f"row i runs on ROS_DOMAIN_ID base+i (default {DEFAULT_DOMAIN_BASE})")
    args = ap.parse_args(argv)
    try:
        rows = parse_rows(args.only)
    except ValueError as err:
        print(f"timelyllm faults: --only: {err}", file=sys.stderr)
        return 2
    if not 0 <= args.domain_base <= 232 - len(ROWS):
        print(f"timelyllm faults: --domain-base: {args.domain_base}; 0 to {232 - len(ROWS)}",
              file=sys.stderr)
        return 2

    from timelyllm_ros.experiments.faults import run_faults
    from timelyllm_ros.experiments.faults_report import print_table

    results = run_faults(rows, out=args.out, log_dir=args.log_dir, domain_base=args.domain_base,
                         say=lambda line: print(line, flush=True))
    print_table(results)
    if args.out is not None:
        print(f"wrote {args.out}/faults.json, {args.out}/faults_table.md")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
