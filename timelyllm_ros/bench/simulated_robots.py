"""The robots of a replay: each executes the segments dispatched to it in order, one at a time,
with durations drawn from the execution-time model, and reports each finished segment back.

Durations are deterministic: the i-th skill call of a task is drawn from a Generator seeded by
(seed, task number, i), so every policy sees the same robot execution times whatever order the
calls are executed or generated in.

Busy robots (`mode="queue"`, the default): a robot serves its tasks in arrival order, like a real
robot that does not interleave two plans; segments of a newer task wait until the robot has
finished the last segment of every earlier task. The time a segment waits for *another* task is
recorded per task (`blocked_s`) because it is not the LLM's doing. `mode="dispatch"`: a robot
runs every segment in the order the segments reach it, whatever their task, as the ROS executor
does (ros/robot_server.py) and as the scheduler's robot timelines assume; a segment already
handed to the robot runs even if its task ends meanwhile (the executor would stop it).
`mode="parallel"` gives every task its own robot (no blocking).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from timelyllm_ros.bench.config import ROBOT_MODES
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.sched.interface import SegmentDispatch

# schedule_report(at, task_id, sequence, started, finished)
ReportScheduler = Callable[[float, str, int, float, float], None]


@dataclass
class _PendingSegment:
    sequence: int
    calls: tuple
    is_last: bool
    ready_s: float  # when it reaches the robot


@dataclass
class _RobotTask:
    task_id: str
    task_num: int
    pending: deque = field(default_factory=deque)
    next_call: int = 0
    last_finish: float = -math.inf
    blocked_s: float = 0.0
    execution_s: float = 0.0
    finished: bool = False  # its last segment is scheduled on the robot
    dropped: bool = False


class SimulatedRobots:
    """Robots that execute dispatched segments in order, one at a time, and report back.

    Each robot keeps its tasks in arrival order and works on the oldest unfinished one; a task's
    segments run back to back as they arrive. When a segment can start is known as soon as it is
    dispatched (or as soon as the robot's earlier task is finished), so start/finish times are
    computed exactly and the report is scheduled with `schedule_report(at, task_id, sequence,
    started, finished)` at finish + latency.
    """

    def __init__(self, exec_model: ExecutionTimeModel, seed: int, latency_s: float, mode: str,
                 schedule_report: ReportScheduler,
                 call_durations: Mapping[tuple[int, int], float] | None = None):
        if mode not in ROBOT_MODES:
            raise ValueError(f"robots: must be one of {', '.join(ROBOT_MODES)}, got {mode!r}")
        self.exec_model = exec_model
        self.seed = int(seed)
        self.latency_s = float(latency_s)
        self.mode = mode
        self._schedule_report = schedule_report
        # (task number, call index) -> seconds, for workloads that fix each call's duration
        # (a tool's latency drawn with the workload); other calls are sampled.
        self.call_durations = dict(call_durations or {})
        self._queues: dict[str, deque[_RobotTask]] = {}
        self._free_at: dict[str, float] = {}
        self._tasks: dict[str, _RobotTask] = {}
        self._robot_of: dict[str, str] = {}

    def call_duration(self, task_num: int, call_index: int, call) -> float:
        """Duration of a task's `call_index`-th call; the same for every policy and run."""
        fixed = self.call_durations.get((int(task_num), int(call_index)))
        if fixed is not None:
            return float(fixed)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, int(task_num),
                                                            int(call_index)]))
        return float(self.exec_model.sample_segment((call,), rng))

    def add_task(self, task_id: str, task_num: int, robot_id: str) -> None:
        key = f"{robot_id}/{task_id}" if self.mode == "parallel" else robot_id
        rt = _RobotTask(task_id, task_num)
        self._tasks[task_id] = rt
        self._robot_of[task_id] = key
        if self.mode != "dispatch":  # (a dispatch-order robot needs no queue of tasks)
            self._queues.setdefault(key, deque()).append(rt)
        self._free_at.setdefault(key, -math.inf)

    def dispatch(self, segment: SegmentDispatch) -> None:
        task_id = segment.task_id
        rt = self._tasks[task_id]
        rt.pending.append(_PendingSegment(segment.sequence, tuple(segment.calls), segment.is_last,
                                          segment.dispatched_s + self.latency_s))
        if self.mode == "dispatch":
            # Dispatches come in time order, so running each now keeps the robot's FIFO order.
            self._execute(self._robot_of[task_id], rt, rt.pending.popleft())
            return
        self._advance(self._robot_of[task_id])

    def drop(self, task_id: str) -> None:
        """The task ended without finishing (failed / cancelled / rejected): the robot moves on.
        A task the robots never received is ignored."""
        rt = self._tasks.get(task_id)
        if rt is None or rt.finished or rt.dropped:
            return
        rt.dropped = True
        rt.pending.clear()
        if self.mode != "dispatch":
            self._advance(self._robot_of[task_id])

    def blocked_s(self, task_id: str) -> float:
        return self._tasks[task_id].blocked_s

    def execution_s(self, task_id: str) -> float:
        return self._tasks[task_id].execution_s

    def _execute(self, robot: str, rt: _RobotTask, seg: _PendingSegment) -> None:
        """Run `seg` of task `rt` on `robot` as soon as both are ready; schedule its report."""
        own_ready = max(seg.ready_s, rt.last_finish)
        start = max(own_ready, self._free_at[robot])
        rt.blocked_s += start - own_ready
        duration = 0.0
        for call in seg.calls:
            duration += self.call_duration(rt.task_num, rt.next_call, call)
            rt.next_call += 1
        finish = start + duration
        rt.execution_s += duration
        rt.last_finish = finish
        self._free_at[robot] = finish
        self._schedule_report(finish + self.latency_s, rt.task_id, seg.sequence, start, finish)
        if seg.is_last:
            rt.finished = True

    def _advance(self, robot: str) -> None:
        queue = self._queues[robot]
        while queue:
            head = queue[0]
            while head.pending and not head.dropped:
                self._execute(robot, head, head.pending.popleft())
                if head.finished:
                    break
            if head.finished or head.dropped:
                queue.popleft()
                continue
            break
