"""A robot-side executor node: serves /<robot>/execute_segment, runs segments in order.

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

Interface: the `ExecuteSegment` action (the planner is the client), served by one
`RobotServer` (ros/robot_server.py: ordering, cancel, reports, the worker thread). To host many
simulated robots in one process, use the fleet simulator (ros/fleet_sim_node.py).

Parameter `planner_lost_after_s` (default 4.0; 0 turns it off): when the planner gives no sign
of life for that long (a planner killed with SIGKILL; one that left cleanly is noticed at once),
the robot stops its segments, holds position and ends their goals ABORTED, "planner lost: ..."
(ros/planner_liveness.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from rclpy.node import Node

from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.robots.backend import SkillBackend, StopSignal
from timelyllm_ros.robots.factory import make_backend
from timelyllm_ros.robots.tello.sdk import DEFAULT_HOST as DEFAULT_TELLO_HOST
from timelyllm_ros.robots.tello.sdk import DEFAULT_PORT as DEFAULT_TELLO_PORT
from timelyllm_ros.robots.tello.sdk import DEFAULT_STATE_PORT as DEFAULT_TELLO_STATE_PORT
from timelyllm_ros.ros import diagnostics, share
from timelyllm_ros.ros.planner_params import warn_undeclared_overrides
from timelyllm_ros.ros.planner_liveness import PlannerWatch, declare_lost_after
from timelyllm_ros.ros.robot_server import RobotServer
from timelyllm_ros.ros.runtime import run_node

# Every parameter the node may declare (some only with their backend): what `timelyllm launch
# --set NODE.NAME=...` accepts (ros/launch_description.py).
PARAMETER_NAMES = ("robot_id", "exec_model", "time_scale", "seed", "never_report", "backend",
                   "tello_host", "tello_port", "tello_state_port", "tello_local_port",
                   "replay_table", "scene", "skill_map", "planner_lost_after_s")


class ExecutorNode(Node):
    def __init__(self, backend: SkillBackend | None = None, node_name: str = "executor"):
        super().__init__(node_name)
        self.robot_id = self.declare_parameter("robot_id", "").value or self.get_namespace().strip("/")
        if not self.robot_id:
            raise ValueError("parameter robot_id: empty; set it or start the node in the robot's namespace")
        exec_model = self.declare_parameter("exec_model", "").value
        time_scale = float(self.declare_parameter("time_scale", 1.0).value)
        seed = int(self.declare_parameter("seed", 0).value)
        # Test hook for the planner's dead-robot handling: accept segments, never finish them
        # (until they are cancelled).
        never_finish = bool(self.declare_parameter("never_report", False).value)
        lost_after_s = declare_lost_after(self)
        if not time_scale > 0:
            raise ValueError(f"parameter time_scale: must be > 0, got {time_scale}")
        model = ExecutionTimeModel.from_yaml(
            Path(exec_model) if exec_model else share.config_dir() / "exec_model.yaml")
        signal = StopSignal()
        backend_kind = str(self.declare_parameter("backend", "sim").value).strip().lower()
        tello = {
            "host": str(self.declare_parameter("tello_host", DEFAULT_TELLO_HOST).value),
            "port": int(self.declare_parameter("tello_port", DEFAULT_TELLO_PORT).value),
            "state_port": int(self.declare_parameter("tello_state_port", DEFAULT_TELLO_STATE_PORT).value),
            "local_port": int(self.declare_parameter("tello_local_port", 0).value),
        }
        if backend is None:
            params = {"model": model, "time_scale": time_scale, "seed": seed, "stop": signal}
            if backend_kind == "tello":
                params.update(tello)
            elif backend_kind == "replay":  # robots/replay.py: recorded durations
                params.update(replay_table=str(self.declare_parameter("replay_table", "").value),
                              robot_id=self.robot_id)
            elif backend_kind == "drone-sim":  # robots/drone_sim.py: a drone in a scene
                scene = str(self.declare_parameter("scene", "").value)
                params.update(scene=scene or None)
            elif backend_kind == "action-bridge":  # robots/action_bridge.py: a skill map
                params.update(skill_map=str(self.declare_parameter("skill_map", "").value))
            warn_undeclared_overrides(self, PARAMETER_NAMES)
            backend = make_backend(backend_kind, **params)
        else:
            backend_kind = type(backend).__name__
        self.robot = RobotServer(self, self.robot_id, backend, signal, backend_kind=backend_kind,
                                 never_finish=never_finish)
        self.planner_watch = PlannerWatch(self, lost_after_s, self.robot.planner_lost) \
            if lost_after_s else None
        self._diag = diagnostics.Publisher(self, f"executor {self.robot_id}", self.robot_id,
                                           self._diagnose)
        self.get_logger().info(
            f"executor for {self.robot_id} ready (backend {backend_kind}, time_scale {time_scale})")

    def _diagnose(self):
        level, message, values = self.robot.diagnose()
        if self.planner_watch is not None:
            values.update(self.planner_watch.values())
        return level, message, values

    def shutdown(self) -> None:
        if self.planner_watch is not None:
            self.planner_watch.close()
        self.robot.shutdown()


def main(argv: list[str] | None = None) -> int:
    return run_node(ExecutorNode, "executor", argv, threads=2)

if __name__ == "__main__":
    sys.exit(main())
