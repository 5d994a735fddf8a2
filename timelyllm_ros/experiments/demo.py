"""The end-to-end demo: the whole system on real ROS 2 and real vLLM (`timelyllm demo`,
which `make demo` runs; its arguments are parsed in timelyllm_ros/cli/demo.py).

Starts the node set in launch/demo.nodes.yaml (planner with the bundled model, two simulated
drones, a status recorder), drives the planner's lifecycle to active, sends three PlanTask goals
(one urgent), prints each segment as its feedback arrives and a table of the results, and shuts
everything down.
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
from pathlib import Path

from timelyllm_ros.core.policies.registry import DEFAULT_POLICY
from timelyllm_ros.ros_env import REPO_ROOT

DEFAULT_DESCRIPTION = REPO_ROOT / "launch" / "demo.nodes.yaml"
DEFAULT_OUT = REPO_ROOT / "out" / "demo"

DEMO_TASKS = [
    # (task id, robot, urgency, instruction)
    ("survey-1", "drone_1", "normal", "take off, fly forward one meter, turn right and land"),
    ("intruder-2", "drone_2", "urgent", "find the person near the door and take a picture"),
    ("inspect-3", "drone_1", "normal", "fly a square and look for the red box"),
]


def isolate_ros_network(env: dict[str, str] | None = None) -> dict[str, str]:
    """A private DDS domain on loopback, so concurrent runs (tests, CI) never see each other."""
    env = os.environ if env is None else env
    env.setdefault("ROS_DOMAIN_ID", str(random.Random(os.getpid()).randint(1, 101)))
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
    return {k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "RMW_IMPLEMENTATION")}


def format_table(rows: list[dict]) -> str:
    def fmt(x, spec):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)

    header = (f"{'task':<12} {'robot':<8} {'urgency':<7} {'state':<9} {'resp s':>7} {'utility':>8} "
              f"{'wait s':>7} {'segs':>4} {'resumes':>7} {'cached/resume':>13} "
              f"{'recomputed/resume':>17}")
    lines = [header, "-" * len(header)]
    for r in rows:
        cached = (f"{r['cached_total'] / r['resumes']:.0f}" if r["resumes"] else "-")
        recomputed = (f"{r['recomputed_per_resume']:.1f}" if r["resumes"] else "-")
        lines.append(
            f"{r['task_id']:<12} {r['robot']:<8} {r['urgency']:<7} {r['state']:<9} "
            f"{fmt(r['response_time_s'], '7.3f')} {fmt(r['utility'], '8.3f')} "
            f"{fmt(r['waiting_time_s'], '7.2f')} {r['segments']:>4} {r['resumes']:>7} {cached:>13} "
            f"{recomputed:>17}")
    return "\n".join(lines)


def run_demo(*, policy: str = DEFAULT_POLICY, description: Path = DEFAULT_DESCRIPTION,
             out: Path = DEFAULT_OUT, startup_timeout_s: float = 300.0,
             task_timeout_s: float = 240.0, echo: bool = True) -> int:
    """Run the demo; 0 when every task is done, 1 otherwise (node logs under `out`/logs).

    The tasks go through the PlanTask action: each segment is printed as its feedback arrives,
    and the table is built from the results."""
    isolate_ros_network()
    from timelyllm_ros.ros.client import PlannerClient
    from timelyllm_ros.ros.launch_description import apply_overrides, load_description
    from timelyllm_ros.ros.launch_runner import NodeGroup
    from timelyllm_ros.ros.lifecycle_client import LifecycleError

    specs = load_description(description)
    apply_overrides(specs, [f"planner.policy={policy}",
                            f"status_recorder.output={out / 'task_status.jsonl'}"])
    print(f"[demo] starting {len(specs)} nodes (ROS_DOMAIN_ID={os.environ['ROS_DOMAIN_ID']}); "
          f"node logs in {out / 'logs'}", flush=True)
    group = NodeGroup(specs, log_dir=out / "logs", echo=echo).start()
    client = PlannerClient(robots=["drone_1", "drone_2"], node_name="demo_client")
    ok = False
    try:
        print("[demo] configuring the planner (loads the model, warms its prefix cache), then "
              "activating it...", flush=True)
        started = time.monotonic()
        try:
            client.lifecycle.drive_to_active(startup_timeout_s,
                                             alive=lambda: "planner" not in group.exited())
        except LifecycleError as err:
            print(f"[demo] planner did not come up: {err} (exited: {group.exited()}); see "
                  f"{out / 'logs'}", file=sys.stderr)
            return 1
        if not client.wait_for_action(30, alive=lambda: "planner" not in group.exited()):
            print("[demo] the planner's PlanTask action did not appear", file=sys.stderr)
            return 1
        print(f"[demo] planner active after {time.monotonic() - started:.0f} s; sending "
              f"{len(DEMO_TASKS)} PlanTask goals", flush=True)
        runs = {}
        for task_id, robot, urgency, instruction in DEMO_TASKS:
            runs[task_id] = client.plan(task_id, robot, instruction, urgency=urgency,
                                        on_feedback=_printer(task_id))
        rows = []
        deadline = time.monotonic() + task_timeout_s
        for task_id, robot, urgency, _instruction in DEMO_TASKS:
            outcome = runs[task_id].result(max(1.0, deadline - time.monotonic()))
            r = outcome[1] if outcome else None
            resumes = r.resumes if r else 0
            rows.append({
                "task_id": task_id, "robot": robot, "urgency": urgency,
                "state": r.state if r else "no result", "response_time_s": r.response_time_s if r else None,
                "utility": r.utility if r else None, "waiting_time_s": r.waiting_time_s if r else None,
                "segments": r.segments if r else 0, "resumes": resumes,
                "cached_total": r.mean_cached_tokens_per_resume * resumes if r else 0,
                "recomputed_per_resume": r.mean_recomputed_tokens_per_resume if r else 0.0,
            })
        print("\n" + format_table(rows))
        for task_id, *_ in DEMO_TASKS:
            segs = client.seen.segments.get(task_id, [])
            plan = " | ".join(seg.text or "<end>" for seg in segs)
            print(f"  {task_id}: {plan}")
        ok = all(r["state"] == "done" for r in rows)
        print(f"\n[demo] {'all tasks done' if ok else 'some tasks did not finish'}; statuses recorded "
              f"in {out / 'task_status.jsonl'}")
    finally:
        client.close()
        codes = group.stop()
        print(f"[demo] nodes stopped: {codes}")
    return 0 if ok else 1


def _printer(task_id: str):
    seen = set()

    def on_feedback(fb) -> None:
        if fb.segments_dispatched and fb.segments_dispatched not in seen:
            seen.add(fb.segments_dispatched)
            print(f"[demo] {task_id}: segment {fb.segments_dispatched - 1} "
                  f"{fb.last_segment_text or '<end>'!r} ({fb.state})", flush=True)

    return on_feedback
