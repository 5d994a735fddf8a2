"""The fault runner's scenarios, one function per row (experiments/faults.py runs each in a
process of its own, on a ROS domain of its own).

Rows 1-5 share one set-up: the planner on the wall-clock simulated engine; four arms, two as
executor nodes (arm_1, arm_2) and two in a fleet simulator (arm_3, arm_4), at time scale 1 (a
pick or place takes its modelled 4 s, a check 1 s); one PlanTask goal per arm with LRTrace
trace 9 (object stacking, 11 statements, about 30 s). Before the tasks a warm-up task per
robot (cancelled) and the baseline; the fault comes once every arm is executing a segment and
the planner has dispatched at least two per task. Robots keep their default
`planner_lost_after_s` (4 s), the planner its defaults from config/planner.yaml.

Each function returns the row as a dict of plain values (JSON).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable

from timelyllm_ros.experiments.fault_measure import (check_idle, outcomes, robots_stopped,
                                                     start_in_flight, wait_terminal)
from timelyllm_ros.experiments.fault_rig import Rig, wait_until

Say = Callable[[str], None]
ARMS = ["arm_1", "arm_2", "arm_3", "arm_4"]
SCALE = 1.0            # robots take their modelled times: a pick or place 4 s, a check 1 s
LOST_S = 4.0            # the robots' planner_lost_after_s (its default)
TERMINAL_WAIT_S = 120.0  # a fault whose tasks are not all terminal by then is reported so


def _arm_plan() -> str:
    from timelyllm_ros.lrtrace.traces import load_traces

    return load_traces()[9].instruction


def _arm_rig(log_dir: Path, **kw) -> Rig:
    kw.setdefault("executors", ["arm_1", "arm_2"])
    return Rig(log_dir, fleet=["arm_3:arm", "arm_4:arm"], time_scale=SCALE, **kw)


def warm_up(rig: Rig, say: Say, timeout_s: float = 90.0) -> dict:
    """A task on every robot, cancelled once each robot runs its first segment; then the
    threads of every process, the baseline "back to idle" is measured against: whatever a
    process starts once, on its first task or its first cancel (the same stop paths a fault
    takes), is there before the fault's tasks start."""
    tasks = {f"warmup-{robot}": robot for robot in rig.robots}
    for task_id, robot in tasks.items():
        rig.send(task_id, robot, "put the box on the table")
    if not wait_until(lambda: all(rig.observer.running(r) for r in tasks.values()), timeout_s, 0.05):
        raise RuntimeError("warm-up: not every robot started a segment within "
                           f"{timeout_s:.0f} s; see {rig.log_dir}")
    for task_id in tasks:
        rig.client.cancel_task(task_id, "warm-up")
    if not wait_terminal(rig, list(tasks), 30):
        raise RuntimeError("warm-up tasks did not end within 30 s of their cancel")
    time.sleep(1.0)
    baseline = {"threads": rig.threads(), "segment_clients": rig.segment_clients()}
    say("warm-up done; threads now (the baseline): " + ", ".join(
        f"{label} {sum(names.values())}" for label, names in baseline["threads"].items() if names))
    return baseline


def _prepare(rig: Rig, say: Say, prefix: str) -> tuple[dict, list[str]]:
    rig.start(say)
    baseline = warm_up(rig, say)
    tasks = start_in_flight(rig, prefix, rig.robots, _arm_plan())
    say(f"{len(tasks)} goals in flight, every arm inside a segment")
    return baseline, tasks


def _robot_logs(rig: Rig) -> dict[str, Path]:
    fleet = {e.split(":")[0] for e in rig.fleet}
    return {r: rig.log_dir / ("fleet_sim.log" if r in fleet else f"{r}__executor.log")
            for r in rig.robots}


def _drain(rig: Rig, tasks: list[str], say: Say, limit_s: float = 900.0,
           quiet_s: float = 30.0) -> None:
    """Until every task has its result and its terminal TaskStatus, or the planner has been
    idle (no active or queued task) with nothing new arriving for `quiet_s`: a goal or result
    the action layer lost never comes, and waiting on does not change the row."""
    deadline = time.monotonic() + limit_s
    last, changed_at, next_say = -1, time.monotonic(), time.monotonic() + 10
    while time.monotonic() < deadline:
        if wait_terminal(rig, tasks, 0.5):
            return
        with rig.observer.lock:
            seen = len(rig.observer.terminal_status)
        n = rig.observer.results(tasks) + seen
        if n != last:
            last, changed_at = n, time.monotonic()
        m = rig.client.latest_metrics()
        fresh = m is not None and time.time() - (m.stamp.sec + m.stamp.nanosec * 1e-9) < 3
        if fresh and not (m.active_tasks or m.queued) and time.monotonic() - changed_at > quiet_s:
            say(f"  the planner is idle and nothing new came for {quiet_s:.0f} s: "
                f"{rig.observer.results(tasks)}/{len(tasks)} results")
            return
        if time.monotonic() >= next_say:
            next_say += 10
            say(f"  ... {rig.observer.results(tasks)}/{len(tasks)} results so far")


