"""The planner node: task goals in, skill segments out, execution reports back in.

Threads:
- the rclpy executor runs callbacks; they only validate and enqueue, and never touch the engine;
- one engine thread owns the engine and the scheduler: it builds the engine, drains the inbox,
  and ticks the scheduler. Publishing from it is safe (rclpy publishers are thread-safe).

The goal subscription is created only once the engine is loaded and its prefix cache warm, so a
task's response time never includes engine start-up; clients wait for a subscriber on
/timelyllm/task_goals before submitting.
"""

from __future__ import annotations

import logging
import math
import queue
import sys
import threading
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import rclpy
from rclpy.node import Node
from rclpy.parameter import Parameter

from timelyllm_ros.core.engine.base import ENGINE_SCHEDULING
from timelyllm_ros.core.engine.factory import EngineSpec, build_engine
from timelyllm_ros.core.engine.vllm_engine import VllmEngineConfig
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.registry import DEFAULT_POLICY, get_policy
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.core.sched.interface import SegmentDispatch, TaskRejected
from timelyllm_ros.core.skills.skillset import load_skillsets
from timelyllm_ros.core.task import TaskSnapshot, TaskSpec
from timelyllm_ros.core.tuf import default_config_dir, load_tuf_levels
from timelyllm_ros.core.validation import GoalError, validate_goal
from timelyllm_ros.msg import ExecutionReport, PlannerMetrics, TaskGoal, TaskStatus
from timelyllm_ros.ros import topics
from timelyllm_ros.ros.runtime import spin_until_shutdown
from timelyllm_ros.ros.conversions import (ClockBridge, goal_fields, s_to_time, segment_msg,
                                             status_msg, time_to_s)

ENGINE_PARAMS = {
    # ROS parameter -> (VllmEngineConfig field, default)
    "engine.dtype": ("dtype", "float32"),
    "engine.max_model_len": ("max_model_len", 2048),
    "engine.memory_fraction": ("gpu_memory_utilization", 0.3),
    "engine.enforce_eager": ("enforce_eager", True),
    "engine.tensor_parallel_size": ("tensor_parallel_size", 1),
    "engine.max_num_seqs": ("max_num_seqs", 32),
    "engine.block_size": ("block_size", 0),
    "engine.repetition_penalty": ("repetition_penalty", 1.15),
    "engine.temperature": ("temperature", 0.0),
    "engine.seed": ("seed", 0),
    # vLLM's scheduling_policy; empty = what the planner's policy expects (priority for the BROS
    # family: best-effort requests are admitted after, and preempted before, the rest).
    "engine.scheduling_policy": ("scheduling_policy", ""),
}


@dataclass
class _Goal:
    spec: TaskSpec


@dataclass
class _Report:
    msg: ExecutionReport


