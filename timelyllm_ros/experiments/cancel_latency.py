"""Cancel latency over ROS: from a PlanTask cancel request to (a) the robot's segment stopped and
(b) the task cancelled with its engine request, KV blocks and queue entry freed.

    python -m timelyllm_ros.experiments.cancel_latency [--engine sim|vllm] [--trials N]

Starts a planner and an arm executor whose segments take seconds, and for each trial sends an
arm task, waits until the robot executes its first segment, cancels the goal and measures:
- robot stopped: the `finished` time of the robot's cancelled segment (its ExecutionReport);
- KV freed: the stamp of the task's `cancelled` TaskStatus, which the engine thread publishes
  right after aborting the engine request and releasing its KV blocks and queue entry.
All clocks are the same host's ROS (wall) clock. Prints one line per trial and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from timelyllm_ros.experiments.demo import isolate_ros_network
from timelyllm_ros.ros_env import REPO_ROOT

ARM_TASK = "stack the red block on the blue block, then put the green block on top"


def _stamp(t) -> float:
    return t.sec + t.nanosec * 1e-9


def measure(engine: str = "sim", trials: int = 5, log_dir: Path | None = None,
            out=sys.stdout) -> dict[str, list[float]]:
    isolate_ros_network()
    from timelyllm_ros.ros.client import PlannerClient
    from timelyllm_ros.ros.launch_description import NodeSpec
    from timelyllm_ros.ros.launch_runner import NodeGroup

    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="cancel-latency-"))
    specs = [
        NodeSpec(name="planner", module="timelyllm_ros.ros.planner_node", executable="planner_node",
                 parameters_file=REPO_ROOT / "config" / "planner.yaml", lifecycle=True,
                 parameters={"engine.kind": engine, "robots": ["arm_1:arm"]}),
        NodeSpec(name="executor", namespace="arm_1", module="timelyllm_ros.ros.executor_node",
                 executable="drone_executor_node", parameters={"robot_id": "arm_1", "time_scale": 1.0}),
    ]
    figures: dict[str, list[float]] = {"robot_stopped_ms": [], "kv_freed_ms": []}
    with NodeGroup(specs, log_dir=log_dir, echo=False) as group:
        client = PlannerClient(robots=["arm_1"], node_name="cancel_latency_client")
        try:
            client.lifecycle.drive_to_active(900, alive=lambda: "planner" not in group.exited())
            if not client.wait_for_action(30):
                raise RuntimeError("no PlanTask action")
            # The robot's reports reach this client (volatile topic: discovery first).
            deadline = time.monotonic() + 60
            while client.node.count_publishers("/arm_1/execution_reports") < 1:
                if time.monotonic() > deadline:
                    raise RuntimeError("the executor's report publisher was never discovered")
                time.sleep(0.1)
            time.sleep(0.5)
            log = log_dir / "arm_1__executor.log"
            for i in range(trials):
                task_id = f"cancel-{i}"
                run = client.plan(task_id, "arm_1", ARM_TASK, urgency="normal")
                deadline = time.monotonic() + 300
                while f"executing {task_id}#0" not in log.read_text(errors="replace"):
                    if time.monotonic() > deadline or run.result(0) is not None:
                        raise RuntimeError(f"{task_id}: the robot never started a segment")
                    time.sleep(0.02)
                time.sleep(0.2)
                t_cancel = time.time()
                run.cancel()
                status = run.result(60)
                if status is None or status[1].state != "cancelled":
                    raise RuntimeError(f"{task_id}: not cancelled: {status}")
                if not client.wait_for(lambda seen, t=task_id: any(
                        r.message.startswith("cancelled") for r in seen.reports[t]), 10):
                    raise RuntimeError(f"{task_id}: the robot's segment was not cancelled")
                stopped = min(_stamp(r.finished) for r in client.seen.reports[task_id]
                              if r.message.startswith("cancelled"))
                freed = next(_stamp(s.stamp) for s in client.seen.statuses[task_id]
                             if s.state == "cancelled")
                figures["robot_stopped_ms"].append(1e3 * (stopped - t_cancel))
                figures["kv_freed_ms"].append(1e3 * (freed - t_cancel))
                print(f"trial {i}: robot stopped {figures['robot_stopped_ms'][-1]:7.1f} ms, "
                      f"engine request + KV freed {figures['kv_freed_ms'][-1]:7.1f} ms", file=out,
                      flush=True)
            idle = client.wait_for(lambda seen: bool(seen.metrics) and seen.metrics[-1].running == 0
                                   and seen.metrics[-1].queued == 0
                                   and seen.metrics[-1].active_tasks == 0, 10)
        finally:
            client.close()
    print(f"cancel latency ({engine} engine, {trials} trials, median): robot stopped "
          f"{statistics.median(figures['robot_stopped_ms']):.1f} ms, engine request + KV freed "
          f"{statistics.median(figures['kv_freed_ms']):.1f} ms; planner idle afterwards: {idle}",
          file=out, flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m timelyllm_ros.experiments.cancel_latency",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    measure(args.engine, args.trials, args.log_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
