"""A small rclpy client of the planner: submit goals, watch statuses, segments and metrics.

Used by `timelyllm demo`, `timelyllm submit` and the end-to-end tests; a robotics engineer's own
tooling can use it the same way.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node

from timelyllm_ros.msg import (ExecutionReport, PlannerMetrics, SkillSegment, TaskGoal,
                               TaskStatus)
from timelyllm_ros.ros import topics

TERMINAL = {"done", "failed", "rejected", "cancelled"}


@dataclass
class Observed:
    statuses: dict[str, list[TaskStatus]] = field(default_factory=lambda: defaultdict(list))
    segments: dict[str, list[SkillSegment]] = field(default_factory=lambda: defaultdict(list))
    reports: dict[str, list[ExecutionReport]] = field(default_factory=lambda: defaultdict(list))
    metrics: list[PlannerMetrics] = field(default_factory=list)

    def last(self, task_id: str) -> TaskStatus | None:
        seen = self.statuses.get(task_id)
        return seen[-1] if seen else None


class PlannerClient:
    """Spins its own executor thread; all accessors are safe from the caller's thread."""

    def __init__(self, robots: list[str] = (), node_name: str = "timelyllm_client"):
        self._owns_context = not rclpy.ok()
        if self._owns_context:
            rclpy.init()
        self.node = Node(node_name)
        self.seen = Observed()
        self._lock = threading.Lock()
        self._goal_pub = self.node.create_publisher(TaskGoal, topics.TASK_GOALS, topics.COMMAND_QOS)
        self.node.create_subscription(TaskStatus, topics.TASK_STATUS, self._on_status, topics.STATUS_QOS)
        self.node.create_subscription(PlannerMetrics, topics.PLANNER_METRICS,
                                      lambda m: self._record(self.seen.metrics, m), topics.METRICS_QOS)
        for robot in robots:
            self.watch_robot(robot)
        self._executor = SingleThreadedExecutor()
        self._executor.add_node(self.node)
        self._thread = threading.Thread(target=self._executor.spin, daemon=True)
        self._thread.start()

    def watch_robot(self, robot_id: str) -> None:
        self.node.create_subscription(
            SkillSegment, topics.robot_topic(robot_id, topics.SKILL_SEGMENTS),
            lambda m: self._record(self.seen.segments[m.task_id], m), topics.COMMAND_QOS)
        self.node.create_subscription(
            ExecutionReport, topics.robot_topic(robot_id, topics.EXECUTION_REPORTS),
            lambda m: self._record(self.seen.reports[m.task_id], m), topics.COMMAND_QOS)

    def _record(self, bucket: list, msg) -> None:
        with self._lock:
            bucket.append(msg)

    def _on_status(self, msg: TaskStatus) -> None:
        self._record(self.seen.statuses[msg.task_id], msg)

    def wait_for_planner(self, timeout_s: float, alive=lambda: True) -> bool:
        """The planner subscribes to goals only once its engine is warm."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and alive():
            if self._goal_pub.get_subscription_count() > 0:
                return True
            time.sleep(0.2)
        return False

    def submit(self, task_id: str, robot_id: str, instruction: str, *, skill_set: str = "drone",
               urgency: str = "normal", ert_s: float = 0.0, slope: float = 0.0,
               initial_utility: float = 0.0) -> None:
        self._goal_pub.publish(TaskGoal(
            task_id=task_id, robot_id=robot_id, skill_set=skill_set, instruction=instruction,
            urgency=urgency, expected_response_time_s=float(ert_s), decline_slope_per_s=float(slope),
            initial_utility=float(initial_utility)))

    def publish_goal(self, goal: TaskGoal) -> None:
        self._goal_pub.publish(goal)

    def last_status(self, task_id: str) -> TaskStatus | None:
        with self._lock:
            return self.seen.last(task_id)

    def wait_terminal(self, task_ids: list[str], timeout_s: float) -> dict[str, TaskStatus | None]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = {t: self.last_status(t) for t in task_ids}
            if all(s is not None and s.state in TERMINAL for s in states.values()):
                return states
            time.sleep(0.1)
        return {t: self.last_status(t) for t in task_ids}

    def wait_for(self, predicate, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if predicate(self.seen):
                    return True
            time.sleep(0.1)
        return False

    def close(self) -> None:
        self._executor.shutdown(timeout_sec=2)
        self.node.destroy_node()
        if self._owns_context:
            rclpy.try_shutdown()
        self._thread.join(timeout=2)
