"""One robot's side of the action contract: serves /<robot>/execute_segment, runs segments in
order on a backend, and publishes every finished segment as an ExecutionReport.

A `RobotServer` is hosted on a node: the executor node (ros/executor_node.py) hosts one, the
fleet simulator (ros/fleet_sim_node.py) hundreds in one process. What "executing" means is the
backend's (timelyllm_ros/robots, no ROS there).

Segments of a task are executed strictly by sequence number; a goal arriving early (while the
robot is busy, or ahead of a missing predecessor) waits its turn. Cancelling a goal stops the
segment at once: the backend's stop signal ends its waits and `backend.cancel()` tells the
hardware (a Tello hovers). Every finished or cancelled segment is also published on
/<robot>/execution_reports, the record LRTrace's recorder writes to rosbag2.

A planner that vanishes without cancelling (ros/planner_liveness.py) is treated like a cancel
that says why: `planner_lost` stops the running segment the same way, drops the queued ones,
and ends their goals ABORTED with "planner lost: ...".

Threads: rclpy callbacks only queue work and answer goals; one worker thread per robot runs the
backend (it sleeps on a condition while the robot is idle).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node

from timelyllm_ros.action import ExecuteSegment
from timelyllm_ros.core.skills.interpreter import SegmentOutcome, TaskInterpreter
from timelyllm_ros.msg import ExecutionReport
from timelyllm_ros.robots.backend import InterpretingBackend, SkillBackend, StopSignal
from timelyllm_ros.ros import diagnostics, topics
from timelyllm_ros.ros.conversions import parse_wire_call


@dataclass(eq=False)
class _Job:
    handle: object                   # ServerGoalHandle
    goal: ExecuteSegment.Goal
    result: ExecuteSegment.Result | None = None
    cancelled: bool = False
    running: bool = False
    finished: bool = False
    lost: str = ""                   # why its planner is gone ("planner lost: ..."), if it is
    # When it was accepted (time.monotonic, the clock PlannerWatch uses): which planner it
    # belongs to is told by time (see planner_liveness.py).
    accepted_at: float = field(default_factory=time.monotonic)

    @property
    def label(self) -> str:
        return f"{self.goal.task_id}#{self.goal.sequence}"


class RobotServer:
    """One robot's `execute_segment` action server, report publisher and worker thread, hosted
    on `node` (the executor node hosts one, the fleet simulator hundreds).

    backend: what executing means (robots/); its `stop` must be `signal`, so a cancel or a
    shutdown ends its waits. never_finish: test hook for the planner's dead-robot handling
    (accept segments, never finish them until they are cancelled). log_segments: an info line
    per segment (a fleet of hundreds logs only problems).
    """

    def __init__(self, node: Node, robot_id: str, backend: SkillBackend, signal: StopSignal, *,
                 backend_kind: str = "", never_finish: bool = False, log_segments: bool = True,
                 callback_group=None):
        self.node = node
        self.robot_id = robot_id
        self.backend = backend
        self.backend_kind = backend_kind or type(backend).__name__
        self._signal = signal
        self._never_finish = never_finish
        self._log = node.get_logger()
        self._log_segments = log_segments
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._ready: list[_Job] = []            # in execution order
        self._held: dict[str, dict[int, _Job]] = {}   # task -> early segments by sequence
        # Task -> its plan interpreter (variables live across a task's segments), for a
        # backend that interprets plans. The worker runs them; a cancel only drops an entry
        # (single dict operations), and a cancelled task's later segments never start.
        self.interpreters: "OrderedDict[str, TaskInterpreter]" = OrderedDict()
        self._next_sequence: dict[str, int] = {}
        self._running: _Job | None = None
        self._jobs: dict[bytes, _Job] = {}      # goal id -> job, until its result is sent
        # Tasks whose later segments must never start, recent ones (bounded): task -> (the
        # segments count as cancelled, the message they end with).
        self._ended_tasks: OrderedDict[str, tuple[bool, str]] = OrderedDict()
        self.counts = {"done": 0, "failed": 0, "cancelled": 0}
        self.report_pub = node.create_publisher(
            ExecutionReport, topics.robot_topic(robot_id, topics.EXECUTION_REPORTS),
            topics.COMMAND_QOS)
        self._server = ActionServer(
            node, ExecuteSegment, topics.robot_topic(robot_id, topics.EXECUTE_SEGMENT),
            execute_callback=self._execute, goal_callback=self._on_goal,
            handle_accepted_callback=self._on_accepted, cancel_callback=self._on_cancel,
            callback_group=callback_group or ReentrantCallbackGroup(),
            result_timeout=topics.ACTION_RESULT_TIMEOUT_S, **topics.action_qos())
        self._stopping = False
        self._worker = threading.Thread(target=self._run, name=f"{robot_id}-executor", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------ action callbacks
    def _on_goal(self, goal: ExecuteSegment.Goal) -> GoalResponse:
        if goal.robot_id != self.robot_id:
            self._log.error(f"segment for robot_id {goal.robot_id!r} arrived at {self.robot_id}; refused")
            return GoalResponse.REJECT
        return GoalResponse.REJECT if self._stopping else GoalResponse.ACCEPT

    def _on_accepted(self, handle) -> None:
        job = _Job(handle, handle.request)
        g = job.goal
        with self._lock:
            self._jobs[_key(handle)] = job
            if g.sequence == 0:
                # A task's first segment: a new task, even if an ended one had its id (task ids
                # given by clients may repeat across planner restarts).
                self._ended_tasks.pop(g.task_id, None)
            ended = self._ended_tasks.get(g.task_id)
            expected = self._next_sequence.get(g.task_id, 0)
            held = self._held.setdefault(g.task_id, {}) if ended is None else {}
            if ended is not None:
                # Its task was cancelled or its planner lost here: it would wait forever for
                # the segments before it (dropped), so it ends now.
                job.cancelled, message = ended
                job.lost = "" if job.cancelled else message
                self._finish(job, False, message, None, None)
            elif g.sequence < expected or g.sequence in held:
                self._finish(job, False, f"duplicate segment {job.label}", None, None)
            elif not self._never_finish:
                held[g.sequence] = job
                while expected in held:
                    self._ready.append(held.pop(expected))
                    expected += 1
                self._next_sequence[g.task_id] = expected
                if not held:
                    self._held.pop(g.task_id, None)
                    if any(j.goal.is_last for j in self._ready if j.goal.task_id == g.task_id):
                        self._next_sequence.pop(g.task_id, None)
                self._wake.notify()
        # No handle.execute() here: the goal is executed when its result exists (_finish).

    def _on_cancel(self, handle) -> CancelResponse:
        with self._lock:
            job = self._jobs.get(_key(handle))
            if job is None or job.finished:
                return CancelResponse.REJECT
            job.cancelled = True
            self._end_task(job.goal.task_id, True,
                           "cancelled: an earlier segment of the task was cancelled")
            if job.running:
                # Under the lock: the worker rearms the signal only between segments.
                self._signal.cancel_segment()
                cancel = getattr(self.backend, "cancel", None)
            else:
                cancel = None
                self._drop_task(job.goal.task_id)
                self._finish(job, False, "cancelled before it started", None, None)
        if callable(cancel):
            try:
                cancel()
            except Exception as err:  # noqa: BLE001 - a driver's bug must not kill the node
                self._log.error(f"backend cancel failed: {err}")
        self._log.info(f"cancel requested for {job.label}")
        return CancelResponse.ACCEPT

    def _execute(self, handle) -> ExecuteSegment.Result:
        """The goal's execute callback, run once its result exists (see `_finish`)."""
        with self._lock:
            job = self._jobs.pop(_key(handle))
        result = job.result
        if handle.is_cancel_requested:
            handle.canceled()
        elif result.success:
            handle.succeed()
        else:
            handle.abort()
        return result

    # ------------------------------------------------------------------ the worker
    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._ready and not self._signal.shutting_down:
                    self._wake.wait()  # shutdown() notifies
                if self._signal.shutting_down:
                    return
                job = self._ready.pop(0)
                if job.finished:
                    continue
                ended = self._ended_tasks.get(job.goal.task_id)
                if ended is not None:
                    # Its task was cancelled (or its planner lost) on this robot: later
                    # segments never start.
                    job.cancelled, message = ended
                    job.lost = "" if job.cancelled else message
                    self._finish(job, False, message, None, None)
                    continue
                job.running = True
                self._running = job
                self._signal.rearm()
            started = self.node.get_clock().now()
            if self._log_segments:
                self._log.info(f"executing {job.label}: {job.goal.text!r}")
            feedback = ExecuteSegment.Feedback(
                call_index=0, current_call=job.goal.calls[0] if job.goal.calls else job.goal.text,
                started=started.to_msg())
            try:
                job.handle.publish_feedback(feedback)
            except Exception:  # noqa: BLE001 - the goal may be gone already; execute anyway
                pass
            ok, message, returned, values = self.execute_segment(job)
            finished = self.node.get_clock().now()
            if self._signal.shutting_down:
                return  # no answer from a node that is going away (the planner notices)
            with self._lock:
                self._running = None
                job.running = False
                ran_s = (finished - started).nanoseconds * 1e-9
                if job.cancelled:
                    ok = False
                    message = f"cancelled after {ran_s:.2f} s ({message})"
                elif job.lost:
                    ok = False
                    message = f"{job.lost}; stopped after {ran_s:.2f} s ({message})"
                self._finish(job, ok, message, started, finished, returned, values)
            if not ok and not job.cancelled and not job.lost:  # PlannerWatch logs a loss once
                self._log.warning(f"{self.robot_id}: segment {job.label} {job.goal.text!r} "
                                  f"failed: {message}")

    def execute_segment(self, job: "_Job") -> tuple[bool, str, bool, str]:
        """Execute one segment on the backend: THE place a segment is run. Returns (success,
        message, the plan returned, values as JSON).

        A backend that interprets plans (`InterpretingBackend`: drone-sim, arm-sim, Tello,
        action-bridge) runs the segment's text with the language's semantics through the
        task's own interpreter: loops repeat, conditionals test what skills returned,
        variables carry over to the task's next segment, `->` ends the plan. Any other backend
        runs the flat `calls` list."""
        goal = job.goal
        if not isinstance(self.backend, InterpretingBackend):
            try:
                calls = [parse_wire_call(c) for c in goal.calls]
            except ValueError as err:
                return False, str(err), False, ""
            ok, message = self.backend.execute(calls)
            return ok, message, False, ""
        interp = self.interpreters.get(goal.task_id)
        if interp is None:
            interp = self.interpreters[goal.task_id] = self.backend.interpreter()
            while len(self.interpreters) > 1000:  # tasks that never sent their last segment
                self.interpreters.popitem(last=False)

        def on_call(call) -> None:
            try:
                job.handle.publish_feedback(ExecuteSegment.Feedback(
                    call_index=len(calls_seen), current_call=call.statement,
                    started=self.node.get_clock().now().to_msg()))
            except Exception:  # noqa: BLE001 - the goal may be gone; the robot goes on
                pass
            calls_seen.append(call)

        calls_seen: list = []
        outcome: SegmentOutcome = interp.run_segment(goal.text, cancel_event=self._signal,
                                                     on_call=on_call)
        if goal.is_last or outcome.plan_ended:
            self.interpreters.pop(goal.task_id, None)
        values = {k: _json_value(v) for k, v in outcome.values.items()}
        if outcome.ended_by_return:
            values["returned"] = _json_value(outcome.returned_value)
        message = outcome.message + (" (the plan returned)" if outcome.ended_by_return else "")
        return outcome.success, message, outcome.ended_by_return, json.dumps(values)

    # ------------------------------------------------------------------ helpers (under _lock)
    def _finish(self, job: _Job, ok: bool, message: str, started, finished,
                returned: bool = False, values: str = "") -> None:
        if job.finished:
            return
        job.finished = True
        kind = "cancelled" if job.cancelled else ("done" if ok else "failed")
        self.counts[kind] += 1
        result = ExecuteSegment.Result(success=bool(ok), message=message,
                                       plan_returned=bool(returned), values=values)
        if started is not None:
            result.started, result.finished = started.to_msg(), finished.to_msg()
            # The record for LRTrace and monitors (the planner reads the action's result).
            self.report_pub.publish(ExecutionReport(
                task_id=job.goal.task_id, robot_id=self.robot_id, sequence=job.goal.sequence,
                started=result.started, finished=result.finished, success=bool(ok),
                message=message))
        job.result = result
        if self.node.executor is not None:
            # Executed only now, with the result ready: an execute callback that awaited the
            # result would be a coroutine, and rclpy resumes every pending coroutine on every
            # executor iteration, which starves a node serving hundreds of robots.
            # (On an executor thread: rclpy's goal handles are driven from there.)
            self.node.executor.create_task(job.handle.execute)

    def _end_task(self, task_id: str, cancelled: bool, message: str) -> None:
        self._ended_tasks[task_id] = (cancelled, message)
        while len(self._ended_tasks) > 1000:
            self._ended_tasks.popitem(last=False)

    def _drop_task(self, task_id: str) -> None:
        self._held.pop(task_id, None)
        self.interpreters.pop(task_id, None)
        self._next_sequence.pop(task_id, None)

    # ------------------------------------------------------------------ planner lost
    def planner_lost(self, reason: str, accepted_before: float) -> int:
        """The planner of the goals accepted before `accepted_before` (time.monotonic) is gone
        (PlannerWatch): stop its running segment as a cancel does (the backend's stop signal,
        then `backend.cancel()`: the robot holds position), drop its queued ones, and end
        each goal ABORTED with `reason`; the stopped segment's ExecutionReport says it too.
        Later segments of those tasks end at once. Returns how many goals it ended or is
        stopping. Any thread."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if not j.finished and not j.cancelled
                    and not j.lost and j.accepted_at < accepted_before]
            stop_running = False
            for job in jobs:
                job.lost = reason
                self._end_task(job.goal.task_id, False, reason)
                if job.running:
                    # Under the lock: the worker rearms the signal only between segments.
                    self._signal.cancel_segment()
                    stop_running = True
                else:
                    self._drop_task(job.goal.task_id)
                    self._finish(job, False, f"{reason} (before it started)", None, None)
        cancel = getattr(self.backend, "cancel", None) if stop_running else None
        if callable(cancel):
            try:
                cancel()
            except Exception as err:  # noqa: BLE001 - a driver's bug must not kill the node
                self._log.error(f"backend cancel failed: {err}")
        return len(jobs)

    def diagnose(self):
        with self._lock:
            running = self._running.label if self._running else ""
            queued = len(self._ready) + sum(len(h) for h in self._held.values())
        connected = getattr(self.backend, "connected", None)
        values = {"backend": self.backend_kind, "segment_running": running or "none",
                  "segments_queued": queued, **{f"segments_{k}": v for k, v in self.counts.items()}}
        if connected is not None:
            values["backend_connected"] = bool(connected)
        level = diagnostics.OK
        message = f"executing {running}" if running else "idle"
        if connected is False and self.backend_kind == "tello":
            # Connected on the first segment; before that, not a fault.
            message += "; backend not connected"
        return level, message, values

    @property
    def busy(self) -> bool:
        """A segment is running or waiting on this robot."""
        with self._lock:
            return self._running is not None or bool(self._ready) or bool(self._held)

    def begin_shutdown(self) -> None:
        """Refuse new segments, stop the running one (the hardware too) and wake the worker.
        Cheap and non-blocking, so a fleet can stop every robot before waiting for any."""
        self._stopping = True
        with self._lock:
            self._signal.set()
            self._wake.notify_all()
            running = self._running is not None
        cancel = getattr(self.backend, "cancel", None)
        if running and callable(cancel):
            try:
                cancel()
            except Exception:  # noqa: BLE001 - a driver's bug must not block the shutdown
                pass

    def finish_shutdown(self, timeout_s: float = 0.5) -> None:
        """Wait up to `timeout_s` for the worker, then release the backend's resources."""
        self._worker.join(timeout=max(0.0, timeout_s))
        close = getattr(self.backend, "close", None)
        if callable(close):
            close()

    def shutdown(self) -> None:
        self.begin_shutdown()
        self.finish_shutdown()


def _key(handle) -> bytes:
    return bytes(handle.goal_id.uuid)


def _json_value(value):
    """A skill's value as JSON: booleans, numbers, strings and null as they are; anything else
    (MiniSpec's "unknown" from a vision skill without a source) as its text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