def _served(tasks) -> dict:
    """How the planner served the tasks it took: first-segment response times (median, 99th
    percentile) and utilities (mean, how many at or below zero)."""
    import numpy as np

    responses = [t["response_time_s"] for t in tasks if t["response_time_s"] is not None]
    utilities = [t["utility"] for t in tasks if t["utility"] is not None]
    out = {"served": len(responses)}
    if responses:
        out.update(response_p50_s=round(float(np.percentile(responses, 50)), 3),
                   response_p99_s=round(float(np.percentile(responses, 99)), 3))
    if utilities:
        out.update(mean_utility=round(float(np.mean(utilities)), 3),
                   utility_at_most_zero=sum(1 for u in utilities if u <= 0))
    return out


class _GraphWatch:
    """When the ROS graph stops listing a service (DDS dropped the participant that served
    it), polled on a thread of its own from `since` for up to `limit_s`."""

    def __init__(self, rig: Rig, service: str, since: float, limit_s: float = 90.0):
        import threading

        self.gone_at: float | None = None
        self._since = since

        def poll():
            while time.time() - since < limit_s and self.gone_at is None:
                if rig.client.node.count_services(service) == 0:
                    self.gone_at = time.time()
                time.sleep(0.2)

        self._thread = threading.Thread(target=poll, name="graph-watch", daemon=True)
        self._thread.start()

    def result(self) -> float | None:
        self._thread.join()
        return None if self.gone_at is None else round(self.gone_at - self._since, 2)


def _fresh_task(rig: Rig, robot: str, say: Say, timeout_s: float = 90.0) -> dict:
    """A new task after the fault: is the system serving again?"""
    task_id = f"after-{robot}"
    t0 = time.time()
    rig.send(task_id, robot, "put the box on the table")   # sim engine: pick, then place
    wait_until(lambda: rig.observer.snapshot()[task_id].result_at is not None, timeout_s, 0.1)
    g = rig.observer.snapshot()[task_id]
    out = {"robot": robot, "state": g.state or "no result", "reason": g.reason,
           "after_s": None if g.result_at is None else round(g.result_at - t0, 2)}
    say(f"a fresh task on {robot}: {out['state']} {out['reason'][:80]}")
    return out


# ---------------------------------------------------------------------- rows
def planner_sigterm(log_dir: Path, say: Say) -> dict:
    rig = _arm_rig(log_dir)
    try:
        baseline, tasks = _prepare(rig, say, "term")
        planner = rig.proc("planner")
        fault_at = time.time()
        os.kill(planner.pid, signal.SIGTERM)
        say("fault: SIGTERM to the planner")
        wait_terminal(rig, tasks, 10)
        planner.wait(15)
        exit_s = round(time.time() - fault_at, 2)
        row = outcomes(rig, tasks, fault_at, tasks)
        row["robots"] = robots_stopped(rig, tasks, fault_at, 5)
        row["idle"] = check_idle(rig, baseline, expect_gone=("planner",))
        row["planner_exit"] = {"code": planner.returncode, "after_s": exit_s}
        return row
    finally:
        rig.stop()


def planner_sigkill(log_dir: Path, say: Say) -> dict:
    rig = _arm_rig(log_dir)
    try:
        baseline, tasks = _prepare(rig, say, "kill")
        planner = rig.proc("planner")
        fault_at = time.time()
        os.killpg(planner.pid, signal.SIGKILL)
        say(f"fault: SIGKILL to the planner; robots should stop after {LOST_S:g} s")
        planner.wait(10)
        # The dead planner answers no client: each client's own liveliness watch ends its
        # goals "planner lost" after LOST_S (PlannerClient). Wait that and as long again.
        client_wait_s = 2 * LOST_S + 5
        wait_terminal(rig, tasks, client_wait_s)
        row = outcomes(rig, tasks, fault_at, tasks)
        row["client_wait_s"] = client_wait_s
        row["robots"] = robots_stopped(rig, tasks, fault_at, 5, logs=_robot_logs(rig))
        row["idle"] = check_idle(rig, baseline, expect_gone=("planner",))
        row["planner_exit"] = {"code": planner.returncode}
        return row
    finally:
        rig.stop()


