"""The planner's side of the robots: one `ExecuteSegment` action client per robot.

- `dispatch` (engine thread) sends a segment as a goal; its result comes back to the scheduler
  as the segment's report (start, finish, success), which feeds the execution-time model and
  the resume priority exactly as ExecutionReport messages did.
- `end_task` (when a task is cancelled, fails or is declared dead) cancels the robot's goals for
  it, running or queued on the robot; `end_all` does it for every task (the planner stops), and
  `cancels_pending` says how many of those cancels the robots have not answered yet.
- A robot whose action server disappears while it holds a segment fails that task with the
  reason (checked every CHECK_PERIOD_S; MISSES_TO_FAIL checks in a row).

All goal handles are touched on executor threads only; the engine thread hands work over with
`executor.create_task`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable

from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient

from timelyllm_ros.action import ExecuteSegment
from timelyllm_ros.core.sched.interface import SegmentDispatch
from timelyllm_ros.ros import topics
from timelyllm_ros.ros.action_client import SpinSafeActionClient
from timelyllm_ros.ros.conversions import s_to_time, time_to_s

CHECK_PERIOD_S = 0.5
MISSES_TO_FAIL = 2
SERVER_WAIT_S = 10.0
ENDED_KEPT = 10_000

# report(task_id, sequence, started_ros_s | None, finished_ros_s | None, success, message,
#        returned, values): `returned` when the robot says the segment ended the plan (MiniSpec
#        `->`); `values` the JSON of what its skills returned (ExecuteSegment.Result.values).
Report = Callable[[str, int, "float | None", "float | None", bool, str, bool, str], None]


class RobotLink:
    def __init__(self, node, group, report: Report, to_ros_s: Callable[[float], float]):
        self._node = node
        self._group = group
        self._report = report
        self._to_ros_s = to_ros_s
        self._lock = threading.Lock()
        self._clients: dict[str, ActionClient] = {}
        # task -> {sequence: goal handle, or None while the goal is being sent}
        self._goals: dict[str, dict[int, object]] = {}
        self._robot_of: dict[str, str] = {}
        self._ended: OrderedDict[str, float] = OrderedDict()   # task -> when it ended
        self._misses: dict[str, int] = {}
        # Cancels scheduled or sent and not yet answered by the robot (the planner waits for
        # them before it exits, so that no robot goes on with a plan nobody serves).
        self._cancels_pending = 0
        # (task, sequence) -> monotonic time the planner asked the robot to cancel (latency).
        # (Recent ones only: a planner runs for days.)
        self.cancel_requested_at: OrderedDict[tuple[str, int], float] = OrderedDict()
        self._timer = node.create_timer(CHECK_PERIOD_S, self._check_servers, callback_group=group)

    def client(self, robot_id: str) -> ActionClient:
        with self._lock:
            c = self._clients.get(robot_id)
            if c is None:
                # Created on an executor thread while others spin: see action_client.py.
                c = self._clients[robot_id] = SpinSafeActionClient(
                    self._node, ExecuteSegment, topics.robot_topic(robot_id, topics.EXECUTE_SEGMENT),
                    callback_group=self._group, **topics.action_qos())
            return c

    def ended(self, task_id: str) -> bool:
        with self._lock:
            return task_id in self._ended

    def outstanding(self) -> int:
        with self._lock:
            return sum(len(g) for g in self._goals.values())

    def cancels_pending(self) -> int:
        with self._lock:
            return self._cancels_pending

    def forget_ended(self) -> None:
        """A new scheduler (the planner configured again): ended task ids may come back as new
        tasks, whose segments must not be cancelled on sight. Goals still outstanding keep
        their entries; their late results are reported and ignored as unknown."""
        with self._lock:
            self._ended.clear()

    def end_all(self) -> None:
        """Cancel every robot goal of every task (the planner stops serving)."""
        with self._lock:
            tasks = list(self._goals)
        for task_id in tasks:
            self.end_task(task_id)

    # ------------------------------------------------------------------ engine thread
    def dispatch(self, d: SegmentDispatch) -> None:
        with self._lock:
            self._goals.setdefault(d.task_id, {})[d.sequence] = None
            self._robot_of[d.task_id] = d.robot_id
        goal = ExecuteSegment.Goal(
            task_id=d.task_id, robot_id=d.robot_id, sequence=d.sequence, text=d.text,
            calls=[c.to_wire() for c in d.calls], is_last=d.is_last,
            estimated_execution_s=float(d.estimated_execution_s),
            stamp=s_to_time(self._to_ros_s(d.dispatched_s)))
        self._node.executor.create_task(self._send, d.robot_id, goal)

    def end_task(self, task_id: str) -> None:
        """The task is over (any terminal state): cancel what its robot still holds."""
        with self._lock:
            if task_id in self._ended:
                return
            self._ended[task_id] = time.monotonic()
            while len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)
            pending = self._goals.get(task_id)
            if not pending:
                return
            self._cancels_pending += 1
        self._node.executor.create_task(self._cancel_task, task_id)

    # ------------------------------------------------------------------ executor threads
    # Callbacks, not coroutines: rclpy resumes every pending coroutine on every executor
    # iteration, so one awaiting each robot's result would starve the planner of a fleet.
    def _send(self, robot_id: str, goal: ExecuteSegment.Goal) -> None:
        key = (goal.task_id, goal.sequence)
        client = self.client(robot_id)
        deadline = time.monotonic() + SERVER_WAIT_S
        while not client.server_is_ready() and time.monotonic() < deadline:
            time.sleep(0.05)  # only before a robot's first segment (discovery)
        if not client.server_is_ready():
            self._drop(*key)
            self._report(*key, None, None, False, f"no ExecuteSegment action server at "
                         f"{topics.robot_topic(robot_id, topics.EXECUTE_SEGMENT)}")
            return
        client.send_goal_async(goal).add_done_callback(
            lambda future: self._on_goal_response(goal, future.result()))

    def _on_goal_response(self, goal: ExecuteSegment.Goal, handle) -> None:
        key = (goal.task_id, goal.sequence)
        if not handle.accepted:
            self._drop(*key)
            self._report(*key, None, None, False, "the robot refused the segment")
            return
        with self._lock:
            ended = goal.task_id in self._ended
            pending = self._goals.get(goal.task_id)
            if pending is not None and goal.sequence in pending:  # (not given up on meanwhile)
                pending[goal.sequence] = handle
        if ended:
            self._note_cancel(key)
            handle.cancel_goal_async()
        handle.get_result_async().add_done_callback(
            lambda future: self._on_result(goal, future.result()))

    def _on_result(self, goal: ExecuteSegment.Goal, response) -> None:
        key = (goal.task_id, goal.sequence)
        if not self._drop(*key):
            return  # given up on (server vanished): already reported
        result = response.result
        if response.status == GoalStatus.STATUS_CANCELED and self.ended(goal.task_id):
            return  # the planner cancelled it; the task is over already
        started = time_to_s(result.started) or None
        finished = time_to_s(result.finished) or None
        self._report(*key, started, finished, bool(result.success) and
                     response.status == GoalStatus.STATUS_SUCCEEDED, result.message,
                     bool(result.plan_returned), result.values)

    def _cancel_task(self, task_id: str) -> None:
        with self._lock:
            handles = [(seq, h) for seq, h in self._goals.get(task_id, {}).items() if h is not None]
            self._cancels_pending += len(handles) - 1   # this task's turn is over
        for seq, handle in handles:
            self._note_cancel((task_id, seq))
            handle.cancel_goal_async().add_done_callback(self._cancel_answered)

    def _cancel_answered(self, _future) -> None:
        with self._lock:
            self._cancels_pending -= 1

    def _note_cancel(self, key: tuple[str, int]) -> None:
        self.cancel_requested_at[key] = time.monotonic()
        while len(self.cancel_requested_at) > ENDED_KEPT:
            self.cancel_requested_at.popitem(last=False)

    def _drop(self, task_id: str, sequence: int) -> bool:
        with self._lock:
            goals = self._goals.get(task_id)
            if goals is None or sequence not in goals:
                return False
            del goals[sequence]
            if not goals:
                del self._goals[task_id]
                self._robot_of.pop(task_id, None)
            return True

    def _check_servers(self) -> None:
        with self._lock:
            robots = {self._robot_of[t] for t in self._goals if t in self._robot_of}
        for robot_id in robots:
            if self.client(robot_id).server_is_ready():
                self._misses.pop(robot_id, None)
                continue
            misses = self._misses[robot_id] = self._misses.get(robot_id, 0) + 1
            if misses < MISSES_TO_FAIL:
                continue
            self._misses.pop(robot_id, None)
            # Every goal of that robot, also those whose send was never answered (handle None:
            # a goal sent as the server died never gets its response, and would stay
            # outstanding for ever).
            with self._lock:
                lost = [(t, seq) for t, goals in self._goals.items()
                        if self._robot_of.get(t) == robot_id for seq in goals]
            for task_id, seq in lost:
                if self._drop(task_id, seq):
                    self._report(task_id, seq, None, None, False,
                                 f"action server {topics.robot_topic(robot_id, topics.EXECUTE_SEGMENT)} "
                                 "vanished mid-segment")
