"""What the fault runner measures after a fault (experiments/faults.py), from what a Rig's
Observer recorded (experiments/fault_rig.py): the tasks' ends, who was told and when, which
robots stopped, and whether the planner and the robots came back to idle.

Every time is on this host's wall clock, in seconds after the fault (the nodes stamp their
messages with the same clock).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

from timelyllm_ros.experiments.fault_rig import POOL_THREAD, Rig, stamp_s, wait_until

PLANNER_DIAG = "timelyllm_ros: planner"
FLEET_DIAG = "timelyllm_ros: fleet simulator"


def executor_diag(robot: str) -> str:
    return f"timelyllm_ros: executor {robot}"


def reason_head(reason: str, width: int = 70) -> str:
    """A reason without the parts that differ per task (ids, sequence numbers, seconds)."""
    text = re.sub(r"\d+(\.\d+)?", "N", reason.strip())
    return text if len(text) <= width else text[: width - 3] + "..."


def start_in_flight(rig: Rig, prefix: str, robots: list[str], instruction: str,
                    timeout_s: float = 90.0) -> list[str]:
    """One PlanTask goal per robot; returns the task ids once every robot is executing one of
    its segments and the planner has dispatched at least two (so a later one waits on the robot
    or in the engine)."""
    tasks = {f"{prefix}-{robot}": robot for robot in robots}
    for task_id, robot in tasks.items():
        rig.send(task_id, robot, instruction)

    def all_running():
        goals = rig.observer.snapshot()
        return all(goals[t].dispatched >= 2 and rig.observer.running(r) for t, r in tasks.items())

    if not wait_until(all_running, timeout_s, 0.02):
        goals = rig.observer.snapshot()
        raise RuntimeError("goals never all in flight: " + ", ".join(
            f"{t} dispatched {goals[t].dispatched} running {rig.observer.running(r)} "
            f"{goals[t].state or ''}" for t, r in tasks.items()))
    return list(tasks)


def wait_terminal(rig: Rig, tasks: list[str], timeout_s: float, say=None) -> bool:
    """Until every task has its client's result and a terminal TaskStatus (or the timeout)."""
    def done():
        goals = rig.observer.snapshot()
        with rig.observer.lock:
            statuses = dict(rig.observer.terminal_status)
        return all((goals[t].result_at is not None or goals[t].refused) and t in statuses
                   for t in tasks)

    deadline = time.monotonic() + timeout_s
    next_say = time.monotonic() + 10
    while time.monotonic() < deadline:
        if done():
            return True
        if say is not None and time.monotonic() >= next_say:
            next_say += 10
            say(f"  ... {rig.observer.results(tasks)}/{len(tasks)} results so far")
        time.sleep(0.05)
    return done()


def outcomes(rig: Rig, tasks: list[str], fault_at: float, affected: list[str]) -> dict:
    """Per task: its state and reason, when its client was told, when the planner published
    it terminal; and the row's summary of them."""
    goals = rig.observer.snapshot()
    with rig.observer.lock:
        statuses = dict(rig.observer.terminal_status)
    per_task, counts = {}, Counter()
    for task_id in tasks:
        g = goals[task_id]
        status = statuses.get(task_id)
        told = None if g.result_at is None else round(g.result_at - fault_at, 3)
        published = None if status is None else round(status[2] - fault_at, 3)
        if g.state:
            state = g.state
        elif status is not None:
            # The planner ended it; its client never heard (a response or result was lost).
            state = status[0] + (" (its client never got the goal response)" if g.accepted is None
                                 else " (its client never got the result)")
        else:
            state = ("goal never answered" if g.accepted is None else
                     "goal refused" if g.refused else "no result")
        reason = g.reason or (status[1] if status else "")
        ends = [x for x in (told, published) if x is not None]
        per_task[task_id] = {"robot": g.robot, "state": state, "reason": reason,
                             "response_time_s": g.response_time_s, "utility": g.utility,
                             "told_after_s": told, "status_after_s": published,
                             "terminal_after_s": min(ends) if ends else None}
        counts[f"{state}: {reason_head(reason)}" if reason else state] += 1

    def latest(ids, key):
        values = [per_task[t][key] for t in ids]
        return None if not values or any(v is None for v in values) else max(values)

    told = [t for t in tasks if per_task[t]["told_after_s"] is not None]
    return {"tasks": per_task, "outcomes": dict(counts), "n_tasks": len(tasks),
            "all_terminal": all(per_task[t]["terminal_after_s"] is not None for t in tasks),
            "terminal_after_s": latest(tasks, "terminal_after_s"),
            "affected": affected,
            "affected_terminal_after_s": latest(affected, "terminal_after_s"),
            "clients_told": len(told),
            "clients_told_after_s": max((per_task[t]["told_after_s"] for t in told), default=None)}


