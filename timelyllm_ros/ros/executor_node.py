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

Interface: the `ExecuteSegment` action (the planner is the client). Segments of a task are
executed strictly by sequence number; a goal arriving early (while the robot is busy, or ahead of
a missing predecessor) waits its turn. Cancelling a goal stops the segment at once: the backend's
stop signal ends its waits and `backend.cancel()` tells the hardware (a Tello hovers). Every
finished or cancelled segment is also published as an `ExecutionReport` on
/<robot>/execution_reports, the record LRTrace's recorder writes to rosbag2.

Threads: rclpy callbacks only queue work and answer goals; one worker thread runs the backend.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import rclpy
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node
from rclpy.task import Future

from timelyllm_ros.action import ExecuteSegment
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.msg import ExecutionReport
from timelyllm_ros.core.skills.interpreter import SegmentOutcome, TaskInterpreter
from timelyllm_ros.robots.backend import InterpretingBackend, SkillBackend, StopSignal
from timelyllm_ros.robots.factory import make_backend
from timelyllm_ros.robots.tello.sdk import DEFAULT_HOST as DEFAULT_TELLO_HOST
from timelyllm_ros.robots.tello.sdk import DEFAULT_PORT as DEFAULT_TELLO_PORT
from timelyllm_ros.robots.tello.sdk import DEFAULT_STATE_PORT as DEFAULT_TELLO_STATE_PORT
from timelyllm_ros.ros import diagnostics, share, topics
from timelyllm_ros.ros.conversions import parse_wire_call
from timelyllm_ros.ros.runtime import spin_until_shutdown


