"""`timelyllm lrtrace import-authors DATA.json --config CONFIG.json --output DIR`: the argument
parsing and the printout; the import itself is timelyllm_ros/lrtrace/authors.py."""

from __future__ import annotations

import argparse
import shlex
import sys

HELP = "import the TimelyLLM authors' released workload (JSON) as a measured LRTrace workload"


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", help="the authors' data file, e.g. data_sample_1.json")
    p.add_argument("--config", required=True, help="its generator settings, e.g. "
                   "data_sample_1_config.json")
    p.add_argument("--output", "-o", required=True, metavar="DIR",
                   help="folder for NAME.yaml (the workload), NAME.traces.yaml and "
                        "NAME.timings.csv (the measured skills, for `lrtrace fit`)")
    p.add_argument("--name", help="file and workload name (default: the data file's stem)")
    p.add_argument("--plans", default=None, metavar="YAML|none",
                   help="our plans for the authors' instructions (default "
                        "lrtrace/authors/plans.yaml); 'none' builds every plan from the "
                        "measured skills with default arguments")
    p.add_argument("--force", action="store_true", help="replace existing output files")


def run(args: argparse.Namespace) -> int:
    from timelyllm_ros.lrtrace.authors import (AuthorsImportError, default_plans_path,
                                               import_authors)
    from timelyllm_ros.lrtrace.authors_skills import mapping_table

    plans = None if (args.plans or "").lower() == "none" else (args.plans or default_plans_path())
    command = "timelyllm lrtrace import-authors " + shlex.join(
        [args.data, "--config", args.config, "--output", args.output]
        + (["--name", args.name] if args.name else [])
        + (["--plans", args.plans] if args.plans else []))
    try:
        result = import_authors(args.data, args.config, args.output, name=args.name,
                                plans_path=plans, force=args.force, command=command)
    except AuthorsImportError as err:
        print(f"timelyllm lrtrace import-authors: error: {err}", file=sys.stderr, flush=True)
        return 1
    except OSError as err:
        print(f"timelyllm lrtrace import-authors: error: {getattr(err, 'filename', '') or ''}: "
              f"{err.strerror or err}", file=sys.stderr, flush=True)
        return 1
    print(f"{result.name}: {result.jobs} jobs ({result.events} events of the source), "
          f"{len(result.traces)} traces, TUF levels "
          + ", ".join(f"{k} {v}" for k, v in result.tuf_levels.items()))
    print("skills (theirs -> ours):")
    for skill_set, theirs, ours, why in mapping_table(
            {k: set(v) for k, v in result.mapped.items()}):
        print(f"  {skill_set:<6} {theirs:<8} -> {ours:<18} {why}")
    for trace in result.traces:
        print(f"  trace {trace['id']}: {trace['plan']}")
    for path in (result.workload_path, result.traces_path, result.timings_path):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0
