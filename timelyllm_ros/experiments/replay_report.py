"""The results of an LRTrace replay over ROS, read from the bag it recorded: the bench's results
document (bench/metrics.py: response time, utility and waiting time per task type) plus a
`replay` block (ROS latencies measured in the bag, robot back-ends, fallbacks), and the summary
lines printed under the bench's table."""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.metrics import results_json
from timelyllm_ros.bench.results import (RunResult, SegmentResult, TaskResult, task_type,
                                         workload_block)
from timelyllm_ros.experiments.replay_nodes import REPORT_TIMEOUT_MIN_S
from timelyllm_ros.experiments.replay_plan import ReplayError, ReplayOptions, ReplayPlan
from timelyllm_ros.lrtrace import bag as bagmod
from timelyllm_ros.lrtrace import message_types as msgtypes
from timelyllm_ros.robots.replay import FALLBACK_PREFIX, REPLAYED_PREFIX

TERMINAL = ("done", "failed", "rejected", "cancelled")
# With attach, the running planner's settings apply: the replay cannot know them.
_PLANNER_OWN_SETTINGS = ("batch_cap", "segmented_batch_cap", "report_timeout_min_s", "profile",
                         "model", "prompt_tokens", "resume_lead_s", "gen_time_s",
                         "baseline_prefix_cache")


@dataclass
class ReplayReport:
    doc: dict[str, Any]  # the bench's JSON document plus `replay`
    summary: list[str]  # lines for stdout, after the table
    warnings: list[str]  # for stderr


@dataclass
class _Recorded:
    """The replay's messages in the bag, per task (the first of each segment / report, the last
    status: bag order is arrival order), and the publish -> record latency per message kind."""

    statuses: dict[str, dict] = field(default_factory=dict)
    goals: dict[str, dict] = field(default_factory=dict)
    segments: dict[str, dict[int, dict]] = field(default_factory=lambda: defaultdict(dict))
    reports: dict[str, dict[int, dict]] = field(default_factory=lambda: defaultdict(dict))
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


def _stats_ms(values: list[float]) -> dict[str, Any]:
    arr = np.asarray([v for v in values if math.isfinite(v)], dtype=float) * 1e3
    if not arr.size:
        return {"n": 0, "median_ms": None, "p99_ms": None, "max_ms": None}
    return {"n": int(arr.size), "median_ms": float(np.median(arr)),
            "p99_ms": float(np.percentile(arr, 99)), "max_ms": float(arr.max())}


def robot_blocked_s(segments: dict[str, dict[int, dict]], reports: dict[str, dict[int, dict]],
                    robot_of: Callable[[str], str]) -> dict[str, float]:
    """Per task: time its segments were ready but their robot was executing another task's
    segment (the bench's `robot_blocked_s`, measured instead of modelled).

    A segment is ready when it was published (its stamp) and the task's previous segment has
    finished; the blocked part is the overlap of [ready, started] with the other tasks'
    executions on the same robot (one executor runs one segment at a time)."""
    busy: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for task_id, reps in reports.items():
        for rep in reps.values():
            busy[robot_of(task_id)].append((msgtypes.stamp_s(rep["started"]),
                                            msgtypes.stamp_s(rep["finished"]), task_id))
    out: dict[str, float] = {}
    for task_id, reps in reports.items():
        blocked = 0.0
        prev_finish = -math.inf
        others = [(a, b) for a, b, t in busy[robot_of(task_id)] if t != task_id]
        for seq in sorted(reps):
            rep = reps[seq]
            started, finished = msgtypes.stamp_s(rep["started"]), msgtypes.stamp_s(rep["finished"])
            seg = segments.get(task_id, {}).get(seq)
            published = msgtypes.stamp_s(seg["stamp"]) if seg is not None else started
            ready = max(published, prev_finish)
            if started > ready:
                blocked += sum(max(0.0, min(b, started) - max(a, ready)) for a, b in others)
            prev_finish = max(prev_finish, finished)
        out[task_id] = blocked
    return out


def _read(contents: bagmod.BagContents, ours: set[str]) -> _Recorded:
    rec = _Recorded()
    for m in contents.messages:
        d = msgtypes.to_dict(m.msg)
        log_s = m.timestamp_ns * 1e-9
        if m.msgtype == msgtypes.STATUS_TYPE:
            if d["task_id"] in ours:
                rec.statuses[d["task_id"]] = d  # bag order = arrival order: the last one wins
            rec.latency["status"].append(log_s - msgtypes.stamp_s(d["stamp"]))
        elif m.msgtype == msgtypes.GOAL_TYPE:
            rec.goals.setdefault(d["task_id"], d)
            rec.latency["goal"].append(log_s - msgtypes.stamp_s(d["stamp"]))
        elif m.msgtype == msgtypes.SEGMENT_TYPE:
            rec.segments[d["task_id"]].setdefault(int(d["sequence"]), d)
            rec.latency["segment"].append(log_s - msgtypes.stamp_s(d["stamp"]))
        elif m.msgtype == msgtypes.REPORT_TYPE:
            rec.reports[d["task_id"]].setdefault(int(d["sequence"]), d)
            rec.latency["report"].append(log_s - msgtypes.stamp_s(d["finished"]))
    return rec


