"""A fleet of simulated robots in one process: one node, one `RobotServer` per robot.

Each robot has its own namespace topics and action server (/<robot>/execute_segment,
/<robot>/execution_reports), its own backend and worker thread, exactly as if it were its own
executor node, so the planner cannot tell the difference. One process instead of one per robot
is what makes a fleet of hundreds practical: separate processes each pay for a Python
interpreter, rclpy and a DDS participant (59 of them took 130 s to come up on 2 cores).

Parameters:
- `robots`: string array of `robot_id:kind`, kind `drone` or `arm` (the planner's `robots`
  format, so one list feeds both). Or, instead:
- `drones`, `arms`: how many of each, named `drone_1..N` and `arm_1..M`.
- `drone_backend` (default `drone-sim`: a drone in a scene that interprets MiniSpec),
  `arm_backend` (default `arm-sim`), `scene` (a scene YAML for every drone; empty: the default
  room), `exec_model`, `time_scale` (seconds slept per modelled second), `seed` (robot i gets
  seed + i).
- `planner_lost_after_s` (default 4.0; 0 turns it off): when the planner gives no sign of life
  for that long, every robot stops the segments it gave them and holds position
  (ros/planner_liveness.py; one watch for the whole fleet).

Diagnostics: one status for the fleet (robots, busy, segments done / failed / cancelled).
Run it with `ros2 run timelyllm_ros fleet_sim_node --ros-args -p drones:=150 -p arms:=50` or
from `timelyllm soak` (experiments/soak.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node

from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.robots.backend import StopSignal
from timelyllm_ros.robots.factory import make_backend
from timelyllm_ros.ros import diagnostics, share
from timelyllm_ros.ros.planner_params import warn_undeclared_overrides
from timelyllm_ros.ros.planner_liveness import PlannerWatch, declare_lost_after
from timelyllm_ros.ros.robot_server import RobotServer
from timelyllm_ros.ros.runtime import run_node

ROBOT_KINDS = ("drone", "arm")
# Every parameter the node declares: what `timelyllm launch --set NODE.NAME=...` accepts
# (ros/launch_description.py).
PARAMETER_NAMES = ("robots", "drones", "arms", "exec_model", "time_scale", "seed", "scene",
                   "drone_backend", "arm_backend", "planner_lost_after_s")
MAX_ROBOTS = 2000


def fleet_robots(drones: int, arms: int) -> list[str]:
    """`robot_id:kind` entries for `drones` drones and `arms` arms (the planner's format)."""
    if drones < 0 or arms < 0:
        raise ValueError(f"drones/arms: must be >= 0, got {drones}/{arms}")
    return [f"drone_{i}:drone" for i in range(1, drones + 1)] + \
           [f"arm_{i}:arm" for i in range(1, arms + 1)]


def parse_fleet(entries: list[str]) -> list[tuple[str, str]]:
    """[(robot_id, kind)] from `robot_id:kind` entries; ValueError naming the entry."""
    fleet, seen = [], set()
    for entry in entries:
        robot_id, sep, kind = str(entry).partition(":")
        if not sep or not robot_id or kind not in ROBOT_KINDS:
            raise ValueError(f"parameter robots: {entry!r} must be 'robot_id:kind' with kind in "
                             f"{list(ROBOT_KINDS)}")
        if robot_id in seen:
            raise ValueError(f"parameter robots: robot_id {robot_id!r} appears twice")
        seen.add(robot_id)
        fleet.append((robot_id, kind))
    if len(fleet) > MAX_ROBOTS:
        raise ValueError(f"parameter robots: {len(fleet)} robots; at most {MAX_ROBOTS} per process")
    return fleet


class FleetSimNode(Node):
    def __init__(self, node_name: str = "fleet_sim"):
        super().__init__(node_name)
        entries = list(self.declare_parameter("robots", [""]).value or [])
        entries = [e for e in entries if e]
        drones = int(self.declare_parameter("drones", 0).value)
        arms = int(self.declare_parameter("arms", 0).value)
        if entries and (drones or arms):
            raise ValueError("parameters robots and drones/arms: give one or the other")
        fleet = parse_fleet(entries or fleet_robots(drones, arms))
        if not fleet:
            raise ValueError("parameter robots: empty; list 'robot_id:kind' entries or set "
                             "drones/arms")
        exec_model = str(self.declare_parameter("exec_model", "").value)
        time_scale = float(self.declare_parameter("time_scale", 1.0).value)
        if not time_scale > 0:
            raise ValueError(f"parameter time_scale: must be > 0, got {time_scale}")
        seed = int(self.declare_parameter("seed", 0).value)
        scene = str(self.declare_parameter("scene", "").value)
        backends = {"drone": str(self.declare_parameter("drone_backend", "drone-sim").value),
                    "arm": str(self.declare_parameter("arm_backend", "arm-sim").value)}
        lost_after_s = declare_lost_after(self)
        warn_undeclared_overrides(self)
        model = ExecutionTimeModel.from_yaml(
            Path(exec_model) if exec_model else share.config_dir() / "exec_model.yaml")
        group = ReentrantCallbackGroup()
        started = time.monotonic()
        self.robots: dict[str, RobotServer] = {}
        for index, (robot_id, kind) in enumerate(fleet):
            signal = StopSignal()
            params = {"model": model, "time_scale": time_scale, "seed": seed + index,
                      "stop": signal}
            if backends[kind] == "drone-sim" and scene:
                params["scene"] = scene
            try:
                backend = make_backend(backends[kind], **params)
            except ValueError as err:
                raise ValueError(f"parameter {kind}_backend: {err}") from None
            self.robots[robot_id] = RobotServer(self, robot_id, backend, signal,
                                                backend_kind=backends[kind], log_segments=False,
                                                callback_group=group)
        self.planner_watch = PlannerWatch(self, lost_after_s, self._planner_lost) \
            if lost_after_s else None
        self._diag = diagnostics.Publisher(self, "fleet simulator", self.get_name(), self._diagnose)
        kinds = {k: sum(1 for _, kk in fleet if kk == k) for k in ROBOT_KINDS}
        self.get_logger().info(
            f"fleet of {len(fleet)} robots ready in {time.monotonic() - started:.1f} s "
            f"({kinds['drone']} drones on {backends['drone']}, {kinds['arm']} arms on "
            f"{backends['arm']}, time_scale {time_scale})")

    def totals(self) -> dict[str, int]:
        counts = {"done": 0, "failed": 0, "cancelled": 0}
        for robot in self.robots.values():
            for key, value in robot.counts.items():
                counts[key] += value
        return counts

    def _diagnose(self):
        busy = sum(1 for r in self.robots.values() if r.busy)
        values = {"robots": len(self.robots), "robots_busy": busy,
                  **{f"segments_{k}": v for k, v in self.totals().items()}}
        if self.planner_watch is not None:
            values.update(self.planner_watch.values())
        return diagnostics.OK, f"{busy} of {len(self.robots)} robots busy", values

    def _planner_lost(self, reason: str, accepted_before: float) -> int:
        return sum(robot.planner_lost(reason, accepted_before) for robot in self.robots.values())

    def shutdown(self) -> None:
        # Stop every robot first, then wait once for all: shutdown stays within the process's
        # exit bound however large the fleet is.
        if self.planner_watch is not None:
            self.planner_watch.close()
        for robot in self.robots.values():
            robot.begin_shutdown()
        deadline = time.monotonic() + 1.0
        for robot in self.robots.values():
            robot.finish_shutdown(deadline - time.monotonic())


def main(argv: list[str] | None = None) -> int:
    return run_node(FleetSimNode, "fleet_sim", argv, threads=4)

if __name__ == "__main__":
    sys.exit(main())
