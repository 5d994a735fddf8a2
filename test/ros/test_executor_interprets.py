"""The executor runs what the plan says (issue 13): with an interpreting backend (drone-sim in
a scene) it repeats loops, tests what skills returned, keeps a task's variables from one
segment to the next, and reports a return (`->`) so the planner stops generating the task."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from timelyllm_ros.ros_env import REPO_ROOT

ROBOT = f"scout_{os.getpid()}"
SCENE = REPO_ROOT / "config" / "scenes" / "drone_room.yaml"


@pytest.fixture
def drone_sim_executor(monkeypatch):
    rclpy = pytest.importorskip("rclpy")
    from rclpy.action import ActionClient
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.node import Node

    monkeypatch.setenv("ROS_DOMAIN_ID", str(160 + os.getpid() % 10))
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    from timelyllm_ros.experiments.demo import isolate_ros_network
    isolate_ros_network()
    if rclpy.ok():
        pytest.skip("rclpy already initialised by another test in this process")
    from timelyllm_ros.action import ExecuteSegment
    from timelyllm_ros.ros import topics
    from timelyllm_ros.ros.executor_node import ExecutorNode

    rclpy.init(args=["test_executor_interprets", "--ros-args", "-p", f"robot_id:={ROBOT}",
                     "-p", "backend:=drone-sim", "-p", f"scene:={SCENE}",
                     "-p", "time_scale:=0.001"])
    executor = MultiThreadedExecutor(num_threads=3)
    node = ExecutorNode()
    client = Node("interpret_client")
    action = ActionClient(client, ExecuteSegment,
                          topics.robot_topic(ROBOT, topics.EXECUTE_SEGMENT))
    executor.add_node(node)
    executor.add_node(client)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    try:
        assert action.wait_for_server(timeout_sec=30)

        def run(task_id, sequence, text, is_last=False):
            feedback = []
            goal = ExecuteSegment.Goal(task_id=task_id, robot_id=ROBOT, sequence=sequence,
                                       text=text, calls=[], is_last=is_last)
            sent = action.send_goal_async(goal, feedback_callback=lambda f: feedback.append(
                f.feedback.current_call))
            deadline = time.monotonic() + 30
            while not sent.done() and time.monotonic() < deadline:
                time.sleep(0.01)
            handle = sent.result()
            assert handle.accepted
            result = handle.get_result_async()
            while not result.done() and time.monotonic() < deadline:
                time.sleep(0.01)
            return result.result().result, feedback

        yield node, run
    finally:
        executor.shutdown()
        node.shutdown() if hasattr(node, "shutdown") else None
        node.destroy_node()
        client.destroy_node()
        rclpy.shutdown()
        spin.join(5)


def test_loops_conditionals_variables_and_return_on_the_robot(drone_sim_executor):
    node, run = drone_sim_executor
    # A loop turns three times, and a skill's value lands in a variable.
    result, calls = run("t1", 0, "3{tc,30};_1=iv,unicorn;")
    assert result.success, result.message
    assert calls.count("tc,30") == 3 and "iv,unicorn" in calls
    assert json.loads(result.values) == {"_1": False} and not result.plan_returned
    # The next segment of the same task sees the variable: nothing seen, so it returns, and
    # the move after the conditional never runs.
    result, calls = run("t1", 1, "?_1==False{->'no unicorn'};mf,50;", is_last=True)
    assert result.success and result.plan_returned, result.message
    assert json.loads(result.values)["returned"] == "no unicorn"
    assert "mf,50" not in calls and "returned" in result.message
    # A fresh task starts with no variables: reading _1 fails the segment, naming it.
    result, _ = run("t2", 0, "?_1==False{mf,50};", is_last=True)
    assert not result.success and "_1" in result.message
    assert node.robot.interpreters == {}  # nothing kept once tasks end


def test_a_bad_argument_fails_the_segment_before_anything_moves(drone_sim_executor):
    _, run = drone_sim_executor
    result, calls = run("t3", 0, "tc,30;mf,900;", is_last=True)
    assert not result.success and "mf,900" in result.message and "out of range" in result.message
    # Every literal argument is checked before the first call: only the segment's start
    # feedback (its text) came, no call.
    assert calls == ["tc,30;mf,900;"]