def engine_exception(log_dir: Path, say: Say) -> dict:
    rig = _arm_rig(log_dir, planner={"restart_engine": 1, "restart_backoff_s": 0.5})
    try:
        baseline, tasks = _prepare(rig, say, "engine")
        fault_at = time.time()
        answer = rig.set_param("engine.inject_fault", "step")
        if not answer.successful:
            raise RuntimeError(f"engine.inject_fault refused: {answer.reason}")
        say("fault: engine.inject_fault=step (the engine's next step raises); restart_engine=1")
        wait_terminal(rig, tasks, 15)
        row = outcomes(rig, tasks, fault_at, tasks)
        row["robots"] = robots_stopped(rig, tasks, fault_at, 5)
        # restart_engine: ErrorProcessing -> unconfigured -> configure -> active.
        saw_down = wait_until(lambda: rig.client.lifecycle.state(5) != "active", 10, 0.1)
        back = wait_until(lambda: rig.client.lifecycle.state(5) == "active", 90, 0.2)
        row["recovered"] = {"left_active": saw_down, "active_again": back,
                            "after_s": round(time.time() - fault_at, 2) if back else None}
        say(f"planner active again: {back} ({row['recovered']['after_s']} s after the fault)")
        row["idle"] = check_idle(rig, baseline)
        row["fresh_task"] = _fresh_task(rig, "arm_1", say)
        return row
    finally:
        rig.stop()


def executor_sigkill(log_dir: Path, say: Say) -> dict:
    rig = _arm_rig(log_dir)
    try:
        baseline, tasks = _prepare(rig, say, "robot")
        victim = "arm_1/executor"
        fault_at = time.time()
        os.killpg(rig.proc(victim).pid, signal.SIGKILL)
        say("fault: SIGKILL to arm_1's executor node; the other arms go on")
        graph = _GraphWatch(rig, "/arm_1/execute_segment/_action/send_goal", fault_at)
        wait_terminal(rig, tasks, TERMINAL_WAIT_S, say)
        affected = [t for t in tasks if t.endswith("-arm_1")]
        row = outcomes(rig, tasks, fault_at, affected)
        row["robots"] = {"arm_1": {"stopped_after_s": 0.0, "how": "process killed",
                                   "seen_in": "SIGKILL"}}
        row["idle"] = check_idle(rig, baseline, expect_gone=(victim,))
        row["graph_forgot_after_s"] = graph.result()
        say(f"the ROS graph dropped arm_1's action server {row['graph_forgot_after_s']} s after "
            "the kill (its DDS participant's lease)")
        return row
    finally:
        rig.stop()


def dds_disconnect(log_dir: Path, say: Say) -> dict:
    from timelyllm_ros.experiments.fault_netns import RobotNamespace, available

    why_not = available()
    if why_not:
        raise RuntimeError(f"cannot cut a link here: {why_not}")
    domain = int(os.environ.get("ROS_DOMAIN_ID", "0"))
    netns = RobotNamespace(f"{domain}x{os.getpid() % 1000}", domain)
    rig = _arm_rig(log_dir, executors=["arm_2"], netns_robot="arm_1", netns=netns)
    try:
        baseline, tasks = _prepare(rig, say, "link")
        say(f"arm_1 runs in network namespace {netns.ns} ({netns.ns_addr}); host end "
            f"{netns.host_if} ({netns.host_addr}); every process on UDPv4 only")
        fault_at = time.time()
        netns.cut()
        say(f"fault: link to arm_1 cut ({netns.host_if} down)")
        graph = _GraphWatch(rig, "/arm_1/execute_segment/_action/send_goal", fault_at, 60)
        wait_terminal(rig, tasks, TERMINAL_WAIT_S, say)
        affected = [t for t in tasks if t.endswith("-arm_1")]
        row = outcomes(rig, tasks, fault_at, affected)
        log = log_dir / "arm_1__executor.log"
        row["robots"] = robots_stopped(rig, affected, fault_at, LOST_S + 5, logs={"arm_1": log},
                                       unreachable=("arm_1",))
        # The cut stays until every task has ended and the graph has dropped the robot (its
        # DDS participant's lease), or a minute: what a robot out of range for that long sees.
        row["graph_forgot_after_s"] = graph.result()
        say(f"the planner's side dropped arm_1 from the ROS graph {row['graph_forgot_after_s']} s "
            "after the cut")
        cut_s = time.time() - fault_at
        netns.restore()
        restored_at = time.time()
        say(f"link restored after {cut_s:.1f} s")
        rejoined = wait_until(lambda: (rig.observer.diag_since(
            "timelyllm_ros: executor arm_1", restored_at) or (0, "", {}))[2].get(
                "planner_alive") == "true", 90, 0.2)
        row["link"] = {"cut_for_s": round(cut_s, 1), "robot_back": rejoined,
                       "robot_back_after_s": round(time.time() - restored_at, 2) if rejoined else None}
        row["idle"] = check_idle(rig, baseline)
        row["fresh_task"] = _fresh_task(rig, "arm_1", say)
        return row
    finally:
        rig.stop()