def _take_missing_ends_from_client(rec: _Recorded, client_status: dict) -> int:
    """Terminal statuses the client saw and the recorder did not keep: use the client's, and
    say how many (the caller warns)."""
    taken = 0
    for task_id, msg in client_status.items():
        last = rec.statuses.get(task_id)
        if msg is not None and msg.state in TERMINAL and (last is None
                                                          or last["state"] not in TERMINAL):
            rec.statuses[task_id] = {"state": msg.state, "reason": msg.reason,
                                     "response_time_s": msg.response_time_s,
                                     "utility": msg.utility,
                                     "waiting_time_s": msg.waiting_time_s, "resumes": msg.resumes}
            taken += 1
    return taken


def _task_results(plan: ReplayPlan, rec: _Recorded, t0_wall: float) -> list[TaskResult]:
    robots = {t.task_id: t.robot_id for t in plan.tasks}
    blocked = robot_blocked_s(rec.segments, rec.reports, lambda tid: robots.get(tid, "?"))
    tasks = []
    for t in plan.tasks:
        st = rec.statuses.get(t.task_id)
        state = st["state"] if st else "no status"
        done = state == "done"
        reps = rec.reports.get(t.task_id, {})
        execution = sum(msgtypes.stamp_s(r["finished"]) - msgtypes.stamp_s(r["started"])
                        for r in reps.values()) if reps else math.nan
        completion = (max(msgtypes.stamp_s(r["finished"]) for r in reps.values()) - t0_wall) \
            if (reps and done) else math.nan
        sched_wait = float(st["waiting_time_s"]) if (st and done) else math.nan
        segs = []
        for seq, seg in sorted(rec.segments.get(t.task_id, {}).items()):
            rep = reps.get(seq)
            segs.append(SegmentResult(
                seq, seg["text"], bool(seg["is_last"]), msgtypes.stamp_s(seg["stamp"]) - t0_wall,
                msgtypes.stamp_s(rep["started"]) - t0_wall if rep else math.nan,
                msgtypes.stamp_s(rep["finished"]) - t0_wall if rep else math.nan))
        b = blocked.get(t.task_id, 0.0)
        tasks.append(TaskResult(
            task_id=t.task_id, trace_id=t.trace.trace_id, category=t.trace.category,
            tuf_level=t.tuf_level, task_type=task_type(t.trace.category, t.tuf_level),
            robot_id=t.robot_id, arrival_s=t.published_wall - t0_wall, ert_s=t.ert_s,
            state=state, reason=(st or {}).get("reason", "") or "",
            response_time_s=float(st["response_time_s"]) if st else math.nan,
            utility=float(st["utility"]) if st else math.nan,
            waiting_time_s=sched_wait - b if done else math.nan,
            sched_waiting_time_s=sched_wait, robot_blocked_s=b, execution_s=execution,
            completion_s=completion, resumes=int((st or {}).get("resumes", 0) or 0),
            event_id=t.event_id, segments=segs))
    return tasks