def robots_stopped(rig: Rig, tasks: list[str], fault_at: float, wait_s: float,
                   logs: dict[str, Path] | None = None, needle: str = "gave no sign of life",
                   unreachable: tuple[str, ...] = ()) -> dict:
    """For each task's robot: when the segment it was running at the fault stopped (its
    ExecutionReport's `finished`) and the first words of why. With `logs` (robot -> its node's
    log), also when the robot noticed its planner was gone (the line containing `needle`; a
    fleet simulator logs it once for all its robots): for a robot whose segment had ended
    before it noticed, the proof that it noticed with nothing left to stop, and for one in
    `unreachable` (its reports cannot reach us), the only record of its stop."""
    goals = rig.observer.snapshot()
    logs = logs or {}

    def seen(task_id):
        robot = goals[task_id].robot
        reported = robot not in unreachable and bool(rig.observer.stopped_reports(task_id, fault_at))
        return reported or (robot in logs and log_event(logs[robot], needle, fault_at)[0] is not None)

    wait_until(lambda: all(seen(t) for t in tasks), wait_s, 0.1)
    if logs:
        time.sleep(0.5)   # a robot logs its notice before its stopped segment's report is out
    out = {}
    for task_id in tasks:
        robot = goals[task_id].robot
        entry = {"stopped_after_s": None, "how": "no stopped segment reported", "seen_in": ""}
        reports = rig.observer.stopped_reports(task_id, fault_at)
        if reports:
            first = min(reports, key=lambda r: stamp_s(r.finished))
            entry = {"stopped_after_s": round(stamp_s(first.finished) - fault_at, 3),
                     "how": reason_head(first.message, 60), "seen_in": "ExecutionReport"}
        if robot in logs:
            at, line = log_event(logs[robot], needle, fault_at)
            entry["noticed_after_s"] = None if at is None else round(at - fault_at, 3)
            entry["notice"] = line
            if at is not None and not reports:
                if robot not in unreachable or "no segment running" in line:
                    entry["how"] = "noticed; nothing running to stop"
                else:
                    entry.update(stopped_after_s=round(at - fault_at, 3),
                                 how=reason_head(line, 60), seen_in="the robot's log")
        out[robot] = entry
    return out


_LOG_LINE = re.compile(r"^\[(\w+)\] \[(\d+\.\d+)\] \[[^\]]*\]: (.*)$")


def log_event(path: Path, needle: str, since: float) -> tuple[float | None, str]:
    """(ROS log time, message) of the first line at or after `since` containing `needle`."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None, ""
    for line in lines:
        m = _LOG_LINE.match(line)
        if m and needle in m.group(3) and float(m.group(2)) >= since - 0.05:
            return float(m.group(2)), m.group(3)
    return None, ""


def compare_threads(before: dict[str, int] | None, after: dict[str, int] | None) -> dict:
    """Thread counts before and after, and whether they are the same: every named thread as
    many as before, except a thread pool's workers (POOL_THREAD), which start on first use up
    to the pool's size and so may have grown. `changed`: name -> [before, after]."""
    total = lambda names: None if names is None else sum(names.values())  # noqa: E731
    out = {"before": total(before), "after": total(after)}
    if before is None or after is None:
        return {**out, "same": False, "changed": {}}
    changed = {name: [before.get(name, 0), after.get(name, 0)]
               for name in sorted(set(before) | set(after))
               if before.get(name, 0) != after.get(name, 0)}
    pool_only = all(name == POOL_THREAD and b <= a for name, (b, a) in changed.items())
    return {**out, "same": not changed or pool_only, "changed": changed}


