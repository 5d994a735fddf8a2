"""A finished replay's outcome, read off its scheduler: each task's `TaskResult`, and what the
planner still holds (`end_state`, also named in a stuck run's error) and how its suspensions
held their KV (`pause_summary`).

Separate from bench/replay.py, which drives the scheduler through the events: this reads only
the scheduler's task records and the engine's state once they are there, and knows nothing of the
event loop. Times are made relative to the run's start `t0` (the engine's clock at the first
event). A task's waiting time excludes what its robot spent blocked by another task
(bench/replay.py, "Busy robots"), which the simulated robots record.
"""

from __future__ import annotations

from timelyllm_ros.bench.results import NAN, SegmentResult, TaskResult, task_type
from timelyllm_ros.bench.simulated_robots import SimulatedRobots
from timelyllm_ros.core.engine.base import PRESERVE, EngineAdapter
from timelyllm_ros.core.lifecycle import TERMINAL_STATES
from timelyllm_ros.core.sched.scheduler import SegmentScheduler
from timelyllm_ros.core.task import TaskRecord


def end_state(scheduler: SegmentScheduler, engine: EngineAdapter) -> dict[str, int]:
    """What the planner still holds: queued and running generations, non-terminal tasks,
    requests the engine has not finished, parked generations, and KV blocks not free (a block
    the prefix cache keeps for reuse counts as free, as in vLLM). All zero once a run drained."""
    kv = engine.kv_usage()
    return {"queued": scheduler.queue_length(), "running": len(scheduler.running_request_ids()),
            "active_tasks": len(scheduler.active_tasks()),
            "engine_requests": int(engine.has_unfinished_requests()),
            "parked": len(engine.paused_generations()),
            "kv_blocks_used": int(kv.total_blocks) - int(kv.free_blocks)}


def stuck_state(scheduler: SegmentScheduler, engine: EngineAdapter) -> str:
    """What a run that cannot finish still holds, for its error message."""
    stuck = [t.task_id for t in scheduler.active_tasks()][:5]
    held = ", ".join(f"{k} {v}" for k, v in end_state(scheduler, engine).items())
    return f"{held}; active tasks e.g. {stuck}"


def pause_summary(scheduler: SegmentScheduler) -> dict[str, int]:
    """How a run's suspensions held their KV, and what the scheduler's evictions of parked
    generations cost ({} for a run that never preserved: nothing to evict)."""
    counts = dict(scheduler.pause_counts)
    if not counts.get(PRESERVE) and not scheduler.evictions.evictions:
        return {}
    ev = scheduler.evictions
    return {**counts, "evictions": ev.evictions, "evicted_tokens": ev.evicted_tokens,
            "recomputed_tokens": ev.recomputed_tokens}


def _spans(task: TaskRecord, t0: float, end: float) -> list[tuple[float, float]]:
    spans = []
    history = task.lifecycle.history
    for i, (state, at) in enumerate(history):
        if state == "generating":
            stop = history[i + 1][1] if i + 1 < len(history) else end
            spans.append((at - t0, stop - t0))
    return spans


def task_result(task: TaskRecord, meta: tuple, robots: SimulatedRobots, t0: float) -> TaskResult:
    """`task`'s outcome; `meta` is what the replay knew of it when it was submitted:
    (its workload task spec, its trace, its event's id)."""
    spec, trace, event_id = meta
    blocked = robots.blocked_s(task.task_id)
    segments = [SegmentResult(s.sequence, s.text, s.is_last, s.dispatched_s - t0,
                              (s.started_s - t0) if s.started_s is not None else NAN,
                              (s.finished_s - t0) if s.finished_s is not None else NAN)
                for s in task.segments]
    done = task.state == "done"
    execution = sum(s.finished_s - s.started_s for s in task.segments) if done else NAN
    completion = (max(s.finished_s for s in task.segments) - t0) if done else NAN
    sched_wait = task.waiting_time_s if done else NAN
    end = task.lifecycle.history[-1][1]
    latency = (max(s.dispatched_s for s in task.segments) - task.spec.arrival_s) if done else NAN
    return TaskResult(
        task_id=task.task_id, trace_id=trace.trace_id, category=trace.category,
        tuf_level=spec.tuf_level, task_type=task_type(trace.category, spec.tuf_level),
        robot_id=spec.robot_id, arrival_s=task.spec.arrival_s - t0, ert_s=task.spec.tuf.ert_s,
        state=task.state, reason=task.lifecycle.reason or "",
        response_time_s=task.response_time_s, utility=task.utility,
        waiting_time_s=(sched_wait - blocked) if done else NAN, sched_waiting_time_s=sched_wait,
        robot_blocked_s=blocked, execution_s=execution, completion_s=completion,
        resumes=task.resumes, latency_s=latency,
        generated_tokens=len(task.generated.token_ids), event_id=event_id, segments=segments,
        generation_spans=_spans(task, t0, end), planned_s=_planned(task) - t0,
        tuf=task.spec.tuf)


def _planned(task: TaskRecord) -> float:
    """When the planner was done with `task`: its generation finished, or it ended first."""
    for state, at in task.lifecycle.history:
        if state == "awaiting_robot" or state in TERMINAL_STATES:
            return at
    return NAN