def replay_report(options: ReplayOptions, plan: ReplayPlan, bag_path: Path, t0_wall: float,
                  metrics: list, client_status: dict, *, startup_s: float,
                  wall_s: float) -> ReplayReport:
    """The report of a finished replay. `metrics`: the PlannerMetrics messages the client saw;
    `client_status`: each task's last status as the client saw it (None: none)."""
    try:
        contents = bagmod.read_messages(bag_path)
    except bagmod.BagError as err:
        raise ReplayError(f"reading the recorded bag: {err}") from None
    ours = {t.task_id for t in plan.tasks}
    rec = _read(contents, ours)
    from_client = _take_missing_ends_from_client(rec, client_status)
    tasks = _task_results(plan, rec, t0_wall)

    policy = plan.policy
    engine = plan.engine
    if options.attach:
        policy = next((m.policy for m in reversed(metrics) if m.policy), "attached")
        engine = "vllm" if any(m.engine and not m.engine.startswith("sim") for m in metrics) \
            else "sim"
    overhead = [m.fetch_overhead_ms * 1e-3 for m in metrics if m.fetch_overhead_ms > 0]
    ends = [msgtypes.stamp_s(s["stamp"]) - t0_wall for s in rec.statuses.values()
            if s.get("state") in TERMINAL and "stamp" in s]
    config = BenchConfig(engine=engine, profile=options.profile if not options.attach else None,
                         model=options.model, seed=plan.seed, prompt_tokens=None,
                         report_timeout_min_s=REPORT_TIMEOUT_MIN_S)
    run = RunResult(policy=policy, tasks=tasks, fetch_overhead_s=overhead, steps=0,
                    clock_s=max(ends, default=math.nan), wall_s=wall_s,
                    config={"policy_batch_cap": None})
    block = workload_block(plan.workload, plan.events, config, {policy: run}, plan.seed)
    bench = block["bench"]
    bench.update(robots="ros-executors", transport="ros2")
    if options.attach:
        for key in _PLANNER_OWN_SETTINGS:
            bench[key] = "planner's own"
    block["wall_clock_s"] = block.pop("virtual_clock_s")
    doc = results_json({policy: run}, block)

    messages = [r.get("message", "") for reps in rec.reports.values() for r in reps.values()]
    fallbacks = sum(1 for msg in messages if msg.startswith(FALLBACK_PREFIX))
    replayed = sum(1 for msg in messages if msg.startswith(REPLAYED_PREFIX))
    states = Counter(t.state for t in tasks)
    doc["replay"] = {
        "transport": "ros2",
        "ros_domain_id": os.environ.get("ROS_DOMAIN_ID", "0"),
        "rmw_implementation": os.environ.get("RMW_IMPLEMENTATION", ""),
        "attach": bool(options.attach),
        "bag": str(contents.path) if plan.bag_output is not None else None,
        "bag_messages": {topic: n for topic, (_, n) in sorted(contents.topics.items())},
        "goals_recorded": sum(1 for g in rec.goals if g in ours),
        "states": dict(states),
        "statuses_from_client": from_client,
        "robots": {"count": len(plan.robots), "started": not options.no_robots,
                   "backend": "replay" if plan.durations_table is not None else "sim",
                   "time_scale": options.time_scale,
                   "exec_model": str(plan.exec_model) if plan.exec_model
                   else "config/exec_model.yaml",
                   "durations_from": plan.durations_source,
                   "replayed_segments": replayed, "fallback_segments": fallbacks},
        "robot_blocked_s_total": float(sum(t.robot_blocked_s for t in tasks)),
        "tasks_robot_blocked": sum(1 for t in tasks if t.robot_blocked_s > 0),
        "planner_network_latency_s": None if options.attach
        else float(plan.workload.network_latency_s),
        # publish (message stamp) -> recorder callback, one clock: ROS transport + recorder delay
        "ros_latency_ms": {k: _stats_ms(v) for k, v in sorted(rec.latency.items())},
        "startup_s": startup_s,
        "wall_s": wall_s,
    }
    summary = _summary(doc["replay"], tasks, states, plan, replayed, fallbacks)
    warnings = []
    if fallbacks:
        warnings.append(f"{fallbacks} segment(s) were never recorded in {plan.durations_source}; "
                        "their durations came from the execution-time model")
    if from_client:
        warnings.append(f"{from_client} terminal status(es) missing from the bag; taken from the "
                        "client")
    bad = [t for t in tasks if t.state != "done"]
    if bad:
        warnings.append(f"{len(bad)} task(s) did not finish: "
                        + "; ".join(f"{t.task_id} {t.state}" + (f" ({t.reason})" if t.reason
                                                                 else "")
                                    for t in bad[:3]))
    return ReplayReport(doc, summary, warnings)


def _summary(replay: dict[str, Any], tasks: list[TaskResult], states: Counter, plan: ReplayPlan,
             replayed: int, fallbacks: int) -> list[str]:
    summary = [f"replay over ROS 2 (domain {replay['ros_domain_id']}): {len(tasks)} tasks: "
               + ", ".join(f"{n} {s}" for s, n in states.most_common())
               + f"; {replay['goals_recorded']} goals and "
               + f"{sum(replay['bag_messages'].values())} messages recorded"]
    lat = replay["ros_latency_ms"]
    parts = [f"{k} {v['median_ms']:.1f}/{v['p99_ms']:.1f}" for k, v in lat.items() if v["n"]]
    if parts:
        summary.append("ROS one-way latency, publish -> recorder, median/p99 ms: "
                       + ", ".join(parts))
    if replay["tasks_robot_blocked"]:
        summary.append(f"robots busy with other tasks: {replay['tasks_robot_blocked']} "
                       f"tasks waited {replay['robot_blocked_s_total']:.2f} s in all "
                       "(not counted as waiting time, as in the bench)")
    if plan.durations_table is not None:
        summary.append(f"durations: {replayed} segments replayed, {fallbacks} drawn from the "
                       "execution-time model (never recorded)")
    return summary
