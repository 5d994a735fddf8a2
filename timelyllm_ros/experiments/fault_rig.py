"""One fault scenario's processes, and what the fault runner sees of them (experiments/faults.py).

A `Rig` starts a planner on the wall-clock simulated engine, robots (executor nodes, one fleet
simulator, optionally one executor behind a network link that can be cut: fault_netns.py) and
a PlannerClient, each in a process of its own, on the ROS domain of the environment. Its
`Observer` records, on the client's node, with this host's wall clock (the nodes stamp with the
same clock):
- every PlanTask goal sent through `send`: when it was accepted and when its result came;
- every TaskStatus (the first terminal one of each task, its stamp);
- every ExecutionReport and ExecuteSegment feedback per robot (a robot is running a segment
  when its latest feedback is newer than its latest report);
- the latest /diagnostics of every node, with when it arrived.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from timelyllm_ros.ros_env import REPO_ROOT

TERMINAL = ("done", "failed", "rejected", "cancelled")


def stamp_s(t) -> float:
    return t.sec + t.nanosec * 1e-9


# Put first on the nodes' PYTHONPATH: its sitecustomize gives Python threads their names in the
# OS, so that a thread pool's workers can be told from the rest (see that file).
THREAD_NAMES = Path(__file__).resolve().parent / "thread_names"
POOL_THREAD = "ThreadPoolExecu"   # concurrent.futures' worker names, cut to the OS's 15 chars


def threads_of(pid: int) -> dict[str, int] | None:
    """The process's threads by name (/proc/PID/task/*/comm), None when it is gone."""
    names: dict[str, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue   # ended meanwhile
        names[name] = names.get(name, 0) + 1
    return names


def node_env() -> dict[str, str]:
    """Environment additions for every node process of a rig."""
    path = [str(THREAD_NAMES)] if THREAD_NAMES.is_dir() else []
    path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"PYTHONPATH": os.pathsep.join(path)}


def wait_until(predicate: Callable[[], bool], timeout_s: float, step_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())


@dataclass
class Goal:
    task_id: str
    robot: str
    sent: float                      # wall clock, as every time below
    accepted: float | None = None
    refused: bool = False
    result_at: float | None = None
    status: int | None = None        # GoalStatus code of the result
    state: str = ""
    reason: str = ""
    dispatched: int = 0              # segments dispatched, from feedback
    response_time_s: float | None = None   # of the first segment, from the result
    utility: float | None = None


def _number(x: float) -> float | None:
    """A result's figure for JSON: NaN (not measured, e.g. a rejected task) as None."""
    return None if x != x else round(float(x), 4)