def check_idle(rig: Rig, baseline: dict, timeout_s: float = 30.0,
               expect_gone: tuple[str, ...] = ()) -> dict:
    """Wait (up to `timeout_s`) for fresh readings that show the planner idle (PlannerMetrics:
    queued 0, running 0, active_tasks 0, every KV block free; diagnostics:
    robot_goals_outstanding 0; as many ExecuteSegment action clients per robot as in
    `baseline`), every robot idle (diagnostics: no segment running or queued), and every
    process's threads back at `baseline` (compare_threads); a process in `expect_gone` (one
    the fault killed) must have exited instead. `baseline`: {"threads": Rig.threads(),
    "segment_clients": Rig.segment_clients()} from before the tasks."""
    since = time.time()
    rig.client.clear_metrics()
    deadline = time.monotonic() + timeout_s
    # An endpoint left behind stays; one on its way out is gone within a graph update: that
    # check is not waited for, only read again a second after the rest have settled.
    settling = lambda report: all(ok for k, ok in report["checks"].items()  # noqa: E731
                                  if k != "planner_action_clients")
    while True:
        report = _idle_reading(rig, baseline, since, expect_gone)
        if settling(report) and not report["idle"]:
            time.sleep(1.0)
            report = _idle_reading(rig, baseline, since, expect_gone)
        if settling(report) or time.monotonic() >= deadline:
            report["waited_s"] = round(time.time() - since, 2)
            return report
        time.sleep(0.25)


def _idle_reading(rig: Rig, baseline: dict, since: float, expect_gone) -> dict:
    codes = rig.exit_codes()
    now_threads = rig.threads()
    checks, planner, robots = {}, {}, {}
    if "planner" in codes:
        planner = {"exited": codes["planner"]}
        checks["planner"] = "planner" in expect_gone
    else:
        m = rig.client.latest_metrics()
        diag = rig.observer.diag_since(PLANNER_DIAG, since)
        values = diag[2] if diag else {}
        if m is not None:
            planner = {"queued": m.queued, "running": m.running, "active_tasks": m.active_tasks,
                       "kv_free_blocks": m.kv_free_blocks, "kv_total_blocks": m.kv_total_blocks}
        planner["robot_goals_outstanding"] = values.get("robot_goals_outstanding")
        planner["lifecycle_state"] = values.get("lifecycle_state")
        checks["planner_queue_kv"] = m is not None and not (m.queued or m.running or m.active_tasks) \
            and m.kv_free_blocks == m.kv_total_blocks
        checks["planner_goals"] = values.get("robot_goals_outstanding") == "0"
        clients = rig.segment_clients()
        planner["segment_clients"] = {"before": baseline["segment_clients"], "after": clients}
        checks["planner_action_clients"] = clients == baseline["segment_clients"]
    for robot in rig.robots:
        label = f"{robot}/executor"
        if robot in (e.split(":")[0] for e in rig.fleet):
            continue
        if label in codes:
            robots[robot] = {"exited": codes[label]}
            checks[f"{robot}_idle"] = label in expect_gone
            continue
        diag = rig.observer.diag_since(executor_diag(robot), since)
        values = diag[2] if diag else {}
        robots[robot] = {"segment_running": values.get("segment_running"),
                         "segments_queued": values.get("segments_queued"),
                         "planner_alive": values.get("planner_alive")}
        checks[f"{robot}_idle"] = values.get("segment_running") == "none" \
            and values.get("segments_queued") == "0"
    if rig.fleet:
        diag = rig.observer.diag_since(FLEET_DIAG, since)
        values = diag[2] if diag else {}
        robots["fleet_sim"] = {"robots_busy": values.get("robots_busy")}
        checks["fleet_idle"] = values.get("robots_busy") == "0"
    threads = {}
    for label, before in baseline["threads"].items():
        after = now_threads.get(label)
        threads[label] = compare_threads(before, after)
        if label in codes:
            checks[f"{label}_exited_as_expected"] = label in expect_gone
        elif label in expect_gone:
            checks[f"{label}_gone"] = False
        else:
            checks[f"{label}_threads"] = threads[label]["same"]
    return {"idle": all(checks.values()), "checks": checks, "planner": planner,
            "robots": robots, "threads": threads, "exited": codes}
