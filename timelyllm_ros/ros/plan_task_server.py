"""The planner's request side: the PlanTask action and the UpdateTask / CancelTask services.

A PlanTask goal is always accepted by the action layer, then checked: a malformed goal (or one
sent while the planner is not active) ends at once, ABORTED, with result.state "rejected" and
the reason naming the field, so the client learns why (an action's plain rejection carries no
reason). A valid goal becomes a task in the scheduler; its status changes come back as feedback
and its terminal status as the result.

Threads: `_execute` and the callbacks run on executor threads; the task routes (task id ->
Watch) are read and written only on the engine thread, where submissions, status changes and
segments happen in order, so a duplicate id can never steal another goal's statuses.
"""

from __future__ import annotations

import math
import threading
import uuid

from rclpy.action import ActionServer, CancelResponse, GoalResponse

from timelyllm_ros.action import PlanTask
from timelyllm_ros.core.sched.interface import SegmentDispatch, TaskRejected
from timelyllm_ros.core.sched.task_control import UpdateError, tuf_from_fields, update_tuf
from timelyllm_ros.core.task import TaskSnapshot, TaskSpec
from timelyllm_ros.core.validation import GoalError, GoalFields
from timelyllm_ros.ros import topics
from timelyllm_ros.ros.conversions import s_to_time
from timelyllm_ros.ros.engine_loop import Refused
from timelyllm_ros.srv import CancelTask, UpdateTask

NAN = math.nan


class Watch:
    """One PlanTask goal's link to its task."""

    def __init__(self, task_id: str, handle, executor):
        self.task_id = task_id
        self.handle = handle
        self._executor = executor
        self.result: PlanTask.Result | None = None
        self.finished = False
        # finish() comes from the engine thread, or from the node when it stops serving.
        self._finish_lock = threading.Lock()
        self.state = "queued"
        self.segments = 0
        self.completed = 0
        self.last_text = ""
        self.estimated_finish_s = 0.0

    def feedback(self) -> None:
        fb = PlanTask.Feedback(task_id=self.task_id, state=self.state,
                               segments_dispatched=self.segments,
                               segments_completed=self.completed, last_segment_text=self.last_text)
        if self.estimated_finish_s > 0:
            fb.estimated_finish = s_to_time(self.estimated_finish_s)
        try:
            self.handle.publish_feedback(fb)
        except Exception:  # noqa: BLE001 - the goal may have ended meanwhile
            pass

    def finish(self, result: PlanTask.Result) -> None:
        with self._finish_lock:
            if self.finished:
                return
            self.finished = True
            self.result = result
        # The goal is executed only now, with its result ready, on an executor thread: an
        # execute callback awaiting the result would be a coroutine, and rclpy resumes every
        # pending coroutine on every executor iteration (hundreds of tasks starve the node).
        self._executor.create_task(self.handle.execute)


def result_of(snapshot: TaskSnapshot) -> PlanTask.Result:
    resumes = snapshot.resumes
    return PlanTask.Result(
        task_id=snapshot.task_id, state=snapshot.state, reason=snapshot.reason,
        response_time_s=float(snapshot.response_time_s), utility=float(snapshot.utility),
        waiting_time_s=float(snapshot.waiting_time_s), segments=snapshot.segments_dispatched,
        resumes=resumes,
        mean_cached_tokens_per_resume=snapshot.cached_tokens_total / resumes if resumes else 0.0,
        mean_recomputed_tokens_per_resume=(snapshot.recomputed_tokens_total / resumes
                                           if resumes else 0.0))


def rejected(task_id: str, reason: str) -> PlanTask.Result:
    return PlanTask.Result(task_id=task_id, state="rejected", reason=reason, response_time_s=NAN,
                           utility=NAN, waiting_time_s=NAN)


def goal_fields(goal: PlanTask.Goal, task_id: str) -> GoalFields:
    return GoalFields(task_id=task_id, robot_id=goal.robot_id, skill_set=goal.skill_set,
                      instruction=goal.instruction, urgency=goal.urgency,
                      expected_response_time_s=goal.expected_response_time_s,
                      decline_slope_per_s=goal.decline_slope_per_s,
                      initial_utility=goal.initial_utility)