class Observer:
    def __init__(self, node, robots: list[str]):
        from diagnostic_msgs.msg import DiagnosticArray

        from timelyllm_ros.msg import TaskStatus
        from timelyllm_ros.ros import topics

        self._node = node
        self.lock = threading.Lock()
        self.goals: dict[str, Goal] = {}
        self.terminal_status: dict[str, tuple[str, str, float]] = {}   # task -> state, reason, stamp
        self.reports: dict[str, list] = {}          # task -> ExecutionReports
        self.started_at: dict[str, float] = {}      # robot -> latest feedback arrival
        self.reported_at: dict[str, float] = {}     # robot -> latest report arrival
        self.diag: dict[str, tuple[float, int, str, dict]] = {}   # name -> arrival, level, msg, values
        node.create_subscription(TaskStatus, topics.TASK_STATUS, self._on_status, topics.STATUS_QOS)
        node.create_subscription(DiagnosticArray, topics.DIAGNOSTICS, self._on_diag, 50)
        for robot in robots:
            self.watch_robot(robot)

    def watch_robot(self, robot: str) -> None:
        from timelyllm_ros.action import ExecuteSegment
        from timelyllm_ros.msg import ExecutionReport
        from timelyllm_ros.ros import topics

        self._node.create_subscription(
            ExecutionReport, topics.robot_topic(robot, topics.EXECUTION_REPORTS),
            lambda m, r=robot: self._on_report(r, m), topics.COMMAND_QOS)
        self._node.create_subscription(
            ExecuteSegment.Impl.FeedbackMessage, f"/{robot}/execute_segment/_action/feedback",
            lambda m, r=robot: self._stamp(self.started_at, r), 50)

    # ------------------------------------------------------------------ callbacks
    def _stamp(self, table: dict, key: str) -> None:
        with self.lock:
            table[key] = time.time()

    def _on_report(self, robot: str, msg) -> None:
        with self.lock:
            self.reports.setdefault(msg.task_id, []).append(msg)
            self.reported_at[robot] = time.time()

    def _on_status(self, msg) -> None:
        if msg.state in TERMINAL:
            with self.lock:
                self.terminal_status.setdefault(msg.task_id,
                                                (msg.state, msg.reason, stamp_s(msg.stamp)))

    def _on_diag(self, msg) -> None:
        now = time.time()
        with self.lock:
            for s in msg.status:
                level = ord(s.level) if isinstance(s.level, bytes) else int(s.level)
                self.diag[s.name] = (now, level, s.message, {kv.key: kv.value for kv in s.values})

    # ------------------------------------------------------------------ goals
    def send(self, action, task_id: str, robot: str, instruction: str, skill_set: str,
             urgency: str = "normal") -> None:
        """A PlanTask goal, asynchronously: acceptance, feedback and result are recorded."""
        from timelyllm_ros.action import PlanTask

        goal = Goal(task_id, robot, time.time())
        with self.lock:
            self.goals[task_id] = goal
        future = action.send_goal_async(
            PlanTask.Goal(task_id=task_id, robot_id=robot, skill_set=skill_set,
                          instruction=instruction, urgency=urgency),
            feedback_callback=lambda m, g=goal: self._on_feedback(g, m.feedback))
        future.add_done_callback(lambda f, g=goal: self._on_response(g, f.result()))

    def _on_feedback(self, goal: Goal, feedback) -> None:
        with self.lock:
            goal.dispatched = max(goal.dispatched, feedback.segments_dispatched)

    def _on_response(self, goal: Goal, handle) -> None:
        with self.lock:
            goal.accepted = time.time()
            goal.refused = not handle.accepted
        if handle.accepted:
            handle.get_result_async().add_done_callback(
                lambda f, g=goal: self._on_result(g, f.result()))

    def _on_result(self, goal: Goal, response) -> None:
        with self.lock:
            goal.result_at = time.time()
            goal.status = response.status
            goal.state, goal.reason = response.result.state, response.result.reason
            goal.response_time_s = _number(response.result.response_time_s)
            goal.utility = _number(response.result.utility)

    def planner_lost(self, reason: str) -> None:
        """The client's planner watch saw the planner vanish: each goal still waiting ends
        there, as PlannerClient ends its own (GoalRun.result: state failed, the reason)."""
        now = time.time()
        with self.lock:
            for goal in self.goals.values():
                if goal.accepted is not None and not goal.refused and goal.result_at is None:
                    goal.result_at, goal.state, goal.reason = now, "failed", reason

    # ------------------------------------------------------------------ reading
    def snapshot(self) -> dict[str, Goal]:
        with self.lock:
            return {t: Goal(**vars(g)) for t, g in self.goals.items()}

    def results(self, tasks: list[str]) -> int:
        with self.lock:
            return sum(1 for t in tasks
                       if self.goals[t].result_at is not None or self.goals[t].refused)

    def running(self, robot: str) -> bool:
        with self.lock:
            return self.started_at.get(robot, 0.0) > self.reported_at.get(robot, 0.0)

    def stopped_reports(self, task_id: str, since: float) -> list:
        """The task's reports of segments that ended unsuccessfully at or after `since`."""
        with self.lock:
            return [r for r in self.reports.get(task_id, [])
                    if not r.success and stamp_s(r.finished) >= since - 0.05]

    def diag_since(self, name: str, since: float):
        """(level, message, values) of node `name`'s diagnostics that arrived after `since`."""
        with self.lock:
            entry = self.diag.get(name)
        return entry[1:] if entry is not None and entry[0] > since else None


