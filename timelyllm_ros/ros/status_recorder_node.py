"""Records every TaskStatus on /timelyllm/task_status as one JSON object per line.

Plain task statuses only; the rosbag2 recorder of LRTrace records everything else.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import rclpy
from rclpy.node import Node

from timelyllm_ros.msg import TaskStatus
from timelyllm_ros.ros import topics
from timelyllm_ros.ros.runtime import spin_until_shutdown
from timelyllm_ros.ros.conversions import time_to_s


def status_to_dict(msg: TaskStatus) -> dict:
    def num(x: float):
        return None if math.isnan(x) else x

    return {
        "stamp": time_to_s(msg.stamp), "task_id": msg.task_id, "robot_id": msg.robot_id,
        "state": msg.state, "reason": msg.reason, "response_time_s": num(msg.response_time_s),
        "utility": num(msg.utility), "waiting_time_s": num(msg.waiting_time_s),
        "segments_dispatched": msg.segments_dispatched, "segments_completed": msg.segments_completed,
        "resumes": msg.resumes, "cached_tokens_last_resume": msg.cached_tokens_last_resume,
        "cached_tokens_total": msg.cached_tokens_total, "urgency": msg.urgency,
        "expected_response_time_s": num(msg.expected_response_time_s),
        "decline_slope_per_s": num(msg.decline_slope_per_s),
        "initial_utility": num(msg.initial_utility),
    }


# The node's parameters: what `timelyllm launch --set NODE.NAME=...` accepts.
PARAMETER_NAMES = ("output",)


class StatusRecorderNode(Node):
    def __init__(self):
        super().__init__("status_recorder")
        output = self.declare_parameter("output", "task_status.jsonl").value
        self._path = Path(output)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        # Line-buffered so a killed recorder still leaves every line it received on disk.
        self._file = self._path.open("a", buffering=1, encoding="utf-8")
        self.create_subscription(TaskStatus, topics.TASK_STATUS, self._on_status, topics.STATUS_QOS)
        self.get_logger().info(f"recording task statuses to {self._path}")

    def _on_status(self, msg: TaskStatus) -> None:
        self._file.write(json.dumps(status_to_dict(msg)) + "\n")

    def close(self) -> None:
        self._file.close()


def main(argv: list[str] | None = None) -> int:
    rclpy.init(args=argv if argv is not None else sys.argv)
    node = StatusRecorderNode()
    spin_until_shutdown(node, cleanup=node.close)
    return 0


if __name__ == "__main__":
    sys.exit(main())