class PlannerNode(Node):
    def __init__(self):
        super().__init__("planner")
        p = self._declare_parameters()
        self._policy_name = p["policy"]
        self._policy = get_policy(self._policy_name)
        config_dir = Path(p["config_dir"]) if p["config_dir"] else default_config_dir()
        self._levels = load_tuf_levels(config_dir / "tuf_levels.yaml")
        self._skill_sets = load_skillsets(config_dir / "skillsets")
        self._exec_model = ExecutionTimeModel.from_yaml(
            Path(p["exec_model"]) if p["exec_model"] else config_dir / "exec_model.yaml")
        self._robots = _parse_robots(p["robots"], self._skill_sets)
        self._scheduler_config = SchedulerConfig(
            network_latency_s=p["network_latency_s"],
            report_timeout_factor=p["report_timeout_factor"],
            report_timeout_min_s=p["report_timeout_min_s"],
            # A planner runs for days: keep recent finished tasks (for duplicate-id checks and
            # status queries), not all of them.
            max_finished_tasks=10_000)
        self._engine_profile = None
        if p["engine.profile"]:
            from timelyllm_ros.core.engine.cost_model import EngineProfile

            self._engine_profile = EngineProfile.from_yaml(config_dir / p["engine.profile"])
        self._engine_kind = p["engine.kind"]
        self._engine_scheduling = p["engine.scheduling_policy"] or \
            self._policy.engine_needs().scheduling_policy
        if self._engine_scheduling not in ENGINE_SCHEDULING:
            raise ValueError(f"parameter engine.scheduling_policy: {self._engine_scheduling!r} is "
                             f"not one of {', '.join(ENGINE_SCHEDULING)} (or empty)")
        self._scripted_plans: dict[str, str] = {}
        if self._engine_kind == "sim":
            # The cost-model engine the policy needs, paced to the wall clock.
            from timelyllm_ros.core.engine.cost_model import EngineProfile

            sim_profile = p["engine.sim_profile"]
            self._engine_spec = EngineSpec(
                kind="sim-realtime", scheduling_policy=self._engine_scheduling,
                profile=EngineProfile.from_yaml(sim_profile) if sim_profile else None)
            self._engine_model = "cost model"
            self._scripted_plans = _trace_plans()
        elif self._engine_kind == "vllm":
            config = self._engine_config_from(p)
            self._engine_spec = EngineSpec(kind="vllm", scheduling_policy=self._engine_scheduling,
                                           profile=self._engine_profile, vllm=asdict(config))
            self._engine_model = config.model
        else:
            raise ValueError(f"parameter engine.kind: {self._engine_kind!r} is not 'vllm' or 'sim'")
        self._warm = p["warm_prefix_cache"]

        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._time_bridge = ClockBridge()
        self._status_pub = self.create_publisher(TaskStatus, topics.TASK_STATUS, topics.STATUS_QOS)
        self._metrics_pub = self.create_publisher(PlannerMetrics, topics.PLANNER_METRICS,
                                                  topics.METRICS_QOS)
        self._segment_pubs: dict[str, Any] = {}
        self._report_subs: dict[str, Any] = {}
        self._robot_lock = threading.Lock()
        for robot_id in self._robots or {}:
            self._ensure_robot(robot_id)
        self._goal_sub = None
        self._scheduler: SegmentScheduler | None = None
        self._metrics_timer = self.create_timer(1.0, self._publish_metrics)
        self._engine_thread = threading.Thread(target=self._engine_main, name="engine", daemon=True)
        self._engine_thread.start()

    # ------------------------------------------------------------------ parameters
    def _declare_parameters(self) -> dict[str, Any]:
        defaults = {
            "policy": DEFAULT_POLICY,
            "model": "",
            "config_dir": "",
            "exec_model": "",
            "robots": Parameter.Type.STRING_ARRAY,
            "network_latency_s": 0.0,
            "report_timeout_factor": 3.0,
            "report_timeout_min_s": 5.0,
            "warm_prefix_cache": True,
            # "vllm": the real engine. "sim": the calibrated cost-model engine paced to the wall
            # clock, for replaying large LRTrace workloads over ROS; it "generates" each trace's
            # plan, looked up by the goal's instruction in lrtrace/traces.yaml.
            "engine.kind": "vllm",
            "engine.sim_profile": "",
            # Cost model of the real engine (from `timelyllm profile`), relative to config_dir;
            # policies that predict step times (bros, hybrid, lamps and their combinations)
            # use it. Empty = their default (the paper's GPU profile).
            "engine.profile": "",
        }
        values = {}
        for name, default in defaults.items():
            if isinstance(default, Parameter.Type):
                self.declare_parameter(name, default)
                values[name] = list(self.get_parameter(name).value or [])
            else:
                values[name] = self.declare_parameter(name, default).value
        for name, (_field, default) in ENGINE_PARAMS.items():
            values[name] = self.declare_parameter(name, default).value
        return values

    def _engine_config_from(self, p: dict[str, Any]) -> VllmEngineConfig:
        from timelyllm_ros.core.engine.model_prep import DEFAULT_MODEL_DIR

        model = p["model"] or str(DEFAULT_MODEL_DIR)
        if not Path(model).is_dir():
            raise ValueError(f"parameter model: {model} is not a directory; run "
                             "`timelyllm model prepare` or point it at a local HF model")
        fields = {field: p[name] for name, (field, _d) in ENGINE_PARAMS.items()}
        if not fields["block_size"]:
            fields["block_size"] = None
        fields["scheduling_policy"] = self._engine_scheduling
        return VllmEngineConfig(model=model, **fields)

    # ------------------------------------------------------------------ ROS side (callbacks)
    def _ensure_robot(self, robot_id: str) -> None:
        with self._robot_lock:
            if robot_id in self._segment_pubs:
                return
            from timelyllm_ros.msg import SkillSegment

            self._segment_pubs[robot_id] = self.create_publisher(
                SkillSegment, topics.robot_topic(robot_id, topics.SKILL_SEGMENTS), topics.COMMAND_QOS)
            self._report_subs[robot_id] = self.create_subscription(
                ExecutionReport, topics.robot_topic(robot_id, topics.EXECUTION_REPORTS),
                lambda msg, rid=robot_id: self._on_report(rid, msg), topics.COMMAND_QOS)

    def _on_goal(self, msg: TaskGoal) -> None:
        try:
            spec = validate_goal(goal_fields(msg, self._time_bridge), levels=self._levels,
                                 known_robots=self._robots, now_s=self._time_bridge.to_engine(
                                     self.get_clock().now().nanoseconds * 1e-9))
        except GoalError as err:
            self.get_logger().warning(f"rejected goal {msg.task_id!r}: {err}")
            self._publish_status(_bare_status(msg.task_id, msg.robot_id, "rejected", str(err)))
            return
        if self._engine_kind == "sim":
            spec = replace(spec, scripted_plan=self._scripted_plans.get(
                spec.instruction, _FALLBACK_PLANS.get(spec.skill_set, "tk;ld;")))
        self._ensure_robot(spec.robot_id)
        self._inbox.put(_Goal(spec))
        self._wake.set()

    def _on_report(self, robot_id: str, msg: ExecutionReport) -> None:
        if msg.robot_id and msg.robot_id != robot_id:
            self.get_logger().error(f"report on /{robot_id} names robot_id {msg.robot_id!r}; ignored")
            return
        self._inbox.put(_Report(msg))
        self._wake.set()

    # ------------------------------------------------------------------ engine thread
    def _engine_main(self) -> None:
        try:
            self.get_logger().info(
                f"loading {self._engine_kind} engine ({self._engine_model}, "
                f"policy {self._policy_name})")
            engine = build_engine(self._engine_spec, self._policy.engine_needs())
            self._time_bridge = ClockBridge(engine_now=engine.now)
            scheduler = SegmentScheduler(engine, self._policy, self._skill_sets, self._exec_model,
                                         _RosListener(self), self._scheduler_config)
            if self._warm:
                scheduler.warm_prefix_cache()
            self._scheduler = scheduler
        except Exception as err:  # noqa: BLE001 - reported, then the node exits
            self.get_logger().fatal(f"engine failed to start: {err}\n{traceback.format_exc()}")
            self._stop.set()
            return
        self._goal_sub = self.create_subscription(TaskGoal, topics.TASK_GOALS, self._on_goal,
                                                  topics.COMMAND_QOS)
        self._ready.set()
        self.get_logger().info("planner ready: listening on " + topics.TASK_GOALS)
        try:
            while not self._stop.is_set():
                self._drain_inbox(scheduler)
                if not scheduler.tick():
                    timer = scheduler.next_timer_s()
                    wait = 0.5 if timer is None else min(0.5, max(0.0, timer - engine.now()))
                    self._wake.wait(wait)
                    self._wake.clear()
        except Exception as err:  # noqa: BLE001
            self.get_logger().fatal(f"engine loop failed: {err}\n{traceback.format_exc()}")
        finally:
            scheduler.shutdown("planner shutting down")
            engine.shutdown()

    def _drain_inbox(self, scheduler: SegmentScheduler) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Goal):
                try:
                    scheduler.submit(item.spec)
                except TaskRejected as err:
                    self.get_logger().warning(f"rejected goal {item.spec.task_id!r}: {err}")
            else:
                self._apply_report(scheduler, item.msg)

    def _apply_report(self, scheduler: SegmentScheduler, msg: ExecutionReport) -> None:
        started, finished = time_to_s(msg.started), time_to_s(msg.finished)
        try:
            scheduler.on_report(msg.task_id, msg.sequence, self._time_bridge.to_engine(started),
                                self._time_bridge.to_engine(finished), msg.success, msg.message)
        except (KeyError, ValueError) as err:
            # Garbage from a robot is logged with the field at fault and changes nothing else.
            self.get_logger().error(
                f"ignored report from {msg.robot_id or '?'} for task {msg.task_id!r}: "
                f"{err.args[0] if err.args else err}")

    # ------------------------------------------------------------------ publishing
    def publish_segment(self, dispatch: SegmentDispatch) -> None:
        self._ensure_robot(dispatch.robot_id)
        stamp = s_to_time(self._time_bridge.to_ros(dispatch.dispatched_s))
        self._segment_pubs[dispatch.robot_id].publish(segment_msg(dispatch, stamp))

    def _publish_status(self, msg: TaskStatus) -> None:
        msg.stamp = self.get_clock().now().to_msg()
        self._status_pub.publish(msg)

    def publish_snapshot(self, snapshot: TaskSnapshot) -> None:
        self._publish_status(status_msg(snapshot, self.get_clock().now().to_msg()))

    def _publish_metrics(self) -> None:
        scheduler = self._scheduler
        if scheduler is None:
            return
        kv = scheduler.engine.kv_usage()
        overhead = scheduler.fetch_overhead_s[-200:]
        self._metrics_pub.publish(PlannerMetrics(
            policy=self._policy_name, engine=scheduler.engine.name,
            queued=scheduler.queue_length(), running=len(scheduler.running_request_ids()),
            active_tasks=len(scheduler.active_tasks()), tasks_total=len(scheduler.tasks),
            kv_free_blocks=min(kv.free_blocks, 2**32 - 1), kv_total_blocks=min(kv.total_blocks, 2**32 - 1),
            fetch_overhead_ms=1e3 * sum(overhead) / len(overhead) if overhead else 0.0,
            stamp=self.get_clock().now().to_msg()))

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._engine_thread.join(timeout=30)


