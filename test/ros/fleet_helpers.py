"""Starting a planner and executors over ROS for the action/lifecycle tests (sim engine unless
told otherwise), and the checks several tests share."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from timelyllm_ros.ros_env import REPO_ROOT


def use_domain(monkeypatch, domain: int) -> None:
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.setenv("RMW_IMPLEMENTATION", os.environ.get("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp"))


def planner_spec(**params):
    from timelyllm_ros.ros.launch_description import NodeSpec

    base = {"engine.kind": "sim", "robots": ["drone_1:drone"]}
    base.update(params)
    return NodeSpec(name="planner", module="timelyllm_ros.ros.planner_node",
                    executable="planner_node", lifecycle=True,
                    parameters_file=REPO_ROOT / "config" / "planner.yaml", parameters=base)


def executor_spec(robot: str, **params):
    from timelyllm_ros.ros.launch_description import NodeSpec

    base = {"robot_id": robot, "time_scale": 0.05}
    base.update(params)
    return NodeSpec(name="executor", namespace=robot, module="timelyllm_ros.ros.executor_node",
                    executable="drone_executor_node", parameters=base)


@contextlib.contextmanager
def fleet(log_dir: Path, specs, robots=(), activate: bool = True, node_name: str = "test_client"):
    """A NodeGroup and a PlannerClient; the planner driven to active unless `activate` is
    False. Stops everything afterwards."""
    from timelyllm_ros.ros.client import PlannerClient
    from timelyllm_ros.ros.launch_runner import NodeGroup

    group = NodeGroup(specs, log_dir=log_dir, echo=False).start()
    client = PlannerClient(robots=list(robots), node_name=node_name)
    try:
        if activate:
            client.lifecycle.drive_to_active(300, alive=lambda: "planner" not in group.exited())
            assert client.wait_for_action(30), log_tail(log_dir, "planner")
        wait_for_executors(client, [s.namespace for s in specs if s.name == "executor"])
        yield group, client
    finally:
        client.close()
        group.stop()


def wait_for_executors(client, robots, timeout_s: float = 60.0) -> None:
    """Until every robot's executor serves /<robot>/execute_segment (seen in the graph)."""
    def serves(robot):
        try:
            names = client.node.get_service_names_and_types_by_node("executor", f"/{robot}")
        except Exception:  # noqa: BLE001 - not discovered yet
            return False
        return any(n == f"/{robot}/execute_segment/_action/send_goal" for n, _ in names)

    for robot in robots:
        assert wait_until(lambda r=robot: serves(r), timeout_s), f"no executor for {robot}"


def log_tail(log_dir: Path, label: str, chars: int = 3000) -> str:
    path = log_dir / f"{label.replace('/', '__')}.log"
    return path.read_text(errors="replace")[-chars:] if path.is_file() else "(no log)"


def idle(seen) -> bool:
    """PlannerMetrics back at the values of an idle planner: nothing queued or running, no
    active task, every KV block free (or evictable prefix cache)."""
    m = seen.metrics[-1] if seen.metrics else None
    return m is not None and m.active_tasks == 0 and m.queued == 0 and m.running == 0 \
        and m.kv_free_blocks >= m.kv_total_blocks - 1


def wait_until(predicate, timeout_s: float, step_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())


def set_param(client, name, value, node: str = "/planner"):
    """`ros2 param set NODE NAME VALUE`: the SetParameters result (successful, reason)."""
    from rcl_interfaces.srv import SetParameters
    from rclpy.parameter import Parameter

    srv = client.node.create_client(SetParameters, f"{node}/set_parameters")
    try:
        return client._call(srv, SetParameters.Request(
            parameters=[Parameter(name, value=value).to_parameter_msg()]), 10).results[0]
    finally:
        client.node.destroy_client(srv)
