"""The executor node's `backend` parameter: a node with backend tello, pointed at the Tello
emulator on loopback, executes ExecuteSegment goals received over ROS 2 and reports them."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time

import pytest

from timelyllm_ros.robots.factory import make_backend
from timelyllm_ros.ros_env import REPO_ROOT

SCALE = 0.05
# Unique per process: concurrent runs of this test on one machine never see each other.
ROBOT = f"tello_t{os.getpid()}"


def _load_emulator_module():
    name = "tello_emulator"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "tools" / "tello_emulator.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_make_backend_kinds():
    from timelyllm_ros.robots.arm import ArmBackend
    from timelyllm_ros.robots.tello.backend import TelloBackend

    tello = make_backend("tello", host="127.0.0.1", port=8889, state_port=0, local_port=0,
                         time_scale=0.5, seed=3)
    try:
        assert isinstance(tello, TelloBackend)
        assert tello.drone == ("127.0.0.1", 8889) and tello.state_port > 0
        # Timeouts derive from config/exec_model.yaml: forward 100 = 1.0 + 100/50 s.
        assert tello.timings.expected("forward 100") == pytest.approx(3.0)
        assert tello.timeout_for("forward 100") == pytest.approx(2 * 3.0 + 3.0)
    finally:
        tello.close()
    assert isinstance(make_backend("ARM-SIM", time_scale=0.1), ArmBackend)
    with pytest.raises(ValueError, match="unknown kind 'ufo'"):
        make_backend("ufo")
    with pytest.raises(ValueError, match="port"):
        make_backend("tello", host="127.0.0.1", port=70000)
    with pytest.raises(ValueError, match="host"):
        make_backend("tello", host="no.such.host.invalid", port=8889)


@pytest.mark.ros
def test_executor_node_with_tello_backend_executes_segments(monkeypatch):
    rclpy = pytest.importorskip("rclpy")
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.node import Node

    # A private DDS domain on loopback, restored afterwards (other tests pick their own).
    monkeypatch.setenv("ROS_DOMAIN_ID", "219")
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.setenv("RMW_IMPLEMENTATION", os.environ.get("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp"))
    from timelyllm_ros.experiments.demo import isolate_ros_network

    isolate_ros_network()
    if rclpy.ok():
        pytest.skip("rclpy already initialised by another test in this process")

    from timelyllm_ros.msg import ExecutionReport
    from timelyllm_ros.ros import topics
    from timelyllm_ros.ros.conversions import time_to_s
    from timelyllm_ros.ros.executor_node import ExecutorNode
    from timelyllm_ros.robots.tello.backend import TelloBackend

    emu = _load_emulator_module().TelloEmulator("127.0.0.1", 0, state_port=None,
                                                time_scale=SCALE).start()
    rclpy.init(args=["test_executor_backends", "--ros-args",
                     "-p", f"robot_id:={ROBOT}", "-p", "backend:=tello",
                     "-p", "tello_host:=127.0.0.1", "-p", f"tello_port:={emu.port}",
                     "-p", "tello_state_port:=0", "-p", "tello_local_port:=0"])
    executor = MultiThreadedExecutor(num_threads=2)
    node = client = None
    spin = None
    try:
        node = ExecutorNode()
        assert isinstance(node.robot.backend, TelloBackend)
        assert node.robot.backend.drone == ("127.0.0.1", emu.port)
        emu.state_port = node.robot.backend.state_port

        client = Node("tello_test_client")
        reports: list[ExecutionReport] = []
        lock = threading.Lock()

        def on_report(msg):
            with lock:
                reports.append(msg)

        from rclpy.action import ActionClient

        from timelyllm_ros.action import ExecuteSegment

        action = ActionClient(client, ExecuteSegment, topics.robot_topic(ROBOT, topics.EXECUTE_SEGMENT))
        client.create_subscription(ExecutionReport,
                                   topics.robot_topic(ROBOT, topics.EXECUTION_REPORTS),
                                   on_report, topics.COMMAND_QOS)
        executor.add_node(node)
        executor.add_node(client)
        spin = threading.Thread(target=executor.spin, daemon=True)
        spin.start()
        assert action.wait_for_server(timeout_sec=30), "executor did not serve execute_segment"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and node.robot.report_pub.get_subscription_count() == 0:
            time.sleep(0.05)

        segments = [
            ExecuteSegment.Goal(task_id="fly-1", robot_id=ROBOT, sequence=0, text="tk;mf,100;",
                         calls=["takeoff()", "move_forward(100)"], is_last=False),
            ExecuteSegment.Goal(task_id="fly-1", robot_id=ROBOT, sequence=1, text="tc,90;ld;",
                         calls=["turn_cw(90)", "land()"], is_last=True),
            # A variable argument cannot be resolved on the robot: reported as a failure.
            ExecuteSegment.Goal(task_id="bad-2", robot_id=ROBOT, sequence=0, text="mf,_1;",
                         calls=["move_forward(_1)"], is_last=True),
        ]
        t_publish = time.time()
        # Sequence 1 first: the node must hold it until sequence 0 has been executed.
        for seg in (segments[1], segments[0], segments[2]):
            action.send_goal_async(seg)
            time.sleep(0.05)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if len(reports) >= 3:
                    break
            time.sleep(0.05)
        t_done = time.time()
        with lock:
            got = {(r.task_id, r.sequence): r for r in reports}
        assert set(got) == {("fly-1", 0), ("fly-1", 1), ("bad-2", 0)}, [r.message for r in reports]

        r0, r1, bad = got[("fly-1", 0)], got[("fly-1", 1)], got[("bad-2", 0)]
        assert r0.success and r1.success, (r0.message, r1.message)
        # The Tello interprets plans (robots/tello/runtime.py): the message is the interpreter's.
        assert r0.robot_id == ROBOT and "2 call(s)" in r0.message
        assert not bad.success and "_1" in bad.message and "mf,_1" in bad.message
        # Plausible start/finish: inside the test's window, ordered, and no faster than the
        # emulator's model of the commands (takeoff 5 s + forward 100 at (1 + 2) s, scaled).
        s0, f0, s1, f1 = (time_to_s(r0.started), time_to_s(r0.finished),
                          time_to_s(r1.started), time_to_s(r1.finished))
        assert t_publish - 0.5 <= s0 <= f0 <= s1 <= f1 <= t_done + 0.5
        assert f0 - s0 >= 0.9 * (5.0 + 3.0) * SCALE
        assert f1 - s1 >= 0.9 * ((1.0 + 1.0) + 4.0) * SCALE
        assert f0 - s0 < (5.0 + 3.0) * SCALE + 5.0
        # What the drone saw: strictly in order, one at a time, all acknowledged; the bad
        # segment moved nothing and left the drone safe (`stop`: hover). `stop` is sent without
        # waiting for its answer, so the emulator may still be receiving or answering it here.
        settle = time.monotonic() + 5
        while time.monotonic() < settle and (len(emu.log) < 6
                                             or any(r.reply is None for r in emu.log)):
            time.sleep(0.02)
        assert [r.command for r in emu.log] == ["command", "takeoff", "forward 100", "cw 90", "land",
                                                "stop"]
        assert emu.overlaps == 0, emu.overlaps
        assert [r.reply for r in emu.log] == ["ok"] * 6
    finally:
        executor.shutdown(timeout_sec=5)
        if spin is not None:
            spin.join(timeout=5)
        if node is not None:
            node.shutdown()
            node.destroy_node()
        if client is not None:
            client.destroy_node()
        rclpy.try_shutdown()
        emu.stop()
