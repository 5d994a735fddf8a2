"""The ROS graph of an LRTrace replay: the nodes it starts (recorder, planner, one executor per
robot), how it knows they are all connected, and their logs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from timelyllm_ros.core.tuf import default_config_dir
from timelyllm_ros.experiments.replay_plan import ReplayOptions, ReplayPlan
from timelyllm_ros.ros.launch_description import NodeSpec
from timelyllm_ros.ros_env import REPO_ROOT

RECORDER_NODE = "lrtrace_replay_recorder"
# The bench's report timeout (bench.config.BenchConfig.report_timeout_min_s), for the same
# reason: a segment queued behind another task's segments on a busy robot is not lost.
REPORT_TIMEOUT_MIN_S = 3600.0


def planner_config_dir(work: Path, plan: ReplayPlan) -> Path:
    """A planner config dir with only the skill sets the events use (as the bench does)."""
    src = default_config_dir()
    out = work / "config"
    (out / "skillsets").mkdir(parents=True)
    shutil.copy(src / "tuf_levels.yaml", out / "tuf_levels.yaml")
    shutil.copy(plan.exec_model or src / "exec_model.yaml", out / "exec_model.yaml")
    for name in sorted(set(plan.robots.values())):
        shutil.copy(src / "skillsets" / f"{name}.yaml", out / "skillsets" / f"{name}.yaml")
    return out


def node_specs(options: ReplayOptions, plan: ReplayPlan, work: Path, bag_path: Path,
               table_csv: Path | None) -> tuple[NodeSpec, list[NodeSpec]]:
    """(the recorder, the other nodes to start: the planner unless attached, the executors
    unless no robots are to be started)."""
    recorder = NodeSpec(
        name=RECORDER_NODE, module="timelyllm_ros.ros.lrtrace_recorder_node",
        executable="lrtrace_recorder_node",
        parameters={"output": str(bag_path), "robots": ",".join(plan.robots),
                    "write_table": True})
    nodes = []
    if not options.attach:
        params: dict[str, Any] = {
            "policy": plan.policy, "engine.kind": plan.engine,
            "robots": [f"{r}:{s}" for r, s in plan.robots.items()],
            "config_dir": str(planner_config_dir(work, plan)),
            "network_latency_s": float(plan.workload.network_latency_s),
            "report_timeout_min_s": REPORT_TIMEOUT_MIN_S,
        }
        if options.model:
            params["model"] = str(Path(options.model).resolve())
        if options.profile:
            params["engine.sim_profile"] = str(Path(options.profile).resolve())
        nodes.append(NodeSpec(name="planner", module="timelyllm_ros.ros.planner_node",
                              executable="planner_node",
                              parameters_file=REPO_ROOT / "config" / "planner.yaml",
                              parameters=params))
    if not options.no_robots:
        for i, robot in enumerate(plan.robots):
            params = {"robot_id": robot, "time_scale": float(options.time_scale),
                      "seed": int(plan.seed) * 1000 + i}
            if plan.exec_model is not None:
                params["exec_model"] = str(plan.exec_model)
            if table_csv is not None:
                params.update(backend="replay", replay_table=str(table_csv))
            nodes.append(NodeSpec(name="executor", namespace=robot,
                                  module="timelyllm_ros.ros.executor_node",
                                  executable="drone_executor_node", parameters=params))
    return recorder, nodes


def _endpoints(node, topic: str, kind: str) -> set[tuple[str, str]]:
    infos = (node.get_subscriptions_info_by_topic(topic) if kind == "sub"
             else node.get_publishers_info_by_topic(topic))
    return {(i.node_namespace.rstrip("/") or "/", i.node_name) for i in infos}


def missing_endpoints(client, plan: ReplayPlan, options: ReplayOptions) -> list[str]:
    """What the graph still lacks before goals may be published (empty: complete): the recorder
    on every topic, the planner listening for goals (only once it is active), and each robot's
    executor serving its execute_segment action."""
    from timelyllm_ros.ros import topics  # imports rclpy: only once the replay knows it exists

    node = client.node
    rec = ("/", RECORDER_NODE)
    missing = []
    goal_subs = _endpoints(node, topics.TASK_GOALS, "sub")
    if rec not in goal_subs:
        missing.append(f"recorder on {topics.TASK_GOALS}")
    if rec not in _endpoints(node, topics.TASK_STATUS, "sub"):
        missing.append(f"recorder on {topics.TASK_STATUS}")
    planner_listening = bool(goal_subs - {rec}) if options.attach \
        else ("/", "planner") in goal_subs
    if not planner_listening:
        missing.append(f"planner on {topics.TASK_GOALS} (loading its engine?)")
    for robot in plan.robots:
        seg = topics.robot_topic(robot, topics.SKILL_SEGMENTS)
        rep = topics.robot_topic(robot, topics.EXECUTION_REPORTS)
        if rec not in _endpoints(node, seg, "sub") or rec not in _endpoints(node, rep, "sub"):
            missing.append(f"recorder on /{robot}/*")
        if not options.no_robots and not _serves_action(
                node, "executor", f"/{robot}", topics.robot_topic(robot, topics.EXECUTE_SEGMENT)):
            missing.append(f"executor of {robot}")
    return missing


def _serves_action(node, name: str, namespace: str, action: str) -> bool:
    try:
        services = node.get_service_names_and_types_by_node(name, namespace)
    except Exception:  # noqa: BLE001 - the node is not in the graph (yet)
        return False
    return any(srv == f"{action}/_action/send_goal" for srv, _types in services)


def log_tail(log_dir: Path, label: str, chars: int = 1500) -> str:
    """The end of a node's log, for an error message."""
    path = log_dir / f"{label.replace('/', '__')}.log"
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"