@dataclass(eq=False)
class _Job:
    handle: object                   # ServerGoalHandle
    goal: ExecuteSegment.Goal
    done: Future = field(default_factory=Future)
    cancelled: bool = False
    running: bool = False
    finished: bool = False

    @property
    def label(self) -> str:
        return f"{self.goal.task_id}#{self.goal.sequence}"


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
        self._never_finish = bool(self.declare_parameter("never_report", False).value)
        if not time_scale > 0:
            raise ValueError(f"parameter time_scale: must be > 0, got {time_scale}")
        model = ExecutionTimeModel.from_yaml(
            Path(exec_model) if exec_model else share.config_dir() / "exec_model.yaml")
        self._signal = StopSignal()
        self.backend_kind = str(self.declare_parameter("backend", "sim").value).strip().lower()
        tello = {
            "host": str(self.declare_parameter("tello_host", DEFAULT_TELLO_HOST).value),
            "port": int(self.declare_parameter("tello_port", DEFAULT_TELLO_PORT).value),
            "state_port": int(self.declare_parameter("tello_state_port", DEFAULT_TELLO_STATE_PORT).value),
            "local_port": int(self.declare_parameter("tello_local_port", 0).value),
        }
        if backend is None:
            params = {"model": model, "time_scale": time_scale, "seed": seed, "stop": self._signal}
            if self.backend_kind == "tello":
                params.update(tello)
            elif self.backend_kind == "replay":  # robots/replay.py: recorded durations
                params.update(replay_table=str(self.declare_parameter("replay_table", "").value),
                              robot_id=self.robot_id)
            elif self.backend_kind == "drone-sim":  # robots/drone_sim.py: a drone in a scene
                scene = str(self.declare_parameter("scene", "").value)
                params.update(scene=scene or None)
            elif self.backend_kind == "action-bridge":  # robots/action_bridge.py: a skill map
                params.update(skill_map=str(self.declare_parameter("skill_map", "").value))
            backend = make_backend(self.backend_kind, **params)
        else:
            self.backend_kind = type(backend).__name__
        self._backend = backend
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._ready: list[_Job] = []            # in execution order
        self._held: dict[str, dict[int, _Job]] = {}   # task -> early segments by sequence
        # Task -> its plan interpreter (variables live across a task's segments), for a
        # backend that interprets plans. The worker runs them; a cancel only drops an entry
        # (single dict operations), and a cancelled task's later segments never start.
        self._interpreters: "OrderedDict[str, TaskInterpreter]" = OrderedDict()
        self._next_sequence: dict[str, int] = {}
        self._running: _Job | None = None
        self._jobs: dict[bytes, _Job] = {}      # goal id -> job, until its result is sent
        self._cancelled_tasks: OrderedDict[str, None] = OrderedDict()   # recent, bounded
        self.counts = {"done": 0, "failed": 0, "cancelled": 0}
        group = ReentrantCallbackGroup()
        self._report_pub = self.create_publisher(
            ExecutionReport, topics.robot_topic(self.robot_id, topics.EXECUTION_REPORTS),
            topics.COMMAND_QOS)
        self._server = ActionServer(
            self, ExecuteSegment, topics.robot_topic(self.robot_id, topics.EXECUTE_SEGMENT),
            execute_callback=self._execute, goal_callback=self._on_goal,
            handle_accepted_callback=self._on_accepted, cancel_callback=self._on_cancel,
            callback_group=group, result_timeout=topics.ACTION_RESULT_TIMEOUT_S,
            **topics.action_qos())
        self._diag = diagnostics.Publisher(self, f"executor {self.robot_id}", self.robot_id,
                                           self._diagnose)
        self._stopping = False
        self._worker = threading.Thread(target=self._run, name=f"{self.robot_id}-executor", daemon=True)
        self._worker.start()
        self.get_logger().info(
            f"executor for {self.robot_id} ready (backend {self.backend_kind}, time_scale {time_scale})")

    # ------------------------------------------------------------------ action callbacks
    def _on_goal(self, goal: ExecuteSegment.Goal) -> GoalResponse:
        if goal.robot_id != self.robot_id:
            self.get_logger().error(f"segment for robot_id {goal.robot_id!r} arrived at {self.robot_id}; refused")
            return GoalResponse.REJECT
        return GoalResponse.REJECT if self._stopping else GoalResponse.ACCEPT

    def _on_accepted(self, handle) -> None:
        job = _Job(handle, handle.request)
        g = job.goal
        with self._lock:
            self._jobs[_key(handle)] = job
            expected = self._next_sequence.get(g.task_id, 0)
            held = self._held.setdefault(g.task_id, {})
            if g.sequence < expected or g.sequence in held:
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
        handle.execute()

    def _on_cancel(self, handle) -> CancelResponse:
        with self._lock:
            job = self._jobs.get(_key(handle))
            if job is None or job.finished:
                return CancelResponse.REJECT
            job.cancelled = True
            self._cancelled_tasks[job.goal.task_id] = None
            while len(self._cancelled_tasks) > 1000:
                self._cancelled_tasks.popitem(last=False)
            if job.running:
                # Under the lock: the worker rearms the signal only between segments.
                self._signal.cancel_segment()
                cancel = getattr(self._backend, "cancel", None)
            else:
                cancel = None
                self._drop_task(job.goal.task_id)
                self._finish(job, False, "cancelled before it started", None, None)
        if callable(cancel):
            try:
                cancel()
            except Exception as err:  # noqa: BLE001 - a driver's bug must not kill the node
                self.get_logger().error(f"backend cancel failed: {err}")
        self.get_logger().info(f"cancel requested for {job.label}")
        return CancelResponse.ACCEPT

    async def _execute(self, handle) -> ExecuteSegment.Result:
        with self._lock:
            job = self._jobs[_key(handle)]
        try:
            result = await job.done
        finally:
            with self._lock:
                self._jobs.pop(_key(handle), None)
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
                    self._wake.wait(0.5)
                if self._signal.shutting_down:
                    return
                job = self._ready.pop(0)
                if job.finished:
                    continue
                if job.goal.task_id in self._cancelled_tasks:
                    # Its task was cancelled on this robot: later segments never start.
                    job.cancelled = True
                    self._finish(job, False, "cancelled: an earlier segment of the task was "
                                 "cancelled", None, None)
                    continue
                job.running = True
                self._running = job
                self._signal.rearm()
            started = self.get_clock().now()
            self.get_logger().info(f"executing {job.label}: {job.goal.text!r}")
            feedback = ExecuteSegment.Feedback(
                call_index=0, current_call=job.goal.calls[0] if job.goal.calls else job.goal.text,
                started=started.to_msg())
            try:
                job.handle.publish_feedback(feedback)
            except Exception:  # noqa: BLE001 - the goal may be gone already; execute anyway
                pass
            ok, message, returned, values = self.execute_segment(job)
            finished = self.get_clock().now()
            if self._signal.shutting_down:
                return  # no answer from a node that is going away (the planner notices)
            with self._lock:
                self._running = None
                job.running = False
                if job.cancelled:
                    ok = False
                    message = f"cancelled after {(finished - started).nanoseconds * 1e-9:.2f} s ({message})"
                self._finish(job, ok, message, started, finished, returned, values)

    def execute_segment(self, job: "_Job") -> tuple[bool, str, bool, str]:
        """Execute one segment on the backend: THE place a segment is run. Returns (success,
        message, the plan returned, values as JSON).

        A backend that interprets plans (`InterpretingBackend`: drone-sim, arm-sim, Tello,
        action-bridge) runs the segment's text with the language's semantics through the
        task's own interpreter: loops repeat, conditionals test what skills returned,
        variables carry over to the task's next segment, `->` ends the plan. Any other backend
        runs the flat `calls` list."""
        goal = job.goal
        if not isinstance(self._backend, InterpretingBackend):
            try:
                calls = [parse_wire_call(c) for c in goal.calls]
            except ValueError as err:
                return False, str(err), False, ""
            ok, message = self._backend.execute(calls)
            return ok, message, False, ""
        interp = self._interpreters.get(goal.task_id)
        if interp is None:
            interp = self._interpreters[goal.task_id] = self._backend.interpreter()
            while len(self._interpreters) > 1000:  # tasks that never sent their last segment
                self._interpreters.popitem(last=False)

        def on_call(call) -> None:
            try:
                job.handle.publish_feedback(ExecuteSegment.Feedback(
                    call_index=len(calls_seen), current_call=call.statement,
                    started=self.get_clock().now().to_msg()))
            except Exception:  # noqa: BLE001 - the goal may be gone; the robot goes on
                pass
            calls_seen.append(call)

        calls_seen: list = []
        outcome: SegmentOutcome = interp.run_segment(goal.text, cancel_event=self._signal,
                                                     on_call=on_call)
        if goal.is_last or outcome.plan_ended:
            self._interpreters.pop(goal.task_id, None)
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
            self._report_pub.publish(ExecutionReport(
                task_id=job.goal.task_id, robot_id=self.robot_id, sequence=job.goal.sequence,
                started=result.started, finished=result.finished, success=bool(ok),
                message=message))
        executor = self.executor
        if executor is not None:
            # Completed on an executor thread, which wakes the awaiting _execute coroutine.
            executor.create_task(job.done.set_result, result)
        else:
            job.done.set_result(result)

    def _drop_task(self, task_id: str) -> None:
        self._held.pop(task_id, None)
        self._interpreters.pop(task_id, None)
        self._next_sequence.pop(task_id, None)

    def _diagnose(self):
        with self._lock:
            running = self._running.label if self._running else ""
            queued = len(self._ready) + sum(len(h) for h in self._held.values())
        connected = getattr(self._backend, "connected", None)
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

    def shutdown(self) -> None:
        self._stopping = True
        with self._lock:
            self._signal.set()
            self._wake.notify_all()
        cancel = getattr(self._backend, "cancel", None)
        if self._running is not None and callable(cancel):
            try:
                cancel()
            except Exception:  # noqa: BLE001
                pass
        self._worker.join(timeout=0.5)
        close = getattr(self._backend, "close", None)
        if callable(close):
            close()


def _key(handle) -> bytes:
    return bytes(handle.goal_id.uuid)


def main(argv: list[str] | None = None) -> int:
    share.use_installed_config()
    rclpy.init(args=argv if argv is not None else sys.argv)
    try:
        node = ExecutorNode()
    except ValueError as err:
        print(f"executor: {err}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    spin_until_shutdown(node, cleanup=node.shutdown, threads=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _json_value(value):
    """A skill's value as JSON: booleans, numbers, strings and null as they are; anything else
    (MiniSpec's "unknown" from a vision skill without a source) as its text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
