"""Golden numbers of the simulated bench: record them once, check that a change keeps them.

The simulated bench runs in virtual time and is deterministic, so a refactor that keeps the
behaviour keeps every figure of `timelyllm bench --json` bit for bit (wall-clock fields aside).

    python tools/golden_bench.py record [--full] [--set paper|planner]   write test/golden/
    python tools/golden_bench.py check [--full] [--set paper|planner]    rerun, list what differs

Two sets, each in its own file (both by default):
- `paper` (test/golden/bench-{quick,full}.json): WID1-3 and each seed paper's workload under
  every policy of the paper's comparison, in the paper's configuration (`--paper-config`),
  recorded before the redesign of issue 10;
- `planner` (test/golden/planner-{quick,full}.json): the planner's default policy
  (`timelyllm-pred`), the previous default and the two vLLM baselines, in the bench's default
  configuration, on issue 22's overload, the fleet with per-task contexts and a KV-limited
  profile: the policies the paper set does not cover, on the loads where their rules act
  (arrival pricing, yields, preserved pauses, KV holds). Recorded on 1 December 2026 at
  8764ac6, whose default replays issue 22's overload exactly as every commit since b0fe693.

`quick` (checked by `make test`) replays a prefix of each workload; `full` (`make golden`) the
whole of each.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "test" / "golden"

POLICIES = ("vllm", "vllm-stream", "fcfs-seg", "edf-seg", "timelyllm", "mcsf", "mcsf-utility",
            "mcsf-shared", "mcsf-alpha-greedy", "mcsf-alpha-beta", "bros", "bros-recompute",
            "hybrid", "hybrid-nogate", "lamps", "infercept", "timelyllm-mcsf", "timelyllm-bros",
            "timelyllm-lamps")

# (label, extra `timelyllm bench` arguments). Quick runs cut each workload to a prefix.
RUNS: dict[str, list[tuple[str, list[str]]]] = {
    "quick": [
        ("WID1", ["--workload", "WID1", "--duration-s", "30"]),
        ("WID2", ["--workload", "WID2", "--duration-s", "20"]),
        ("WID3", ["--workload", "WID3", "--duration-s", "80"]),
        ("seed001-chat", ["--workload", "seed001-chat", "--duration-s", "8"]),
        ("seed002-rtbe", ["--workload", "seed002-rtbe", "--duration-s", "3"]),
        ("seed003-gsm8k", ["--workload", "seed003-gsm8k", "--requests", "80"]),
        ("seed004-api", ["--workload", "seed004-api", "--requests", "30"]),
    ],
    "full": [
        ("WID1", ["--workload", "WID1"]),
        ("WID2", ["--workload", "WID2"]),
        ("WID3", ["--workload", "WID3"]),
        ("seed001-chat", ["--workload", "seed001-chat"]),
        ("seed002-rtbe", ["--workload", "seed002-rtbe"]),
        ("seed002-rtbe@kv320", ["--workload", "seed002-rtbe", "--kv-blocks", "320"]),
        ("seed003-gsm8k", ["--workload", "seed003-gsm8k"]),
        ("seed004-api", ["--workload", "seed004-api"]),
    ],
}

PLANNER_POLICIES = ("vllm-stream", "vllm-priority", "timelyllm-wc", "timelyllm-pred")

_A10 = ["--profile", str(Path(__file__).resolve().parents[1] / "config" / "engine_profiles"
                         / "llama3-8b-a10.yaml")]
PLANNER_RUNS: dict[str, list[tuple[str, list[str]]]] = {
    "quick": [
        ("mixed-overload", ["--workload", "mixed-overload", "--duration-s", "40"]),
        ("mixed-fleet-long", ["--workload", "mixed-fleet-long", "--duration-s", "60"]),
        ("mixed-fleet-long@a10", ["--workload", "mixed-fleet-long", "--duration-s", "60", *_A10]),
    ],
    "full": [
        ("mixed-overload", ["--workload", "mixed-overload"]),
        ("mixed-fleet-long", ["--workload", "mixed-fleet-long"]),
        ("mixed-fleet-long@a10", ["--workload", "mixed-fleet-long", *_A10]),
    ],
}


class GoldenSet(NamedTuple):
    """A golden record: which runs, under which policies and configuration, in which file."""

    stem: str
    policies: tuple[str, ...]
    config_args: tuple[str, ...]
    runs: dict[str, list[tuple[str, list[str]]]]


SETS = {
    # Recorded before the modern configuration became the default: the paper's.
    "paper": GoldenSet("bench", POLICIES, ("--paper-config",), RUNS),
    "planner": GoldenSet("planner", PLANNER_POLICIES, (), PLANNER_RUNS),
}

# Measured in wall-clock time: they differ between any two runs.
WALL_CLOCK_KEYS = frozenset({"scheduling_overhead_ms", "wall_s"})


# Diagnostics the bench added after the record was taken (the suspensions' KV handling and
# evictions; the p50 / p90 response beside the p99, and the response as the TimelyLLM authors
# measure it): not part of the recorded figures.
LATER_DIAGNOSTICS = frozenset({"pauses", "response_time_p50_s", "response_time_p90_s",
                               "first_action"})


def strip_wall_clock(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: strip_wall_clock(v) for k, v in doc.items()
                if k not in WALL_CLOCK_KEYS and k not in LATER_DIAGNOSTICS}
    if isinstance(doc, list):
        return [strip_wall_clock(v) for v in doc]
    return doc


def golden_path(kind: str, golden_set: str = "paper") -> Path:
    return GOLDEN_DIR / f"{SETS[golden_set].stem}-{kind}.json"


def run_bench(args: list[str], golden_set: str = "paper") -> dict[str, Any]:
    """One `timelyllm bench` run of `golden_set`'s policies and configuration through the
    command-line entry point, as its JSON."""
    # The installed `timelyllm` command, wherever the package keeps it.
    from importlib.metadata import entry_points
    cli_main = entry_points(group="console_scripts")["timelyllm"].load()
    chosen = SETS[golden_set]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        argv = ["bench", *args, *chosen.config_args, "--policies", ",".join(chosen.policies),
                "--no-progress", "--json", str(out)]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            status = cli_main(argv)
        if status != 0:
            raise RuntimeError(f"timelyllm {' '.join(argv)} exited {status}")
        return strip_wall_clock(json.loads(out.read_text(encoding="utf-8")))


def run_all(kind: str, golden_set: str = "paper", verbose: bool = True) -> dict[str, Any]:
    out = {}
    for label, args in SETS[golden_set].runs[kind]:
        started = time.perf_counter()
        out[label] = run_bench(args, golden_set)
        if verbose:
            print(f"{golden_set} {label}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return out


def differences(expected: Any, actual: Any, path: str = "") -> Iterator[str]:
    """Every leaf where `actual` differs from `expected`, as 'path: expected != actual'."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            sub = f"{path}/{key}"
            if key not in actual:
                yield f"{sub}: missing"
            elif key not in expected:
                yield f"{sub}: unexpected"
            else:
                yield from differences(expected[key], actual[key], sub)
    elif isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for i, (e, a) in enumerate(zip(expected, actual)):
            yield from differences(e, a, f"{path}[{i}]")
    elif expected != actual and not (expected != expected and actual != actual):  # NaN == NaN
        yield f"{path}: {expected!r} != {actual!r}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("record", "check"))
    p.add_argument("--full", action="store_true", help="whole workloads (minutes)")
    p.add_argument("--set", choices=sorted(SETS), action="append", dest="sets",
                   help="which golden record (repeatable; default: all)")
    args = p.parse_args(argv)
    kind = "full" if args.full else "quick"
    status = 0
    for golden_set in args.sets or sorted(SETS):
        doc = run_all(kind, golden_set)
        path = golden_path(kind, golden_set)
        if args.action == "record":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            print(f"wrote {path}", file=sys.stderr)
            continue
        diff = list(differences(json.loads(path.read_text(encoding="utf-8")), doc))
        for line in diff[:50]:
            print(line)
        print(f"{len(diff)} figures differ from {path}", file=sys.stderr)
        status = status or (1 if diff else 0)
    return status


if __name__ == "__main__":
    sys.exit(main())