def deep_overload_paced(log_dir: Path, say: Say) -> dict:
    """The same goals at 100 a second (2.4 s): slow enough that the action layer loses none
    (sent at once, about half are lost before the planner sees them: the burst row), still
    more than the planner serves in time."""
    return deep_overload(log_dir, say, rate_per_s=100.0)


def deep_overload(log_dir: Path, say: Say, goals: int = 240, drones: int = 30,
                  arms: int = 10, rate_per_s: float | None = None) -> dict:
    """`goals` PlanTask goals sent at once (or `rate_per_s` a second) to a fleet simulator of
    drones + arms (robot time scale 1: modelled durations as they are): LRTrace instructions
    of each robot's kind (as the soak draws them), a fifth urgent, robots in turn."""
    import random

    from timelyllm_ros.experiments.soak import soak_instructions
    from timelyllm_ros.lrtrace.traces import load_traces
    from timelyllm_ros.ros.fleet_sim_node import fleet_robots

    fleet = fleet_robots(drones, arms)
    rig = Rig(log_dir, fleet=fleet, time_scale=1.0)
    rng = random.Random(0)
    instructions = soak_instructions(load_traces().values())
    try:
        rig.start(say)
        baseline = warm_up(rig, say, 300)
        wait_until(lambda: rig.client.latest_metrics() is not None, 10)
        total_before = rig.client.latest_metrics().tasks_total   # the warm-up's tasks
        robots = [e.split(":")[0] for e in fleet]
        tasks = []
        burst_at = time.time()
        for i in range(goals):
            if rate_per_s:
                time.sleep(max(0.0, burst_at + i / rate_per_s - time.time()))
            robot = robots[i % len(robots)]
            task_id = f"burst-{i:04d}-{robot}"
            rig.send(task_id, robot, rng.choice(instructions[rig.kind(robot)]),
                     "urgent" if rng.random() < 0.2 else "normal")
            tasks.append(task_id)
        sent_s = time.time() - burst_at
        # A goal request the action layer lost is never answered: give them a minute.
        wait_until(lambda: all(rig.observer.snapshot()[t].accepted for t in tasks), 60, 0.05)
        goals_now = rig.observer.snapshot()
        answered = [t for t in tasks if goals_now[t].accepted is not None]
        last_at = max(goals_now[t].accepted for t in answered)
        say(f"{goals} goals sent on {len(robots)} robots in {sent_s:.2f} s; {len(answered)} "
            f"answered, the last {last_at - burst_at:.2f} s after the first")
        _drain(rig, tasks, say)
        row = outcomes(rig, tasks, last_at, tasks)
        row["burst"] = {"goals": goals, "robots": len(robots), "drones": drones, "arms": arms,
                        "rate_per_s": rate_per_s,
                        "sent_within_s": round(sent_s, 3), "answered": len(answered),
                        "answered_within_s": round(last_at - burst_at, 2),
                        "unanswered": [t for t in tasks if t not in answered]}
        row["burst"].update(_served(row["tasks"].values()))
        metrics = rig.client.latest_metrics()
        row["burst"]["planner_took"] = metrics.tasks_total - total_before if metrics else None
        if len(answered) < goals:
            say(f"{goals - len(answered)} goals never answered (lost before the planner took "
                "them): their clients wait for ever")
        row["robots"] = {}
        row["idle"] = check_idle(rig, baseline, 60)
        return row
    finally:
        rig.stop()
