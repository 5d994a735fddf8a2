"""Fault injection over ROS: what happens to every task, client, robot and resource when
something breaks (issue 20, "Nothing hangs and nothing is lost").

    timelyllm faults [--only ROW,...] [--out DIR]          (docs/faults.md)

For each row, a fresh set of real processes (planner on the wall-clock simulated engine,
executor nodes, a fleet simulator, a PlannerClient; experiments/fault_rig.py) gets PlanTask
goals in flight, then the fault (experiments/fault_rows.py), and the runner measures
(experiments/fault_measure.py): the tasks by terminal state with their reasons; seconds from
the fault until every task was terminal (the clients' results and /timelyllm/task_status);
which clients got a result and when; which robots stopped and when; and whether queue, KV,
robot goals and threads came back to idle (or the killed process is gone).

Each row runs in a child process of its own (`python -m timelyllm_ros.experiments.faults
--row ROW ...`) on a ROS domain of its own (`domain_base` + the row's index): a fresh rclpy and
DDS participant per row, environment changes (the DDS row forces UDPv4) that stay in that row,
and a row that crashes or hangs cannot take the others with it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROWS: dict[str, str] = {
    "planner-sigterm": "planner SIGTERM",
    "planner-sigkill": "planner SIGKILL",
    "engine-exception": "engine exception (restart_engine=1)",
    "executor-sigkill": "executor SIGKILL",
    "dds-disconnect": "DDS-level disconnect of a robot (link cut)",
    "deep-overload": "deep overload (240 goals at once, 40 robots)",
    "deep-overload-paced": "deep overload, paced (240 goals at 100/s, 40 robots)",
}
# Row i runs on base + i; within 0-101, the domains whose DDS ports stay below Linux's
# ephemeral port range.
DEFAULT_DOMAIN_BASE = 60
ROW_TIMEOUT_S = {"deep-overload": 1500.0, "deep-overload-paced": 1500.0}
DEFAULT_ROW_TIMEOUT_S = 600.0


def row_function(row: str) -> Callable:
    from timelyllm_ros.experiments import fault_rows

    return getattr(fault_rows, row.replace("-", "_"))


def parse_rows(text: str | None) -> list[str]:
    """`--only` (comma-separated row names) in the table's order; ValueError naming the
    unknown ones."""
    if not text:
        return list(ROWS)
    wanted = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in wanted if r not in ROWS]
    if unknown or not wanted:
        raise ValueError(f"unknown row(s) {', '.join(unknown) or '(none given)'}; "
                         f"rows: {', '.join(ROWS)}")
    return [r for r in ROWS if r in wanted]


def run_faults(rows: list[str], *, out: Path | None = None, log_dir: Path | None = None,
               domain_base: int = DEFAULT_DOMAIN_BASE, say: Callable[[str], None] = print,
               row_timeout_s: dict[str, float] | None = None) -> list[dict]:
    """Run `rows` one after the other, each in a child process; returns the rows' dicts (a
    row whose child failed has `error`). With `out`, writes faults.json and faults_table.md
    there; rows of an earlier run in that faults.json that were not run now are kept."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="timelyllm-faults-"))
    results = []
    for row in rows:
        domain = domain_base + list(ROWS).index(row)
        timeout_s = (row_timeout_s or {}).get(row, ROW_TIMEOUT_S.get(row, DEFAULT_ROW_TIMEOUT_S))
        say(f"[{row}] {ROWS[row]}: ROS_DOMAIN_ID={domain}")
        started = time.monotonic()
        result = _run_child(row, domain, log_dir / row, timeout_s, say)
        result.update(row=row, title=ROWS[row], domain=domain,
                      wall_s=round(time.monotonic() - started, 1), logs=str(log_dir / row),
                      measured=_measured())
        results.append(result)
        from timelyllm_ros.experiments.faults_report import row_line

        say(f"[{row}] {row_line(result)}")
    if out is not None:
        from timelyllm_ros.experiments.faults_report import write

        write(results, out, log_dir, order=list(ROWS))
    return results


def _measured() -> dict:
    """When, and on which code: the commit, and whether the tree differed from it."""
    from timelyllm_ros.ros_env import REPO_ROOT

    def git(*args):
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    return {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": git("rev-parse", "--short", "HEAD"),
            "tree_changed": bool(git("status", "--porcelain", "--untracked-files=no"))}


def _run_child(row: str, domain: int, log_dir: Path, timeout_s: float, say) -> dict:
    log_dir.mkdir(parents=True, exist_ok=True)
    result_path = log_dir / "row.json"
    result_path.unlink(missing_ok=True)
    env = {**os.environ, "ROS_DOMAIN_ID": str(domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
           "RMW_IMPLEMENTATION": os.environ.get("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp"),
           "PYTHONUNBUFFERED": "1"}
    for name in ("FASTDDS_BUILTIN_TRANSPORTS", "ROS_STATIC_PEERS"):
        env.pop(name, None)   # only the row that needs them sets them
    cmd = [sys.executable, "-m", "timelyllm_ros.experiments.faults", "--row", row,
           "--log-dir", str(log_dir), "--json", str(result_path)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    tail: list[str] = []
    try:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.5):
                line = proc.stdout.readline()
                if not line:
                    break
                line = line.rstrip("\n")
                tail = (tail + [line])[-30:]
                if line.startswith("  ") or line.startswith("[row]"):
                    say(f"[{row}] {line.removeprefix('[row] ')}")
        else:
            say(f"[{row}] no end within {timeout_s:.0f} s: stopping it")
    finally:
        if proc.poll() is None:
            import signal

            # SIGINT first: its `finally` stops the nodes it started (and a namespace).
            for sig, grace in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(grace)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
        proc.wait()
    if result_path.is_file():
        return json.loads(result_path.read_text())
    return {"error": f"the row's process ended with {proc.returncode} and no result",
            "output_tail": tail}


def _child(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m timelyllm_ros.experiments.faults")
    ap.add_argument("--row", required=True, choices=list(ROWS))
    ap.add_argument("--log-dir", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)

    def say(text: str) -> None:
        print(f"[row] {text}", flush=True)

    import traceback

    try:
        result = row_function(args.row)(args.log_dir, say)
    except Exception as err:  # noqa: BLE001 - reported as the row's error, with where
        traceback.print_exc()
        result = {"error": f"{type(err).__name__}: {err}"}
    except KeyboardInterrupt:
        result = {"error": "interrupted (the runner's time limit)"}
    args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
