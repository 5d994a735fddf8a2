"""LRTrace recorder: task goals, skill segments, execution reports and task statuses to a rosbag2
bag in MCAP format (written with `rosbags`, readable by `ros2 bag`).

Topics (QoS from topics.py, so the recorder matches every publisher, and a late start still gets
the recent task states that /timelyllm/task_status keeps as TRANSIENT_LOCAL):
- /timelyllm/task_goals, /timelyllm/task_status;
- /<robot>/skill_segments and /<robot>/execution_reports for every robot named in `robots`, and
  for every robot that shows up later: the topic graph is polled every `discovery_period_s` and
  new per-robot topics are subscribed to. Robots that go away keep their subscription, so they
  are recorded again when they come back.

Every message is written to the bag in its callback (under the writer's lock) and the pending
chunk is flushed to the file every half second; SIGINT/SIGTERM stop the node, already-arrived
messages are drained, and the bag is closed properly (summary + metadata.yaml). The node prints
`[lrtrace] recorded N messages` whenever the count changes (at most twice a second).

Parameters: output (bag: `run.mcap` -> run/run.mcap + run/metadata.yaml), robots (comma-separated
or a list), duration_s (0 = until stopped), discovery_period_s, write_table (skill_timings.csv
beside the bag when stopping).

Run: `timelyllm lrtrace record -o run.mcap`, or as a node:
`python -m timelyllm_ros.ros.lrtrace_recorder_node --ros-args -p output:=run.mcap`.
"""

from __future__ import annotations

import re
import sys
import threading
from typing import Callable

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.node import Node

from timelyllm_ros.lrtrace import bag as bagmod
from timelyllm_ros.lrtrace import message_types as msgtypes
from timelyllm_ros.msg import ExecutionReport, SkillSegment, TaskGoal, TaskStatus
from timelyllm_ros.ros import topics

DISCOVERY_PERIOD_S = 1.0
PROGRESS_PERIOD_S = 0.5
# The node's parameters: what `timelyllm launch --set NODE.NAME=...` accepts.
PARAMETER_NAMES = ("output", "robots", "duration_s", "discovery_period_s", "write_table")
_ROBOT_TOPIC = re.compile(rf"^/(?P<robot>.+)/(?P<name>{topics.SKILL_SEGMENTS}|{topics.EXECUTION_REPORTS})$")
_PER_ROBOT = {
    topics.SKILL_SEGMENTS: (SkillSegment, msgtypes.SEGMENT_TYPE),
    topics.EXECUTION_REPORTS: (ExecutionReport, msgtypes.REPORT_TYPE),
}


_ROBOT_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_robots(value) -> list[str]:
    """`drone_1,drone_2` or a list -> robot ids; ValueError names a robot id that cannot be a
    ROS namespace."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    robots = []
    for item in items:
        r = str(item).strip().strip("/")
        if not r:
            continue
        if not _ROBOT_ID.match(r):
            raise ValueError(f"robots: {r!r} is not a valid ROS namespace (letters, digits, '_')")
        if r not in robots:
            robots.append(r)
    return robots


class LrtraceRecorderNode(Node):
    def __init__(self, *, log: Callable[[str], None] | None = None, **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "lrtrace_recorder"), **node_kwargs)
        self._log = log or (lambda line: print(line, flush=True))
        output = self.declare_parameter("output", "lrtrace.mcap").value
        robots = self.declare_parameter(
            "robots", "", ParameterDescriptor(dynamic_typing=True)).value
        self.duration_s = float(self.declare_parameter("duration_s", 0.0).value)
        period = float(self.declare_parameter("discovery_period_s", DISCOVERY_PERIOD_S).value)
        self.write_table = bool(self.declare_parameter("write_table", True).value)
        if not period > 0:
            raise ValueError(f"parameter discovery_period_s: must be > 0, got {period}")
        if self.duration_s < 0:
            raise ValueError(f"parameter duration_s: must be >= 0, got {self.duration_s}")
        robots = parse_robots(robots)
        self.writer = bagmod.BagWriter(output)  # raises BagError if the output exists
        self.write_errors = 0
        self._subscribed: set[str] = set()
        self._robots: list[str] = []
        self._lock = threading.Lock()
        self._last_reported = -1
        self._subscribe(topics.TASK_GOALS, TaskGoal, msgtypes.GOAL_TYPE, topics.COMMAND_QOS)
        self._subscribe(topics.TASK_STATUS, TaskStatus, msgtypes.STATUS_TYPE, topics.STATUS_QOS)
        for robot in robots:
            self.add_robot(robot)
        self.create_timer(period, self.discover)
        self.create_timer(PROGRESS_PERIOD_S, self.progress)
        self._log(f"[lrtrace] recording to {self.writer.bag_dir}/ "
                  f"(robots: {', '.join(self._robots) or 'discovered'}; "
                  f"{'for ' + format(self.duration_s, 'g') + ' s' if self.duration_s else 'until Ctrl-C'})")

    # --- subscriptions ------------------------------------------------------------------------
    def _subscribe(self, topic: str, cls, msgtype: str, qos) -> None:
        with self._lock:
            if topic in self._subscribed:
                return
            self._subscribed.add(topic)
        # The bag lists a topic from the moment it is recorded, like `ros2 bag record`.
        self.writer.add_topic(topic, msgtype, msgtypes.qos_from_rclpy(qos))
        self.create_subscription(cls, topic, lambda msg: self._on_message(topic, msgtype, msg), qos)

    def add_robot(self, robot: str) -> None:
        if robot in self._robots:
            return
        self._robots.append(robot)
        for name, (cls, msgtype) in _PER_ROBOT.items():
            self._subscribe(topics.robot_topic(robot, name), cls, msgtype, topics.COMMAND_QOS)

    def discover(self) -> None:
        """Subscribe to the per-robot topics of robots that appeared since the last poll."""
        try:
            graph = self.get_topic_names_and_types()
        except Exception as err:  # noqa: BLE001 - the graph may be unavailable while shutting down
            self.get_logger().debug(f"topic discovery failed: {err}")
            return
        for topic, types in graph:
            m = _ROBOT_TOPIC.match(topic)
            if not m:
                continue
            cls, msgtype = _PER_ROBOT[m.group("name")]
            if msgtype not in types:
                continue
            robot = m.group("robot")
            if robot not in self._robots:
                self._log(f"[lrtrace] discovered robot {robot}")
                self.add_robot(robot)

    @property
    def robots(self) -> list[str]:
        return list(self._robots)

    # --- recording ----------------------------------------------------------------------------
    def _on_message(self, topic: str, msgtype: str, msg) -> None:
        stamp = self.get_clock().now().nanoseconds  # the node clock (use_sim_time works)
        try:
            self.writer.write(topic, msg, stamp, msgtype=msgtype)
        except Exception as err:  # noqa: BLE001 - one bad message must not stop the recording
            self.write_errors += 1
            self.get_logger().error(f"{topic}: could not record a {msgtype}: {err}")

    def progress(self) -> None:
        """Flush the pending chunk to the file and acknowledge what has been recorded."""
        self.writer.flush()
        total = self.writer.total
        if total != self._last_reported:
            self._last_reported = total
            self._log(f"[lrtrace] recorded {total} messages")


def main(argv: list[str] | None = None) -> int:
    from timelyllm_ros.ros.lrtrace_record import run_node

    return run_node(argv if argv is not None else sys.argv)


if __name__ == "__main__":
    sys.exit(main())