class Rig:
    """`executors`: robot ids of executor nodes; `fleet`: `robot_id:kind` entries of one fleet
    simulator; `netns_robot`: one more executor, behind a veth link.

    Arms run the timing-only `sim` backend (each call sleeps its modelled time): `arm-sim`
    tracks what the gripper holds, so a task stopped mid-pick would fail the robot's next task
    for a reason that is the scenario's, not the planner's."""

    def __init__(self, log_dir: Path, *, executors=(), fleet=(), time_scale: float = 0.5,
                 planner: dict | None = None, netns_robot: str | None = None, netns=None,
                 kinds: dict[str, str] | None = None):
        self.log_dir = log_dir
        self.executors = list(executors)
        self.fleet = list(fleet)
        self.netns_robot = netns_robot
        self.netns = netns
        self.time_scale = time_scale
        self.kinds = kinds or {}
        self.robots = [*self.executors, *([netns_robot] if netns_robot else []),
                       *(e.split(":")[0] for e in self.fleet)]
        self.planner_params = {"engine.kind": "sim",
                               "robots": [f"{r}:{self.kind(r)}" for r in self.robots],
                               **(planner or {})}
        self.group = None
        self.client = None
        self.observer: Observer | None = None

    def kind(self, robot: str) -> str:
        return self.kinds.get(robot) or robot.rsplit("_", 1)[0]

    # ------------------------------------------------------------------ processes
    def _specs(self):
        from timelyllm_ros.ros.launch_description import NodeSpec

        specs = [NodeSpec(name="planner", module="timelyllm_ros.ros.planner_node",
                          executable="planner_node", lifecycle=True,
                          parameters_file=REPO_ROOT / "config" / "planner.yaml",
                          parameters=self.planner_params)]
        specs += [self._executor_spec(r) for r in self.executors]
        if self.fleet:
            specs.append(NodeSpec(name="fleet_sim", module="timelyllm_ros.ros.fleet_sim_node",
                                  executable="fleet_sim_node",
                                  parameters={"robots": self.fleet, "time_scale": self.time_scale,
                                              "arm_backend": "sim"}))
        return specs

    def _executor_spec(self, robot: str):
        from timelyllm_ros.ros.launch_description import NodeSpec

        return NodeSpec(name="executor", namespace=robot, module="timelyllm_ros.ros.executor_node",
                        executable="executor_node",
                        parameters={"robot_id": robot, "time_scale": self.time_scale,
                                    "backend": "sim"})

    def start(self, say: Callable[[str], None]) -> "Rig":
        from timelyllm_ros.ros.client import PlannerClient
        from timelyllm_ros.ros.launch_runner import NodeGroup

        t0 = time.monotonic()
        if self.netns is not None:
            os.environ.update(self.netns.host_env())   # this process's DDS participant too
            self.netns.create()
            self.netns.start(self._executor_spec(self.netns_robot), {**os.environ, **node_env()},
                             self.log_dir / f"{self.netns_robot}__executor.log")
        self.group = NodeGroup(self._specs(), env=node_env(), log_dir=self.log_dir,
                               echo=False).start()
        self.client = PlannerClient(node_name="fault_runner", signal_handlers=False)
        self.observer = Observer(self.client.node, self.robots)
        self.client.planner_lost_listeners.append(self.observer.planner_lost)
        self.client.lifecycle.drive_to_active(300, alive=lambda: "planner" not in self.group.exited())
        if not self.client.wait_for_action(60):
            raise RuntimeError(f"no PlanTask action server; see {self.log_dir}/planner.log")
        self._wait_for_robots(120)
        say(f"{len(self.pids())} processes up in {time.monotonic() - t0:.1f} s "
            f"(logs in {self.log_dir})")
        return self

    def _wait_for_robots(self, timeout_s: float) -> None:
        """Every robot's action server and report publisher are matched by this client (a
        report published before that would be missed)."""
        from rclpy.action import get_action_names_and_types

        from timelyllm_ros.ros import topics

        node = self.client.node
        wanted = {topics.robot_topic(r, topics.EXECUTE_SEGMENT) for r in self.robots}

        def ready():
            names = {n for n, _ in get_action_names_and_types(node)}
            return wanted <= names and all(
                node.count_publishers(topics.robot_topic(r, topics.EXECUTION_REPORTS)) > 0
                for r in self.robots)

        if not wait_until(ready, timeout_s, 0.2):
            raise RuntimeError(f"robots not all discovered within {timeout_s:.0f} s: "
                               f"{sorted(wanted)}; see {self.log_dir}")

    def pids(self) -> dict[str, int]:
        pids = {label: p.pid for label, p in self.group.procs.items()}
        if self.netns is not None and self.netns.proc is not None:
            pids[f"{self.netns_robot}/executor"] = self.netns.proc.pid
        return pids

    def proc(self, label: str):
        if self.netns is not None and label == f"{self.netns_robot}/executor":
            return self.netns.proc
        return self.group.procs[label]

    def threads(self) -> dict[str, dict[str, int] | None]:
        return {label: threads_of(pid) for label, pid in self.pids().items()}

    def segment_clients(self) -> dict[str, int]:
        """Per robot: the clients of its execute_segment action (send_goal service) in the
        graph, i.e. the planner's (this runner has none): DDS endpoints are resources too."""
        return {r: self.client.node.count_clients(f"/{r}/execute_segment/_action/send_goal")
                for r in self.robots}

    def exit_codes(self) -> dict[str, int]:
        codes = {label: p.returncode for label, p in self.group.procs.items() if p.poll() is not None}
        netns_proc = self.netns.proc if self.netns is not None else None
        if netns_proc is not None and netns_proc.poll() is not None:
            codes[f"{self.netns_robot}/executor"] = netns_proc.returncode
        return codes

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.group is not None:
            self.group.stop()
        if self.netns is not None:
            self.netns.destroy()

    # ------------------------------------------------------------------ goals
    def send(self, task_id: str, robot: str, instruction: str, urgency: str = "normal") -> None:
        self.observer.send(self.client.plan_action, task_id, robot, instruction,
                           self.kind(robot), urgency)

    def set_param(self, name: str, value, node: str = "/planner"):
        """`ros2 param set`: the SetParameters result (successful, reason)."""
        from rcl_interfaces.srv import SetParameters
        from rclpy.parameter import Parameter

        srv = self.client.node.create_client(SetParameters, f"{node}/set_parameters")
        try:
            if not srv.wait_for_service(timeout_sec=10):
                raise RuntimeError(f"{node}/set_parameters: no service")
            future = srv.call_async(SetParameters.Request(
                parameters=[Parameter(name, value=value).to_parameter_msg()]))
            if not wait_until(future.done, 10):
                raise RuntimeError(f"{node}/set_parameters: no answer")
            return future.result().results[0]
        finally:
            self.client.node.destroy_client(srv)
