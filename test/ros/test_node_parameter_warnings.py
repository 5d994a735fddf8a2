"""A node started with a parameter it does not declare (`--ros-args -p polcy:=edf-seg`) says so:
rclpy itself ignores such a value without a word, and the node would run on its default."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")

from fleet_helpers import log_tail, use_domain, wait_until  # noqa: E402

from timelyllm_ros.ros_env import REPO_ROOT  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(120)]

DOMAIN = 208


def test_real_nodes_warn_about_each_undeclared_parameter(tmp_path, monkeypatch):
    use_domain(monkeypatch, DOMAIN)
    from timelyllm_ros.ros.launch_description import NodeSpec
    from timelyllm_ros.ros.launch_runner import NodeGroup

    # NodeSpecs built here skip the launch-time check on purpose: this is what a hand-written
    # `ros2 run ... --ros-args -p` gives the node.
    specs = [
        NodeSpec(name="planner", module="timelyllm_ros.ros.planner_node",
                 executable="planner_node", parameters_file=REPO_ROOT / "config" / "planner.yaml",
                 parameters={"engine.kind": "sim", "polcy": "edf-seg"}),
        # `scene` belongs to the drone-sim backend; with the default backend it does nothing.
        NodeSpec(name="executor", namespace="drone_9", module="timelyllm_ros.ros.executor_node",
                 executable="drone_executor_node",
                 parameters={"robot_id": "drone_9", "time_scal": 0.5, "scene": "room.yaml"}),
        NodeSpec(name="fleet_sim", module="timelyllm_ros.ros.fleet_sim_node",
                 executable="fleet_sim_node", parameters={"drones": 1, "dornes": 2}),
    ]
    expected = {
        "planner": ["ignoring unknown parameter 'polcy' (did you mean 'policy'?); known: ",
                    "engine.kind"],
        "drone_9/executor": ["ignoring unknown parameter 'time_scal' (did you mean "
                             "'time_scale'?); known: ",
                             "ignoring parameter 'scene': this node declares it only with "
                             "other settings",
                             # a warning, not a refusal: the node comes up
                             "executor for drone_9 ready"],
        "fleet_sim": ["ignoring unknown parameter 'dornes' (did you mean 'drones'?); known: ",
                      "fleet of 1 robots ready"],
    }
    with NodeGroup(specs, log_dir=tmp_path, echo=False) as group:
        for label, lines in expected.items():
            assert wait_until(lambda lb=label, ls=lines: all(x in log_tail(tmp_path, lb, 20000)
                                                             for x in ls), 60), \
                (group.exited(), log_tail(tmp_path, label))
        logs = {label: log_tail(tmp_path, label, 20000) for label in expected}
    # Only the undeclared ones: everything from planner.yaml and the rest was declared.
    assert logs["planner"].count("ignoring") == 1, logs["planner"]
    assert logs["drone_9/executor"].count("ignoring") == 2, logs["drone_9/executor"]
    assert logs["fleet_sim"].count("ignoring") == 1, logs["fleet_sim"]


def test_the_planners_table_is_what_a_real_planner_declares(monkeypatch):
    use_domain(monkeypatch, DOMAIN)
    import rclpy

    from timelyllm_ros.ros import planner_params
    from timelyllm_ros.ros.launch_description import known_parameters
    from timelyllm_ros.ros.planner_node import PlannerNode

    rclpy.init(args=["--ros-args", "-p", "engine.kind:=sim", "-p", "engine.seed:=3",
                     "-p", "polcy:=edf-seg", "-p", "engine.knd:=vllm"])
    node = None
    try:
        node = PlannerNode()
        declared = node.list_parameters([], 0).names
        assert sorted(declared) == sorted(known_parameters("timelyllm_ros.ros.planner_node"))
        assert planner_params.warn_undeclared_overrides(node) == ["engine.knd", "polcy"]
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