class PlanTaskServer:
    """Serves PlanTask, UpdateTask and CancelTask for `node` (a PlannerNode)."""

    def __init__(self, node, group):
        self._node = node
        self._lock = threading.Lock()
        self._by_goal: dict[bytes, Watch] = {}
        self._routes: dict[str, Watch] = {}   # engine thread only
        self.server = ActionServer(
            node, PlanTask, topics.PLAN_TASK, execute_callback=self._execute,
            handle_accepted_callback=self._on_accepted,
            goal_callback=lambda _goal: GoalResponse.ACCEPT, cancel_callback=self._on_cancel,
            callback_group=group, result_timeout=topics.ACTION_RESULT_TIMEOUT_S,
            **topics.action_qos())
        self.update_srv = node.create_service(UpdateTask, topics.UPDATE_TASK, self._on_update,
                                              callback_group=group)
        self.cancel_srv = node.create_service(CancelTask, topics.CANCEL_TASK, self._on_cancel_task,
                                              callback_group=group)

    def destroy(self) -> None:
        self.server.destroy()
        self._node.destroy_service(self.update_srv)
        self._node.destroy_service(self.cancel_srv)

    def goals_in_flight(self) -> int:
        with self._lock:
            return len(self._by_goal)

    def end_all(self, reason: str) -> int:
        """The planner stops serving: every goal without a result yet gets one now (state
        cancelled, `reason`; ABORTED unless its client asked to cancel). Returns how many."""
        with self._lock:
            open_watches = [w for w in self._by_goal.values() if not w.finished]
        for watch in open_watches:
            watch.finish(PlanTask.Result(task_id=watch.task_id, state="cancelled", reason=reason,
                                         response_time_s=NAN, utility=NAN, waiting_time_s=NAN,
                                         segments=watch.segments))
        return len(open_watches)

    # ------------------------------------------------------------------ action (executor threads)
    def _on_accepted(self, handle) -> None:
        """A goal the action layer took: admit it (the goal is executed when it ends)."""
        goal = handle.request
        task_id = goal.task_id or f"{goal.robot_id or 'task'}-{uuid.uuid4().hex[:8]}"
        watch = Watch(task_id, handle, self._node.executor)
        with self._lock:
            self._by_goal[bytes(handle.goal_id.uuid)] = watch
        reason = self._node.admit(goal_fields(goal, task_id), watch)
        if reason is not None:
            watch.finish(rejected(task_id, reason))

    def _execute(self, handle) -> PlanTask.Result:
        """The execute callback, run once the goal's result exists (Watch.finish)."""
        with self._lock:
            watch = self._by_goal.pop(bytes(handle.goal_id.uuid))
        result = watch.result
        if result.state == "done":
            handle.succeed()
        elif result.state == "cancelled" and handle.is_cancel_requested:
            handle.canceled()
        else:
            handle.abort()
        return result

    def _on_cancel(self, handle) -> CancelResponse:
        with self._lock:
            watch = self._by_goal.get(bytes(handle.goal_id.uuid))
        loop = self._node.loop
        if watch is None or watch.finished or loop is None or not loop.alive:
            return CancelResponse.REJECT
        task_id = watch.task_id
        # The robot is stopped right away, without waiting for the engine thread's current step;
        # the engine request, KV blocks and queue entry go when the engine thread gets to it.
        self._node.stop_robot(task_id)
        loop.post(lambda s: s.cancel(task_id, "cancelled by the client"))
        return CancelResponse.ACCEPT

    # ------------------------------------------------------------------ engine thread
    def submit(self, scheduler, spec: TaskSpec, watch: Watch | None) -> None:
        if spec.task_id in scheduler.tasks or spec.task_id in self._routes:
            # Answered here, not by the scheduler: its rejection would carry the original's id
            # into the original's route. The original is untouched either way.
            reason = "task_id: duplicate of a known task"
            self._node.get_logger().warning(f"rejected goal {spec.task_id!r}: {reason}")
            self._node.publish_rejection(spec.task_id, spec.robot_id, reason)
            if watch is not None:
                watch.finish(rejected(spec.task_id, reason))
            return
        if watch is not None:
            self._routes[spec.task_id] = watch
        try:
            scheduler.submit(spec)
        except TaskRejected as err:  # the rejected status has reached the watch already
            self._node.get_logger().warning(f"rejected goal {spec.task_id!r}: {err}")
        if watch is not None and not watch.finished and spec.task_id not in scheduler.tasks:
            watch.finish(rejected(spec.task_id, "rejected by the scheduler"))

    def on_segment(self, d: SegmentDispatch, finish_ros_s: float) -> None:
        watch = self._routes.get(d.task_id)
        if watch is not None:
            watch.segments = d.sequence + 1
            watch.last_text = d.text
            watch.estimated_finish_s = finish_ros_s
            watch.feedback()

    def on_status(self, snapshot: TaskSnapshot) -> None:
        watch = self._routes.get(snapshot.task_id)
        if watch is None:
            return
        if snapshot.is_terminal:
            del self._routes[snapshot.task_id]
            watch.finish(result_of(snapshot))
            return
        watch.state, watch.completed = snapshot.state, snapshot.segments_completed
        watch.feedback()

    # ------------------------------------------------------------------ services
    def _on_update(self, req: UpdateTask.Request, resp: UpdateTask.Response) -> UpdateTask.Response:
        loop = self._node.loop
        try:
            tuf = tuf_from_fields(self._node.settings.levels, req.urgency,
                                  req.expected_response_time_s, req.decline_slope_per_s,
                                  req.initial_utility)
        except (GoalError, AttributeError) as err:
            tuf, reason = None, str(err)

        def run(scheduler):
            if tuf is not None:
                return update_tuf(scheduler, req.task_id, tuf, req.urgency)  # publishes the status
            task = scheduler.tasks.get(req.task_id)
            return task.spec if task is not None else None

        try:
            if loop is None:
                raise Refused("planner is not configured")
            spec = loop.call(run)
            resp.success, resp.reason = tuf is not None, "" if tuf is not None else reason
        except (UpdateError, Refused, TimeoutError) as err:
            spec, resp.success, resp.reason = None, False, str(err)
        if spec is not None:
            resp.urgency = spec.urgency
            resp.expected_response_time_s = spec.tuf.ert_s
            resp.decline_slope_per_s = spec.tuf.slope_per_s
            resp.initial_utility = spec.tuf.initial_utility
        return resp

    def _on_cancel_task(self, req: CancelTask.Request, resp: CancelTask.Response) -> CancelTask.Response:
        task_id = req.task_id

        def run(scheduler):
            task = scheduler.tasks.get(task_id)
            if task is None:
                return False, f"task_id: unknown task {task_id!r}", ""
            if task.lifecycle.is_terminal:
                return False, f"task_id: task {task_id!r} already ended ({task.state})", task.state
            scheduler.cancel(task_id, req.reason or "cancelled by request")
            return True, "", task.state

        loop = self._node.loop
        try:
            if loop is None:
                raise Refused("planner is not configured")
            resp.success, resp.reason, resp.state = loop.call(run)
        except (Refused, TimeoutError) as err:
            resp.success, resp.reason = False, str(err)
        return resp
