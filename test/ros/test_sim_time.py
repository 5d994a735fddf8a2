"""`use_sim_time` (issue 12): nodes read their node clock, so with a /clock source every stamp
they produce is simulation time, not the wall clock."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("rclpy")

from fleet_helpers import use_domain  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(120)]

SIM_START_S = 5000


def test_executor_stamps_segments_in_simulation_time(monkeypatch):
    use_domain(monkeypatch, 174)
    import rclpy
    from builtin_interfaces.msg import Time
    from rclpy.action import ActionClient
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.node import Node
    from rosgraph_msgs.msg import Clock

    from timelyllm_ros.action import ExecuteSegment
    from timelyllm_ros.ros import topics
    from timelyllm_ros.ros.conversions import time_to_s
    from timelyllm_ros.ros.executor_node import ExecutorNode

    robot = "simtime_1"
    rclpy.init(args=["--ros-args", "-p", f"robot_id:={robot}", "-p", "use_sim_time:=true",
                     "-p", "backend:=drone-sim", "-p", "time_scale:=0.001"])
    executor = MultiThreadedExecutor(num_threads=3)
    node = ExecutorNode()
    helper = Node("sim_clock")
    clock_pub = helper.create_publisher(Clock, "/clock", 10)
    action = ActionClient(helper, ExecuteSegment, topics.robot_topic(robot, topics.EXECUTE_SEGMENT))
    executor.add_node(node)
    executor.add_node(helper)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    stop = threading.Event()

    def tick():  # simulation time: from 5000 s, ten times faster than the wall clock
        t0 = time.monotonic()
        while not stop.is_set():
            sim = SIM_START_S + 10 * (time.monotonic() - t0)
            clock_pub.publish(Clock(clock=Time(sec=int(sim), nanosec=int(sim % 1 * 1e9))))
            time.sleep(0.01)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        assert action.wait_for_server(timeout_sec=30)
        deadline = time.monotonic() + 30
        while node.get_clock().now().nanoseconds < SIM_START_S * 1e9 and time.monotonic() < deadline:
            time.sleep(0.02)   # until the node has heard /clock
        wall_before = time.time()
        goal = ExecuteSegment.Goal(task_id="sim-1", robot_id=robot, sequence=0,
                                   text="tk;mf,100;", calls=[], is_last=True)
        sent = action.send_goal_async(goal)
        while not sent.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        result_future = sent.result().get_result_async()
        while not result_future.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        result = result_future.result().result
        assert result.success, result.message
        started, finished = time_to_s(result.started), time_to_s(result.finished)
        # Simulation time (5000 s onwards, a minute at most), nowhere near the wall clock.
        assert SIM_START_S <= started <= finished < SIM_START_S + 600, (started, finished)
        assert abs(started - wall_before) > 1e6
    finally:
        stop.set()
        ticker.join(timeout=2)
        executor.shutdown(timeout_sec=2)
        node.shutdown()
        node.destroy_node()
        helper.destroy_node()
        rclpy.try_shutdown()
