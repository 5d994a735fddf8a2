"""A small rclpy client of the planner: PlanTask goals with their feedback and results,
UpdateTask / CancelTask, the planner's lifecycle, fire-and-forget TaskGoals, and the status,
segment, report and metrics topics.

Used by `timelyllm demo`, `timelyllm submit/cancel/update/top` and the end-to-end tests; a
robotics engineer's own tooling can use it the same way.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import rclpy
from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node

from timelyllm_ros.action import PlanTask
from timelyllm_ros.msg import (ExecutionReport, PlannerMetrics, SkillSegment, TaskGoal,
                               TaskStatus)
from timelyllm_ros.ros import topics
from timelyllm_ros.ros.lifecycle_client import LifecycleClient
from timelyllm_ros.ros.planner_liveness import DEFAULT_LOST_AFTER_S, PlannerWatch
from timelyllm_ros.srv import CancelTask, UpdateTask

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


class GoalRun:
    """One PlanTask goal: its feedback as it arrives, its result when it ends."""

    def __init__(self, client: "PlannerClient", goal: PlanTask.Goal, on_feedback=None):
        self.goal = goal
        self.feedback: list[PlanTask.Feedback] = []
        self._on_feedback = on_feedback
        self._client = client
        self.handle = None
        self._result_future = None
        # Set when the planner vanished (SIGKILL) before answering: a PlanTask result can then
        # never come, so `result` gives one that says so (PlannerClient's PlannerWatch).
        self.planner_lost: str | None = None

    def _feedback(self, msg) -> None:
        self.feedback.append(msg.feedback)
        if self._on_feedback is not None:
            self._on_feedback(msg.feedback)

    def wait_accepted(self, future, timeout_s: float) -> bool:
        if not _wait(future, timeout_s):
            raise TimeoutError(f"PlanTask goal not answered within {timeout_s:.0f} s")
        self.handle = future.result()
        if self.handle.accepted:
            self._result_future = self.handle.get_result_async()
        return bool(self.handle.accepted)

    def result(self, timeout_s: float) -> tuple[int, PlanTask.Result] | None:
        """(GoalStatus code, result), or None if it did not end within `timeout_s`. If the
        planner vanished first: (STATUS_UNKNOWN, a result with state "failed" and the reason)."""
        if self._result_future is None:
            return None
        deadline = time.monotonic() + timeout_s
        while not self._result_future.done():
            if self.planner_lost is not None:
                return GoalStatus.STATUS_UNKNOWN, PlanTask.Result(
                    task_id=self.task_id, state="failed", reason=self.planner_lost,
                    response_time_s=float("nan"), utility=float("nan"),
                    waiting_time_s=float("nan"))
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        response = self._result_future.result()
        return response.status, response.result

    def cancel(self, timeout_s: float = 10.0):
        """Request cancellation; returns the CancelGoal response (goals_canceling non-empty
        when the planner took it)."""
        future = self.request_cancel()
        if not _wait(future, timeout_s):
            raise TimeoutError("cancel not answered")
        return future.result()

    def request_cancel(self):
        """Request cancellation without waiting: the future of the CancelGoal response (for a
        caller that keeps waiting for the result meanwhile, e.g. `timelyllm submit`)."""
        return self.handle.cancel_goal_async()

    def finished(self) -> bool:
        return self._result_future is not None and self._result_future.done()

    @property
    def task_id(self) -> str:
        """The goal's task id, or the one the planner assigned (known from the first
        feedback); empty until then."""
        return self.goal.task_id or next((f.task_id for f in self.feedback if f.task_id), "")


def _wait(future, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not future.done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


class PlannerClient:
    """Spins its own executor thread; all accessors are safe from the caller's thread."""

    def __init__(self, robots: list[str] = (), node_name: str = "timelyllm_client",
                 signal_handlers: bool = True, planner_lost_after_s: float = DEFAULT_LOST_AFTER_S):
        """`signal_handlers=False`: rclpy installs none (when this client initialises it). Its
        own SIGINT handler shuts the context down, which stops this client's executor, so
        nothing sent afterwards (a cancel on Ctrl-C) is ever answered; a caller that handles
        signals itself passes False."""
        self._owns_context = not rclpy.ok()
        if self._owns_context:
            from rclpy.signals import SignalHandlerOptions

            rclpy.init(signal_handler_options=None if signal_handlers else SignalHandlerOptions.NO)
        self.node = Node(node_name)
        self.seen = Observed()
        self._lock = threading.Lock()
        self._goal_pub = self.node.create_publisher(TaskGoal, topics.TASK_GOALS, topics.COMMAND_QOS)
        self.node.create_subscription(TaskStatus, topics.TASK_STATUS, self._on_status, topics.STATUS_QOS)
        self.node.create_subscription(PlannerMetrics, topics.PLANNER_METRICS,
                                      lambda m: self._record(self.seen.metrics, m), topics.METRICS_QOS)
        for robot in robots:
            self.watch_robot(robot)
        self.plan_action = ActionClient(self.node, PlanTask, topics.PLAN_TASK, **topics.action_qos())
        self._update = self.node.create_client(UpdateTask, topics.UPDATE_TASK)
        self._cancel = self.node.create_client(CancelTask, topics.CANCEL_TASK)
        self.lifecycle = LifecycleClient(self.node, "planner")
        # A planner killed with SIGKILL answers nothing: its goals would wait for ever. The
        # same DDS liveliness watch the robots keep (planner_liveness.py) ends them.
        self._runs: list[GoalRun] = []
        # Also called with the reason when the planner vanishes (for goals sent otherwise).
        self.planner_lost_listeners: list = []
        self.planner_watch = PlannerWatch(self.node, planner_lost_after_s, self._planner_lost) \
            if planner_lost_after_s else None
        self._executor = MultiThreadedExecutor(num_threads=2)
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

    def wait_for_action(self, timeout_s: float, alive=lambda: True) -> bool:
        """The planner opens /timelyllm/plan_task when it is activated."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and alive():
            if self.plan_action.server_is_ready():
                return True
            time.sleep(0.1)
        return False

    def plan(self, task_id: str, robot_id: str, instruction: str, *, skill_set: str = "",
             urgency: str = "normal", ert_s: float = 0.0, slope: float = 0.0,
             initial_utility: float = 0.0, on_feedback=None, timeout_s: float = 30.0) -> GoalRun:
        """Send a PlanTask goal and wait until the action layer answers it (planner-side
        refusals come back as a result with state "rejected")."""
        goal = PlanTask.Goal(task_id=task_id, robot_id=robot_id, skill_set=skill_set,
                             instruction=instruction, urgency=urgency,
                             expected_response_time_s=float(ert_s),
                             decline_slope_per_s=float(slope),
                             initial_utility=float(initial_utility))
        run = GoalRun(self, goal, on_feedback)
        with self._lock:
            self._runs = [r for r in self._runs if not r.finished()] + [run]
        if not run.wait_accepted(self.plan_action.send_goal_async(goal, feedback_callback=run._feedback),
                                 timeout_s):
            raise RuntimeError("PlanTask goal was not accepted")
        return run

    def _planner_lost(self, reason: str, accepted_before: float) -> int:
        """PlannerWatch: the planner vanished; every goal still waiting for its result ends.
        (Goals are sent after the watch saw the planner, so all of them are that planner's.)"""
        with self._lock:
            waiting = [r for r in self._runs if not r.finished()]
        reason = reason.replace("; holding position", "")
        for run in waiting:
            run.planner_lost = reason
        for listener in self.planner_lost_listeners:
            listener(reason)
        return len(waiting)

    def update_task(self, task_id: str, *, urgency: str = "", ert_s: float = 0.0,
                    slope: float = 0.0, initial_utility: float = 0.0,
                    timeout_s: float = 15.0) -> UpdateTask.Response:
        return self._call(self._update, UpdateTask.Request(
            task_id=task_id, urgency=urgency, expected_response_time_s=float(ert_s),
            decline_slope_per_s=float(slope), initial_utility=float(initial_utility)), timeout_s)

    def cancel_task(self, task_id: str, reason: str = "", timeout_s: float = 15.0) -> CancelTask.Response:
        return self._call(self._cancel, CancelTask.Request(task_id=task_id, reason=reason), timeout_s)

    def _call(self, client, request, timeout_s: float):
        if not client.wait_for_service(timeout_sec=min(timeout_s, 5.0)):
            raise TimeoutError(f"service {client.srv_name} is not available (is the planner active?)")
        future = client.call_async(request)
        if not _wait(future, timeout_s):
            raise TimeoutError(f"service {client.srv_name}: no answer within {timeout_s:.0f} s")
        return future.result()

    def submit(self, task_id: str, robot_id: str, instruction: str, *, skill_set: str = "drone",
               urgency: str = "normal", ert_s: float = 0.0, slope: float = 0.0,
               initial_utility: float = 0.0) -> None:
        self._goal_pub.publish(TaskGoal(
            task_id=task_id, robot_id=robot_id, skill_set=skill_set, instruction=instruction,
            urgency=urgency, expected_response_time_s=float(ert_s), decline_slope_per_s=float(slope),
            initial_utility=float(initial_utility)))

    def publish_goal(self, goal: TaskGoal) -> None:
        self._goal_pub.publish(goal)

    def latest_metrics(self, keep_history: bool = True):
        """The newest PlannerMetrics sample (None before the first); with `keep_history=False`
        older samples are dropped (a long run needs only the newest)."""
        with self._lock:
            metrics = self.seen.metrics
            if not keep_history:
                del metrics[:-1]
            return metrics[-1] if metrics else None

    def clear_metrics(self) -> None:
        """Forget every metrics sample so far (to wait for a fresh one)."""
        with self._lock:
            self.seen.metrics.clear()

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
