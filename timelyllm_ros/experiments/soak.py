"""A fleet soak over ROS: N simulated robots in one fleet-simulator process, the planner on the
wall-clock simulated engine, every task through the PlanTask action and every segment through
the robots' ExecuteSegment actions, for a fixed duration.

    timelyllm soak --robots 200 --duration-s 600 --out docs/soak      (`make soak`)

Each robot runs a closed loop, as a robot does: it sends a task (an LRTrace instruction of its
kind, 20 % urgent), waits for the task's PlanTask result, thinks for an exponential pause
(mean `think_s`) and sends the next one. When the duration is over no new task is sent; the
soak waits for every task to end, then for the planner's queue, engine and KV to be idle.

Measured (SoakResult, written as soak.json, soak.md and soak.png by experiments/soak_report.py):
- every task terminal with a reason, through its PlanTask result and its TaskStatus; none lost;
- the planner's RSS from /proc every second, and its growth after warm-up (target < 5 %);
- the planner's queue, running requests, active tasks and KV blocks back to idle at the end;
- the scheduler's time per pick (PlannerMetrics.fetch_overhead_ms) at this fleet size.
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from timelyllm_ros.ros_env import REPO_ROOT

URGENT_SHARE = 0.2
IDLE_WAIT_S = 60.0


@dataclass
class SoakConfig:
    robots: int = 200
    arm_share: float = 0.25
    duration_s: float = 600.0
    think_s: float = 10.0
    time_scale: float = 1.0
    warmup_s: float | None = None     # default: a fifth of the duration, at most 120 s
    drain_s: float = 300.0
    policy: str = ""                  # empty: the planner's default
    seed: int = 0
    log_dir: Path | None = None

    def __post_init__(self):
        if self.robots < 1:
            raise ValueError(f"robots: must be >= 1, got {self.robots}")
        if not 0 <= self.arm_share <= 1:
            raise ValueError(f"arm_share: must be in [0, 1], got {self.arm_share}")
        for name in ("duration_s", "time_scale", "drain_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.think_s < 0:
            raise ValueError(f"think_s: must be >= 0, got {self.think_s}")
        if self.warmup_s is None:
            self.warmup_s = min(120.0, self.duration_s / 5)

    @property
    def fleet(self) -> list[str]:
        from timelyllm_ros.ros.fleet_sim_node import fleet_robots

        arms = round(self.robots * self.arm_share)
        return fleet_robots(self.robots - arms, arms)


@dataclass
class Sample:
    t: float                  # seconds since the load started
    planner_rss_mb: float
    fleet_rss_mb: float
    submitted: int
    terminal: int
    queued: int = -1
    running: int = -1
    active_tasks: int = -1
    kv_used: int = -1
    planner_tasks_total: int = -1       # tasks the planner has seen (PlannerMetrics)
    fetch_overhead_ms: float = float("nan")


@dataclass
class SoakResult:
    config: SoakConfig
    samples: list[Sample] = field(default_factory=list)
    submitted: int = 0
    results: Counter = field(default_factory=Counter)        # PlanTask result state -> count
    results_by_kind: dict = field(default_factory=dict)      # robot kind -> Counter of states
    reasons: Counter = field(default_factory=Counter)        # non-done reason -> count
    lost: list[str] = field(default_factory=list)            # no PlanTask result
    lost_last_states: Counter = field(default_factory=Counter)  # their last TaskStatus state
    no_reason: list[str] = field(default_factory=list)       # terminal without a reason
    status_missing: list[str] = field(default_factory=list)  # no terminal TaskStatus
    utilities: list[float] = field(default_factory=list)
    responses_s: list[float] = field(default_factory=list)
    idle_at_end: dict = field(default_factory=dict)
    startup_s: float = 0.0
    load_s: float = 0.0
    drain_s: float = 0.0


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


class _FleetLoad:
    """The robots' closed loops, driven from one thread: PlanTask goals sent asynchronously,
    results collected in rclpy callbacks."""

    def __init__(self, client, config: SoakConfig, instructions: dict[str, list[str]]):
        from timelyllm_ros.action import PlanTask
        from timelyllm_ros.ros import topics
        from timelyllm_ros.ros.action_client import SpinSafeActionClient

        self._PlanTask = PlanTask
        # The client node is spinning already: see ros/action_client.py.
        self._action = SpinSafeActionClient(client.node, PlanTask, topics.PLAN_TASK, **topics.action_qos())
        self._client = client
        self._config = config
        self._instructions = instructions
        self._rng = random.Random(config.seed)
        self._lock = threading.Lock()
        self.outstanding: dict[str, str] = {}           # task -> robot
        self.results: dict[str, object] = {}            # task -> PlanTask.Result
        self.submitted = 0
        # robot -> monotonic time it sends its next task (None while it has one outstanding)
        self._next_at: dict[str, float | None] = {}

    def wait_for_server(self, timeout_s: float) -> bool:
        return self._action.wait_for_server(timeout_sec=timeout_s)

    def start(self, robots: list[str], now: float) -> None:
        # Stagger the first tasks over one think time, as a fleet does not start in lockstep.
        spread = max(self._config.think_s, 1.0)
        self._next_at = {r: now + self._rng.uniform(0, spread) for r in robots}

    def tick(self, now: float, sending: bool) -> None:
        due = []
        with self._lock:
            for robot, at in self._next_at.items():
                if sending and at is not None and at <= now:
                    self._next_at[robot] = None
                    due.append(robot)
        for robot in due:
            self._send(robot)

    @property
    def terminal(self) -> int:
        with self._lock:
            return len(self.results)

    def _send(self, robot: str) -> None:
        kind = robot.rsplit("_", 1)[0]
        task_id = f"soak-{self.submitted:06d}-{robot}"
        self.submitted += 1
        goal = self._PlanTask.Goal(task_id=task_id, robot_id=robot, skill_set=kind,
                                   instruction=self._rng.choice(self._instructions[kind]),
                                   urgency="urgent" if self._rng.random() < URGENT_SHARE else "normal")
        with self._lock:
            self.outstanding[task_id] = robot
        future = self._action.send_goal_async(goal)
        future.add_done_callback(lambda f, t=task_id: self._on_goal_response(t, f))

    def _on_goal_response(self, task_id: str, future) -> None:
        handle = future.result()
        if not handle.accepted:
            self._on_result(task_id, None)
            return
        handle.get_result_async().add_done_callback(
            lambda f, t=task_id: self._on_result(t, f.result().result))

    def _on_result(self, task_id: str, result) -> None:
        with self._lock:
            robot = self.outstanding.pop(task_id, None)
            self.results[task_id] = result
            if robot is not None:
                self._next_at[robot] = time.monotonic() + self._rng.expovariate(
                    1.0 / self._config.think_s) if self._config.think_s > 0 else time.monotonic()


def run_soak(config: SoakConfig, progress: Callable[[str, Sample], None] | None = None) -> SoakResult:
    """Start the planner and the fleet, run the load, drain, and measure. Raises RuntimeError
    when the nodes do not come up."""
    from timelyllm_ros.experiments.demo import isolate_ros_network

    isolate_ros_network()
    from timelyllm_ros.lrtrace.traces import load_traces
    from timelyllm_ros.ros.client import PlannerClient
    from timelyllm_ros.ros.launch_description import NodeSpec
    from timelyllm_ros.ros.launch_runner import NodeGroup

    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="timelyllm-soak-"))
    fleet = config.fleet
    instructions = soak_instructions(load_traces().values())
    planner_params = {"engine.kind": "sim", "robots": fleet}
    if config.policy:
        planner_params["policy"] = config.policy
    specs = [
        NodeSpec(name="planner", module="timelyllm_ros.ros.planner_node",
                 executable="planner_node", lifecycle=True,
                 parameters_file=REPO_ROOT / "config" / "planner.yaml", parameters=planner_params),
        NodeSpec(name="fleet_sim", module="timelyllm_ros.ros.fleet_sim_node",
                 executable="fleet_sim_node",
                 parameters={"robots": fleet, "time_scale": config.time_scale,
                             "seed": config.seed}),
    ]
    result = SoakResult(config)
    report = progress or (lambda phase, sample: None)
    t_start = time.monotonic()
    with NodeGroup(specs, log_dir=log_dir, echo=False) as group:
        client = PlannerClient(node_name="soak_client")
        try:
            alive = lambda: not group.exited()  # noqa: E731
            try:
                client.lifecycle.drive_to_active(600, alive=alive)
            except Exception as err:  # LifecycleError, or a planner that died meanwhile
                raise RuntimeError(f"the planner did not become active ({err}); exited: "
                                   f"{group.exited() or 'none'}; logs in {log_dir}") from None
            load = _FleetLoad(client, config, instructions)
            if not load.wait_for_server(60):
                raise RuntimeError(f"no PlanTask action server; see {log_dir}/planner.log")
            _wait_for_fleet(client, [e.split(":")[0] for e in fleet], 300, alive, log_dir)
            result.startup_s = time.monotonic() - t_start
            pids = {label: p.pid for label, p in group.procs.items()}
            t0 = time.monotonic()
            load.start([e.split(":")[0] for e in fleet], t0)
            next_sample = t0
            phase = "load"
            while True:
                now = time.monotonic()
                if group.exited():
                    raise RuntimeError(f"a node exited: {group.exited()}; see {log_dir}")
                if phase == "load" and now - t0 >= config.duration_s:
                    phase, t_drain = "drain", now
                    result.load_s = now - t0
                load.tick(now, sending=phase == "load")
                if now >= next_sample:
                    sample = _sample(client, load, pids, now - t0)
                    result.samples.append(sample)
                    report(phase, sample)
                    next_sample += 1.0
                if phase == "drain":
                    with load._lock:
                        pending = len(load.outstanding)
                    if pending == 0 or now - t_drain > config.drain_s:
                        break
                time.sleep(0.02)
            result.drain_s = time.monotonic() - t_drain
            result.idle_at_end = _wait_idle(client, IDLE_WAIT_S)
            report("idle", _sample(client, load, pids, time.monotonic() - t0))
            _collect(result, load, client)
        finally:
            client.close()
    return result


def soak_instructions(traces) -> dict[str, list[str]]:
    """Drone and arm instructions of the LRTrace traces whose plans fit their skill set's
    statement limit. A longer plan is cut at the limit (trace 11: 13 arm statements against
    12) and would leave the arm holding an object, so every later task of that arm would fail
    its first `pick`: true to the robot, but a finding about the trace, not about the soak."""
    from timelyllm_ros.core.skills.skillset import load_skillsets
    from timelyllm_ros.ros import share

    skill_sets = load_skillsets(share.config_dir() / "skillsets")
    out: dict[str, list[str]] = {"drone": [], "arm": []}
    for trace in traces:
        if trace.skill_set in out and _statements(trace.plan, skill_sets[trace.skill_set]) \
                <= skill_sets[trace.skill_set].max_statements:
            out[trace.skill_set].append(trace.instruction)
    return out


def _statements(plan: str, skill_set) -> int:
    language, consumed, count = skill_set.language, 0, 0
    while (end := language.next_boundary(plan, consumed)) is not None:
        consumed, count = end, count + 1
    tail = language.final_segment_end(plan, consumed)
    return count + (1 if tail is not None and plan[consumed:tail].strip() else 0)


def _wait_for_fleet(client, robots: list[str], timeout_s: float, alive, log_dir: Path) -> None:
    from timelyllm_ros.ros import topics

    wanted = {topics.robot_topic(r, topics.EXECUTE_SEGMENT) for r in robots}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        if wanted <= _action_names(client.node):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the fleet's action servers did not all appear; see {log_dir}/fleet_sim.log")


def _action_names(node) -> set[str]:
    from rclpy.action import get_action_names_and_types

    return {name for name, _ in get_action_names_and_types(node)}


def _sample(client, load: _FleetLoad, pids: dict[str, int], t: float) -> Sample:
    # (A soak's metrics history is not needed beyond the newest sample.)
    m = client.latest_metrics(keep_history=False)
    sample = Sample(t=round(t, 2), planner_rss_mb=_rss_mb(pids.get("planner", -1)),
                    fleet_rss_mb=_rss_mb(pids.get("fleet_sim", -1)),
                    submitted=load.submitted, terminal=load.terminal)
    if m is not None:
        sample.queued, sample.running, sample.active_tasks = m.queued, m.running, m.active_tasks
        sample.kv_used = m.kv_total_blocks - m.kv_free_blocks
        sample.planner_tasks_total = m.tasks_total
        sample.fetch_overhead_ms = m.fetch_overhead_ms
    return sample


def _wait_idle(client, timeout_s: float) -> dict:
    """Until the planner reports an empty queue, no running request, no active task and every
    KV block free (a fresh metrics sample after the last task ended)."""
    deadline = time.monotonic() + timeout_s
    client.clear_metrics()
    idle = {}
    while time.monotonic() < deadline:
        m = client.latest_metrics()
        if m is not None:
            idle = {"queued": m.queued, "running": m.running, "active_tasks": m.active_tasks,
                    "kv_used_blocks": m.kv_total_blocks - m.kv_free_blocks,
                    "kv_total_blocks": m.kv_total_blocks}
            if not (m.queued or m.running or m.active_tasks or idle["kv_used_blocks"]):
                idle["idle"] = True
                return idle
        time.sleep(0.5)
    idle["idle"] = False
    return idle


def _collect(result: SoakResult, load: _FleetLoad, client) -> None:
    result.submitted = load.submitted
    with load._lock:
        result.lost = sorted(load.outstanding)
        results = dict(load.results)
    for task_id in result.lost:
        status = client.last_status(task_id)
        result.lost_last_states[status.state if status is not None else "no status"] += 1
    for task_id, res in results.items():
        if res is None:
            result.results["refused"] += 1
            continue
        result.results[res.state] += 1
        kind = task_id.rsplit("-", 1)[-1].rsplit("_", 1)[0]
        result.results_by_kind.setdefault(kind, Counter())[res.state] += 1
        if res.state != "done":
            reason = res.reason.split(":")[0][:60] if res.reason else ""
            result.reasons[f"{res.state}: {reason}"] += 1
            if not res.reason:
                result.no_reason.append(task_id)
        if res.state in ("done", "failed"):
            result.utilities.append(res.utility)
            result.responses_s.append(res.response_time_s)
        status = client.last_status(task_id)
        if status is None or status.state != res.state:
            result.status_missing.append(task_id)