class _RosListener:
    def __init__(self, node: PlannerNode):
        self._node = node

    def on_segment(self, dispatch: SegmentDispatch) -> None:
        self._node.publish_segment(dispatch)

    def on_status(self, snapshot: TaskSnapshot) -> None:
        self._node.publish_snapshot(snapshot)


_FALLBACK_PLANS = {"drone": "tk;mf,100;tc,90;ld;", "arm": "pick(box)->place(box,table)",
                   "chat": "Hello. How can I help?"}


def _trace_plans() -> dict[str, str]:
    from timelyllm_ros.lrtrace.traces import load_traces

    return {t.instruction: t.plan for t in load_traces().values()}


def _parse_robots(entries: list[str], skill_sets: dict) -> dict[str, str] | None:
    """`["drone_1:drone", ...]` -> {robot id: skill set}; empty list = accept any robot."""
    if not entries:
        return None
    robots = {}
    for entry in entries:
        robot_id, sep, kind = entry.partition(":")
        if not sep or not robot_id or kind not in skill_sets:
            raise ValueError(f"parameter robots: {entry!r} must be 'robot_id:skill_set' with a "
                             f"skill set in {sorted(skill_sets)}")
        robots[robot_id] = kind
    return robots


def _bare_status(task_id: str, robot_id: str, state: str, reason: str) -> TaskStatus:
    nan = math.nan
    return TaskStatus(task_id=task_id, robot_id=robot_id, state=state, reason=reason,
                      response_time_s=nan, utility=nan, waiting_time_s=nan)


def main(argv: list[str] | None = None) -> int:
    # The core logs through Python logging (e.g. the cached-token count of every resume).
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] [%(name)s]: %(message)s")
    # `transitions` logs every state change at INFO (two lines per transition); task states are
    # published on /timelyllm/task_status already, so its lines would only bury the planner's.
    logging.getLogger("transitions").setLevel(logging.WARNING)
    rclpy.init(args=argv if argv is not None else sys.argv)
    try:
        node = PlannerNode()
    except (ValueError, KeyError) as err:
        print(f"planner: {err}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    spin_until_shutdown(node, cleanup=node.shutdown, until=node._stop.is_set)
    return 0


if __name__ == "__main__":
    sys.exit(main())
