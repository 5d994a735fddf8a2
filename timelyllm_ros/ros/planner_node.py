"""The planner: a managed lifecycle node serving plans to a fleet of robots.

Lifecycle (drive it with `ros2 lifecycle set /planner configure` etc.; `timelyllm launch` and
the demo drive it to active):
- configure: read the parameters, build the engine and warm its prefix cache (engine thread);
- activate: open the PlanTask action, the UpdateTask / CancelTask services (first activation)
  and the TaskGoal subscription; admit goals;
- deactivate: stop admitting (no TaskGoal subscription; PlanTask goals end "rejected" with the
  reason); tasks already admitted run to the end, the engine is kept;
- cleanup: cancel what is still running and release the engine;
- shutdown (also SIGINT / SIGTERM of the process): every task ends ("planner shutting down"),
  every open PlanTask goal gets its result (ABORTED, with the reason) and every robot's
  ExecuteSegment goals are cancelled, all before the node goes (stop_serving);
- an engine fault: every task fails with the cause, the node goes through ErrorProcessing to
  Unconfigured, /diagnostics says ERROR with the cause, goals are refused with it, and
  `restart_engine` may configure and activate it again (engine_supervisor.py).

Threads: the rclpy executor runs callbacks; they validate and hand work to the engine thread
(engine_loop.py), which alone touches the engine and the scheduler. Segments go to robots as
ExecuteSegment goals (robot_link.py) and are also published on /<robot>/skill_segments as the
record LRTrace's recorder keeps; TaskStatus on every change, PlannerMetrics and diagnostics
once a second.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from dataclasses import replace

import rclpy
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.lifecycle import LifecycleNode, State, TransitionCallbackReturn

from timelyllm_ros.core.sched.interface import SegmentDispatch
from timelyllm_ros.core.task import TaskSnapshot
from timelyllm_ros.core.validation import GoalError, GoalFields, validate_goal
from timelyllm_ros.msg import PlannerMetrics, SkillSegment, TaskGoal, TaskStatus
from timelyllm_ros.ros import diagnostics, planner_params, share, topics
from timelyllm_ros.ros.conversions import (ClockBridge, goal_fields, s_to_time, segment_msg,
                                           status_msg)
from timelyllm_ros.ros.engine_loop import EngineLoop
from timelyllm_ros.ros.engine_supervisor import EngineSupervisor
from timelyllm_ros.ros.plan_task_server import PlanTaskServer, Watch
from timelyllm_ros.ros.planner_liveness import PlannerAnnouncer
from timelyllm_ros.ros.robot_link import RobotLink

ENGINE_START_TIMEOUT_S = 900.0
SHUTDOWN_REASON = "planner shutting down"
# Of the 2 s a stopping node has (runtime.EXIT_WITHIN_S), how long the engine thread may take
# to end the tasks itself (it may be inside an engine step); the rest is for telling clients
# and robots, which happens even if the engine thread did not get there.
TASKS_END_WITHIN_S = 0.6
TELL_WITHIN_S = 0.9
IDLE_S = 0.05
_FALLBACK_PLANS = {"drone": "tk;mf,100;tc,90;ld;", "arm": "pick(box)->place(box,table)",
                   "chat": "Hello. How can I help?"}


class PlannerNode(LifecycleNode):
    def __init__(self, **kwargs):
        super().__init__("planner", **kwargs)
        planner_params.declare(self)
        planner_params.warn_undeclared_overrides(self)
        self.settings = None
        self.loop: EngineLoop | None = None
        self.active = False
        self._group = ReentrantCallbackGroup()
        self._bridge = ClockBridge(ros_now=self._ros_now)
        self._server: PlanTaskServer | None = None
        self._goal_sub = None
        self._robots: RobotLink | None = None
        self._segment_pubs: dict[str, object] = {}
        self._status_pub = self.create_publisher(TaskStatus, topics.TASK_STATUS, topics.STATUS_QOS)
        self._metrics_pub = self.create_publisher(PlannerMetrics, topics.PLANNER_METRICS,
                                                  topics.METRICS_QOS)
        self.create_timer(1.0, self._publish_metrics, callback_group=self._group)
        self._diag = diagnostics.Publisher(self, "planner", "planner", self._diagnose, self._group)
        self._liveness = PlannerAnnouncer(self)   # robots stop its segments if it vanishes
        self.add_on_set_parameters_callback(
            lambda params: planner_params.apply_changes(self, params))
        self.supervisor = EngineSupervisor(self, self.get_parameter("restart_engine").value,
                                           self.get_parameter("restart_backoff_s").value)

    def _ros_now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    # ------------------------------------------------------------------ lifecycle
    def on_configure(self, state: State) -> TransitionCallbackReturn:
        try:
            self.settings = planner_params.PlannerSettings.from_parameters(planner_params.values(self))
        except (ValueError, KeyError, OSError) as err:
            self.get_logger().error(f"configure failed: {err}")
            return TransitionCallbackReturn.FAILURE
        if self._robots is None:
            # One link for the node's life: its action clients serve every configure (a new
            # link per configure leaked one ExecuteSegment client per robot per restart).
            self._robots = RobotLink(self, self._group, self._post_report,
                                     lambda s: self._bridge.to_ros(s))  # the current engine's clock
        else:
            self._robots.forget_ended()  # a new scheduler: task ids may be used again
        for robot_id in self.settings.robots or {}:
            self._robots.client(robot_id)
            # Made now, not at the first segment: a volatile publisher made just before its
            # first message loses what it sends before discovery matches the subscribers.
            self._segment_pub(robot_id)
        self.loop = EngineLoop(self.settings, self, self.get_logger()).start()
        if not self.loop.wait_ready(ENGINE_START_TIMEOUT_S):
            self.get_logger().error(f"configure failed: {self.loop.error or 'engine start timed out'}")
            self.loop.stop()
            self.loop = None
            return TransitionCallbackReturn.FAILURE
        self.supervisor.engine_up()
        self.get_logger().info("planner configured: engine up, prefix cache warm")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        if self._server is None:
            self._server = PlanTaskServer(self, self._group)
        self._goal_sub = self.create_subscription(TaskGoal, topics.TASK_GOALS, self._on_goal,
                                                  topics.COMMAND_QOS, callback_group=self._group)
        self.active = True
        self.get_logger().info(f"planner active: {topics.PLAN_TASK}, {topics.TASK_GOALS}")
        return super().on_activate(state)

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        self.active = False
        if self._goal_sub is not None:
            self.destroy_subscription(self._goal_sub)
            self._goal_sub = None
        if self.supervisor.pending:  # an engine fault: on to ErrorProcessing (on_error)
            return TransitionCallbackReturn.ERROR
        self.get_logger().info("planner inactive: not admitting goals; running tasks continue")
        return super().on_deactivate(state)

    def on_cleanup(self, state: State) -> TransitionCallbackReturn:
        fault = self.supervisor.pending
        self.stop_serving("planner cleaned up", keep_server=fault)
        return TransitionCallbackReturn.ERROR if fault else TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: State) -> TransitionCallbackReturn:
        self.supervisor.close()
        self.stop_serving(SHUTDOWN_REASON)
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: State) -> TransitionCallbackReturn:
        """ErrorProcessing after an engine fault: the tasks have failed already; release what
        is left and go to Unconfigured (the supervisor may configure again)."""
        # The PlanTask server stays: new goals are answered with the fault, not with silence.
        self.stop_serving(self.supervisor.fault or "planner error", keep_server=True)
        self.get_logger().error(f"ErrorProcessing: {self.supervisor.describe()}")
        return TransitionCallbackReturn.SUCCESS

    def lifecycle_state(self) -> str:
        return self._state_label()

    def stop_serving(self, reason: str, spin: bool = False, keep_server: bool = False) -> None:
        """End every task with `reason`, tell every PlanTask client (its goal's result) and
        every robot (its segment goals are cancelled), then release the engine. Within about
        TASKS_END_WITHIN_S + TELL_WITHIN_S, whatever the engine thread is doing. `spin`: the
        caller owns the executor (process shutdown, after the spin loop ended); otherwise it
        is a callback and the executor's other threads deliver the messages. `keep_server`:
        the PlanTask action stays up (and refuses goals with the reason)."""
        self.active = False
        if self._goal_sub is not None:
            self.destroy_subscription(self._goal_sub)
            self._goal_sub = None
        if self.loop is not None:
            if not self.loop.stop(TASKS_END_WITHIN_S, reason):
                self.get_logger().warning(
                    f"engine thread did not end the tasks within {TASKS_END_WITHIN_S} s "
                    "(inside an engine step); ending their goals here")
            self.loop = None
        # The engine thread has told the watches and robots of every task it ended; this
        # catches the rest (a goal whose submission was still in the inbox, a loop that did
        # not get there in time), then waits until the results and cancels are out.
        if self._server is not None:
            self._server.end_all(reason)
        if self._robots is not None:
            self._robots.end_all()
        self._deliver(time.monotonic() + TELL_WITHIN_S, spin)
        if self._server is not None and not keep_server:
            self._server.destroy()
            self._server = None

    def _deliver(self, deadline: float, spin: bool) -> None:
        def pending() -> int:
            goals = self._server.goals_in_flight() if self._server is not None else 0
            cancels = self._robots.cancels_pending() if self._robots is not None else 0
            return goals + cancels

        executor = self.executor
        while pending() and time.monotonic() < deadline:
            if spin and executor is not None:
                executor.spin_once(timeout_sec=0.02)
            else:
                time.sleep(0.01)
        if spin and executor is not None:
            # The result responses are sent by done-callbacks scheduled after each execute, and
            # a client's result request may still be waiting to be taken: spin until the
            # executor has had nothing to do for IDLE_S (or the time is up).
            while time.monotonic() < deadline:
                started = time.monotonic()
                executor.spin_once(timeout_sec=IDLE_S)
                if time.monotonic() - started >= IDLE_S:
                    break
        left = pending()
        if left:
            self.get_logger().error(f"{left} goal result(s) or robot cancel(s) still undelivered "
                                    "at shutdown")

    # ------------------------------------------------------------------ goals in (ROS threads)
    def _on_goal(self, msg: TaskGoal) -> None:
        fields = goal_fields(msg, self._bridge)
        reason = self.admit(fields, None)
        if reason is not None:
            self.get_logger().warning(f"rejected goal {msg.task_id!r}: {reason}")

    def admit(self, fields: GoalFields, watch: Watch | None) -> str | None:
        """Validate a goal and hand it to the engine thread; the reason if it is refused."""
        loop = self.loop
        if self.supervisor.fault is not None:
            return f"planner: not serving: {self.supervisor.describe()}"
        if not self.active or loop is None or self._server is None:
            return f"planner: not active (lifecycle state {self._state_label()}); activate it first"
        try:
            spec = validate_goal(fields, levels=self.settings.levels,
                                 known_robots=self.settings.robots,
                                 now_s=self._bridge.to_engine(self._ros_now()))
        except GoalError as err:
            self.publish_rejection(fields.task_id, fields.robot_id, str(err))
            return str(err)
        scene = self.settings.scenes.get(spec.robot_id)
        if scene:
            spec = replace(spec, scene=scene)
        if self.settings.engine_kind == "sim":
            spec = replace(spec, scripted_plan=self.settings.scripted_plans.get(
                spec.instruction, _FALLBACK_PLANS.get(spec.skill_set, "tk;ld;")))
        server = self._server
        if not loop.post(lambda scheduler: server.submit(scheduler, spec, watch)):
            return f"planner: not serving: {loop.error or SHUTDOWN_REASON}"
        return None

    def _post_report(self, task_id: str, sequence: int, started: float | None,
                     finished: float | None, success: bool, message: str,
                     returned: bool = False, values: str = "") -> None:
        loop = self.loop
        if loop is None:
            return
        try:
            observed = json.loads(values) if values else None
        except ValueError:
            self.get_logger().warning(f"{task_id}#{sequence}: the robot's values are not JSON; "
                                      f"ignored: {values[:80]!r}")
            observed = None
        if not isinstance(observed, dict):
            observed = None

        def apply(scheduler):
            now = scheduler.engine.now()
            offset = self._bridge.offset()  # one reading: start and finish keep their order
            start = self._bridge.to_engine(started, offset) if started else now
            finish = self._bridge.to_engine(finished, offset) if finished else max(now, start)
            try:
                scheduler.on_report(task_id, sequence, start, finish, success, message,
                                    returned=returned, values=observed)
            except (KeyError, ValueError) as err:
                self.get_logger().error(f"ignored result for {task_id}#{sequence}: "
                                        f"{err.args[0] if err.args else err}")

        loop.post(apply)

    # ------------------------------------------------------------------ sink (engine thread)
    def engine_started(self, engine) -> None:
        self._bridge = ClockBridge(engine_now=engine.now, ros_now=self._ros_now)

    def engine_failed(self, reason: str) -> None:
        """The engine thread failed (every task has failed with `reason` already)."""
        self.get_logger().error(f"engine fault: {reason}")
        self.supervisor.on_fault(reason)

    def _segment_pub(self, robot_id: str):
        pub = self._segment_pubs.get(robot_id)
        if pub is None:
            pub = self._segment_pubs[robot_id] = self.create_publisher(
                SkillSegment, topics.robot_topic(robot_id, topics.SKILL_SEGMENTS), topics.COMMAND_QOS)
        return pub

    def on_segment(self, d: SegmentDispatch) -> None:
        self._segment_pub(d.robot_id).publish(
            segment_msg(d, s_to_time(self._bridge.to_ros(d.dispatched_s))))
        self._robots.dispatch(d)
        if self._server is not None:
            self._server.on_segment(d, self._bridge.to_ros(d.estimated_done_s))

    def on_status(self, snapshot: TaskSnapshot) -> None:
        msg = status_msg(snapshot, self.get_clock().now().to_msg())
        task = self.loop.scheduler.tasks.get(snapshot.task_id) if self.loop and self.loop.scheduler else None
        if task is not None and snapshot.state != "rejected":
            tuf = task.spec.tuf
            msg.urgency, msg.expected_response_time_s = task.spec.urgency, tuf.ert_s
            msg.decline_slope_per_s, msg.initial_utility = tuf.slope_per_s, tuf.initial_utility
        self._status_pub.publish(msg)
        if snapshot.is_terminal and self._robots is not None:
            self._robots.end_task(snapshot.task_id)
        if self._server is not None:
            self._server.on_status(snapshot)

    def stop_robot(self, task_id: str) -> None:
        """Cancel the robot's segment goals for a task that is being cancelled."""
        if self._robots is not None:
            self._robots.end_task(task_id)

    def publish_rejection(self, task_id: str, robot_id: str, reason: str) -> None:
        nan = math.nan
        self._status_pub.publish(TaskStatus(
            task_id=task_id, robot_id=robot_id, state="rejected", reason=reason,
            response_time_s=nan, utility=nan, waiting_time_s=nan,
            expected_response_time_s=nan, decline_slope_per_s=nan, initial_utility=nan,
            stamp=self.get_clock().now().to_msg()))

    # ------------------------------------------------------------------ periodic
    def _publish_metrics(self) -> None:
        loop = self.loop
        stats = loop.stats if loop is not None else {}
        if not stats:
            return
        self._metrics_pub.publish(PlannerMetrics(
            policy=stats["policy"], engine=stats["engine"], queued=stats["queued"],
            running=stats["running"], active_tasks=stats["active_tasks"],
            tasks_total=stats["tasks_total"],
            kv_free_blocks=min(stats["kv_free_blocks"], 2**32 - 1),
            kv_total_blocks=min(stats["kv_total_blocks"], 2**32 - 1),
            fetch_overhead_ms=stats["fetch_overhead_ms"], stamp=self.get_clock().now().to_msg()))

    def _state_label(self) -> str:
        try:
            return self._state_machine.current_state[1]
        except Exception:  # noqa: BLE001
            return "unknown"

    def _diagnose(self):
        loop = self.loop
        state = self._state_label()
        values = {"lifecycle_state": state, "engine_up": bool(loop and loop.ready.is_set() and loop.alive)}
        stats = loop.stats if loop is not None else {}
        if stats:
            values.update({k: stats[k] for k in ("policy", "engine", "queued", "running",
                                                  "active_tasks", "kv_free_blocks", "kv_total_blocks")})
            values.update({f"tasks_{k}": v for k, v in sorted(stats["states"].items())})
        if self._robots is not None:
            values["robot_goals_outstanding"] = self._robots.outstanding()
        if self.supervisor.fault is not None:
            return diagnostics.ERROR, self.supervisor.describe(), values
        if loop is not None and loop.error:
            return diagnostics.ERROR, loop.error, values
        if not self.active:
            return diagnostics.WARN, f"not admitting goals ({state})", values
        return diagnostics.OK, "active", values


def main(argv: list[str] | None = None) -> int:
    # The core logs through Python logging (e.g. the cached-token count of every resume).
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] [%(name)s]: %(message)s")
    # `transitions` logs every state change at INFO; task states are on /timelyllm/task_status.
    logging.getLogger("transitions").setLevel(logging.WARNING)
    share.use_installed_config()
    rclpy.init(args=argv if argv is not None else sys.argv)
    from timelyllm_ros.ros.runtime import spin_until_shutdown

    node = PlannerNode()

    def cleanup():
        node.supervisor.close()
        node.stop_serving(SHUTDOWN_REASON, spin=True)

    spin_until_shutdown(node, cleanup=cleanup, threads=4)
    # Every client and robot has been told, the node is gone: leave now. Finalizing the
    # interpreter after vLLM (torch, its worker state) took 2-3 s on a loaded 2-core machine,
    # past the 2 s a stopping node has, and under an engine thread still shutting down (a
    # vLLM step or engine-core shutdown that outlasted the grace period) it can abort; the
    # launcher reaps the engine's process group.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
