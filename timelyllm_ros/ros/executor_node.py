"""A robot-side executor node: runs skill segments in order and reports each one.

The node is the ROS adapter; what "executing" means is a backend (timelyllm_ros/robots, no ROS
there). The simulated backend sleeps for a duration drawn from the execution-time model
(config/exec_model.yaml), scaled by `time_scale` so demos and tests run faster than a real drone.
Real-hardware backends (e.g. a Tello over its UDP SDK) plug in through the same `SkillBackend`
interface (robots/backend.py).

Parameter `backend` picks one (robots/factory.py, make_backend): `sim` (default), `tello`
(with `tello_host`, `tello_port`, `tello_state_port`, `tello_local_port`; defaults are a real
Tello's 192.168.10.1, 8889, 8890 and any free local port), `arm-sim` or `replay` (with
`replay_table`, a timing table CSV whose recorded durations it replays). A backend object passed
to the constructor takes precedence.

Ordering: segments of a task are executed strictly by sequence number. One arriving early (while
the robot is busy, or ahead of a missing predecessor) waits in the robot's queue.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import rclpy
from rclpy.node import Node

from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.tuf import default_config_dir
from timelyllm_ros.msg import ExecutionReport, SkillSegment
from timelyllm_ros.ros import topics
from timelyllm_ros.ros.runtime import spin_until_shutdown
from timelyllm_ros.ros.conversions import parse_wire_call, s_to_time
from timelyllm_ros.robots.backend import SkillBackend
from timelyllm_ros.robots.factory import make_backend
from timelyllm_ros.robots.tello.sdk import DEFAULT_HOST as DEFAULT_TELLO_HOST
from timelyllm_ros.robots.tello.sdk import DEFAULT_PORT as DEFAULT_TELLO_PORT
from timelyllm_ros.robots.tello.sdk import DEFAULT_STATE_PORT as DEFAULT_TELLO_STATE_PORT


@dataclass(order=True)
class _Pending:
    sequence: int
    msg: SkillSegment


class ExecutorNode(Node):
    def __init__(self, backend: SkillBackend | None = None, node_name: str = "executor"):
        super().__init__(node_name)
        self.robot_id = self.declare_parameter("robot_id", "").value or self.get_namespace().strip("/")
        if not self.robot_id:
            raise ValueError("parameter robot_id: empty; set it or start the node in the robot's namespace")
        exec_model = self.declare_parameter("exec_model", "").value
        time_scale = float(self.declare_parameter("time_scale", 1.0).value)
        seed = int(self.declare_parameter("seed", 0).value)
        # Test hook for the planner's dead-robot handling: accept segments, never report.
        self._never_report = bool(self.declare_parameter("never_report", False).value)
        if not time_scale > 0:
            raise ValueError(f"parameter time_scale: must be > 0, got {time_scale}")
        model = ExecutionTimeModel.from_yaml(
            Path(exec_model) if exec_model else default_config_dir() / "exec_model.yaml")
        self._stop = threading.Event()
        self.backend_kind = str(self.declare_parameter("backend", "sim").value).strip().lower()
        tello = {
            "host": str(self.declare_parameter("tello_host", DEFAULT_TELLO_HOST).value),
            "port": int(self.declare_parameter("tello_port", DEFAULT_TELLO_PORT).value),
            "state_port": int(self.declare_parameter("tello_state_port", DEFAULT_TELLO_STATE_PORT).value),
            "local_port": int(self.declare_parameter("tello_local_port", 0).value),
        }
        if backend is None:
            params = {"model": model, "time_scale": time_scale, "seed": seed, "stop": self._stop}
            if self.backend_kind == "tello":
                params.update(tello)
            elif self.backend_kind == "replay":  # robots/replay.py: recorded durations
                params.update(replay_table=str(self.declare_parameter("replay_table", "").value),
                              robot_id=self.robot_id)
            backend = make_backend(self.backend_kind, **params)
        else:
            self.backend_kind = type(backend).__name__
        self._backend = backend
        self._report_pub = self.create_publisher(
            ExecutionReport, topics.robot_topic(self.robot_id, topics.EXECUTION_REPORTS), topics.COMMAND_QOS)
        self.create_subscription(SkillSegment, topics.robot_topic(self.robot_id, topics.SKILL_SEGMENTS),
                                 self._on_segment, topics.COMMAND_QOS)
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._next_sequence: dict[str, int] = {}
        self._early: dict[str, list[_Pending]] = {}
        self._worker = threading.Thread(target=self._run, name=f"{self.robot_id}-executor", daemon=True)
        self._worker.start()
        self.get_logger().info(
            f"executor for {self.robot_id} ready (backend {self.backend_kind}, time_scale {time_scale})")

    def _on_segment(self, msg: SkillSegment) -> None:
        if msg.robot_id != self.robot_id:
            self.get_logger().error(f"segment for robot_id {msg.robot_id!r} arrived at {self.robot_id}; ignored")
            return
        expected = self._next_sequence.get(msg.task_id, 0)
        if msg.sequence < expected:
            self.get_logger().warning(f"duplicate segment {msg.task_id}#{msg.sequence}; ignored")
            return
        held = self._early.setdefault(msg.task_id, [])
        held.append(_Pending(msg.sequence, msg))
        held.sort()
        while held and held[0].sequence == self._next_sequence.get(msg.task_id, 0):
            self._work.put(held.pop(0).msg)
            self._next_sequence[msg.task_id] = self._next_sequence.get(msg.task_id, 0) + 1
        if not held:
            self._early.pop(msg.task_id, None)
        if msg.is_last and not self._early.get(msg.task_id):
            self._next_sequence.pop(msg.task_id, None)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._work.get(timeout=0.2)
            except queue.Empty:
                continue
            started = time.time()
            try:
                calls = [parse_wire_call(c) for c in msg.calls]
                ok, message = self._backend.execute(calls)
            except ValueError as err:
                ok, message = False, str(err)
            finished = time.time()
            if self._stop.is_set() or self._never_report:
                continue
            self._report_pub.publish(ExecutionReport(
                task_id=msg.task_id, robot_id=self.robot_id, sequence=msg.sequence,
                started=s_to_time(started), finished=s_to_time(finished), success=ok, message=message))

    def shutdown(self) -> None:
        self._stop.set()
        self._worker.join(timeout=5)
        close = getattr(self._backend, "close", None)
        if callable(close):
            close()


def main(argv: list[str] | None = None) -> int:
    rclpy.init(args=argv if argv is not None else sys.argv)
    try:
        node = ExecutorNode()
    except ValueError as err:
        print(f"executor: {err}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    spin_until_shutdown(node, cleanup=node.shutdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
