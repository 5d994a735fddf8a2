"""The planner node over ROS with the wall-clock-paced cost-model engine (engine.kind=sim).

The same node, scheduler and executors as with vLLM; the engine "generates" each LRTrace trace's
plan, so the exact segments are known in advance.
"""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")

from timelyllm_ros.experiments.demo import isolate_ros_network  # noqa: E402
from timelyllm_ros.ros.launch_description import NodeSpec  # noqa: E402
from timelyllm_ros.lrtrace.traces import load_traces  # noqa: E402
from timelyllm_ros.ros_env import REPO_ROOT  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(300)]


def test_sim_engine_planner_serves_trace_plans_over_ros(tmp_path, monkeypatch):
    monkeypatch.setenv("ROS_DOMAIN_ID", "131")
    isolate_ros_network()
    from timelyllm_ros.ros.client import PlannerClient
    from timelyllm_ros.ros.launch_runner import NodeGroup

    traces = load_traces()
    specs = [
        NodeSpec(name="planner", module="timelyllm_ros.ros.planner_node", executable="planner_node",
                 parameters_file=REPO_ROOT / "config" / "planner.yaml", lifecycle=True,
                 parameters={"engine.kind": "sim", "policy": "timelyllm",
                             "robots": ["drone_1:drone", "arm_1:arm"]}),
        *(NodeSpec(name="executor", namespace=robot, module="timelyllm_ros.ros.executor_node",
                   executable="drone_executor_node",
                   # Not a liveness test (test_planner_lost.py is): a lease that outlasts a
                   # starved DDS thread on a loaded CI machine, so a live planner never looks lost.
                   parameters={"robot_id": robot, "time_scale": 0.02,
                               "planner_lost_after_s": 30.0})
          for robot in ("drone_1", "arm_1")),
    ]
    with NodeGroup(specs, log_dir=tmp_path, echo=False) as group:
        client = PlannerClient(robots=["drone_1", "arm_1"], node_name="sim_client",
                               planner_lost_after_s=30.0)
        try:
            group.drive_lifecycle(120)   # the planner is a lifecycle node: configure, activate
            assert client.wait_for_planner(120, alive=lambda: "planner" not in group.exited()), \
                (tmp_path / "planner.log").read_text()[-2000:]
            client.submit("urgent-6", "drone_1", traces[6].instruction, urgency="urgent")
            client.submit("arm-9", "arm_1", traces[9].instruction, skill_set="arm")
            final = client.wait_terminal(["urgent-6", "arm-9"], 120)
            for task_id, trace_id in (("urgent-6", 6), ("arm-9", 9)):
                assert final[task_id] is not None and final[task_id].state == "done", (
                    f"{task_id}: {final[task_id]!r}\n--- drone_1 executor log (tail):\n"
                    + _log_tail(tmp_path, "drone_1"))
                texts = [s.text for s in client.seen.segments[task_id]]
                assert "".join(texts) == traces[trace_id].plan
                assert len(texts) >= 2
            assert final["urgent-6"].cached_tokens_total > 0
            # The planner's log is its own: no line per lifecycle transition from `transitions`.
            log = (tmp_path / "planner.log").read_text()
            assert "resumed with" in log and "transitions.core" not in log
        finally:
            client.close()


def _log_tail(log_dir, robot: str, chars: int = 3000) -> str:
    """The tail of a robot's executor log (NodeGroup names logs after namespace and node)."""
    logs = sorted(p for p in log_dir.glob("*.log") if robot in p.name)
    return "\n".join(f"[{p.name}]\n{p.read_text(errors='replace')[-chars:]}" for p in logs)


def test_planner_refuses_an_unknown_engine_scheduling_policy(monkeypatch):
    """A bad parameter fails `configure` with the parameter named; the node stays unconfigured."""
    monkeypatch.setenv("ROS_DOMAIN_ID", "132")
    isolate_ros_network()
    import rclpy
    from rclpy.lifecycle import TransitionCallbackReturn

    from timelyllm_ros.ros.planner_node import PlannerNode
    from timelyllm_ros.ros.planner_params import PlannerSettings, values

    rclpy.init(args=["--ros-args", "-p", "engine.kind:=sim", "-p", "robots:=['drone_1:drone']",
                     "-p", "engine.scheduling_policy:=lifo"])
    node = None
    try:
        node = PlannerNode()
        with pytest.raises(ValueError, match="parameter engine.scheduling_policy: 'lifo'"):
            PlannerSettings.from_parameters(values(node))
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert node.loop is None
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.shutdown()


def test_planner_settings_for_vllm_servers(monkeypatch):
    """engine.kind openai: the planner is a client of running `vllm serve` servers (one URL, or
    replicas); the spec is built from the parameters without contacting them."""
    monkeypatch.setenv("ROS_DOMAIN_ID", "133")
    isolate_ros_network()
    import rclpy

    from timelyllm_ros.ros.planner_node import PlannerNode
    from timelyllm_ros.ros.planner_params import PlannerSettings, values

    rclpy.init(args=["--ros-args", "-p", "engine.kind:=openai", "-p",
                     "robots:=['drone_1:drone']", "-p",
                     "engine.replicas:=['http://127.0.0.1:8001','http://127.0.0.1:8002']"])
    node = None
    try:
        node = PlannerNode()
        settings = PlannerSettings.from_parameters(values(node))
        spec = settings.engine_spec
        assert spec.kind == "openai"
        assert spec.replicas == ("http://127.0.0.1:8001", "http://127.0.0.1:8002")
        assert "8001" in settings.engine_model
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.shutdown()
