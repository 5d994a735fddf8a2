"""The task transitions that every part of the scheduler shares: ending a task and releasing
what it holds, queueing a generation again (after a suspension, a preemption or a report),
publishing a task's status, and the per-task sizes a queue row holds.

`TaskBook` works on the `SchedulerState` it is given (state.py) and nothing else; admission,
outputs and inputs each call it rather than change the task books themselves.
"""

from __future__ import annotations

from timelyllm_ros.core.sched.interface import TaskRejected
from timelyllm_ros.core.sched.queue_view import initial_row, suspended_row
from timelyllm_ros.core.sched.sizes import bound_of, context_of
from timelyllm_ros.core.sched.state import SchedulerState
from timelyllm_ros.core.skills.skillset import SkillSet
from timelyllm_ros.core.task import TaskRecord, TaskSnapshot, TaskSpec


def deadline_of(task: TaskRecord, now: float) -> float:
    """When the robot needs the segment `task` generates next: arrival + ERT for the first,
    the robot's expected finish of the previous one after that."""
    if not task.segments:
        return task.spec.arrival_s + task.spec.tuf.ert_s
    return task.robot_free_at(now)


class TaskBook:
    """Task transitions and book-keeping over one `SchedulerState` (module docstring)."""

    def __init__(self, state: SchedulerState):
        self.state = state

    # ------------------------------------------------------------------ transitions
    def finish(self, task: TaskRecord, trigger: str, reason: str, now: float) -> None:
        """Terminal transition that releases everything the task holds."""
        self.stop_engine_request(task)
        if task.queue_slot is not None:
            self.state.queue.remove(task.queue_slot)
            task.queue_slot = None
        task.lifecycle.trigger(trigger, now, reason)
        self.state.robots.settled(task.spec.robot_id, task.segments)
        self.forget_old(task)
        self.emit(task)

    def stop_engine_request(self, task: TaskRecord) -> None:
        state = self.state
        if task.engine_request_id is not None:
            state.engine.abort_request(task.engine_request_id)
            if state.running.pop(task.engine_request_id, None) is not None:
                state.running_context -= context_of(task)
            state.run_bound.pop(task.engine_request_id, None)
            task.engine_request_id = None
        paused = state.paused.pop(task.task_id, None)
        if paused is not None:
            state.engine.abort_request(paused[0])  # releases pinned blocks / the host copy

    def maybe_complete(self, task: TaskRecord, now: float) -> None:
        if task.state != "awaiting_robot" or not all(s.reported for s in task.segments):
            return
        finished = max(s.finished_s for s in task.segments)
        executing = sum(s.finished_s - s.started_s for s in task.segments)
        task.waiting_time_s = (finished - task.spec.arrival_s) - executing
        task.lifecycle.complete(now, "all segments executed")
        self.forget_old(task)

    def forget_old(self, task: TaskRecord) -> None:
        """Book-keeping once `task` is terminal."""
        state = self.state
        state.active.pop(task.task_id, None)
        state.shared_of.pop(task.task_id, None)
        state.evicted.pop(task.task_id, None)
        if state.hooks.task_end:
            state.policy.on_task_end(task.submit_index)
        limit = state.config.max_finished_tasks
        if limit is None:
            return
        # A long-running planner keeps recent finished tasks for status and duplicate-id
        # answers, not their token lists (a drone task's prompt alone is ~430 ids).
        task.prompt_ids = []
        task.generated.token_ids, task.generated.token_ends = [], []
        state.finished_order.append(task.task_id)
        while len(state.finished_order) > limit:
            old = state.finished_order.popleft()
            if old in state.tasks and state.tasks[old].lifecycle.is_terminal:
                del state.tasks[old]

    def preempt(self, task: TaskRecord, now: float) -> None:
        """Stop a running generation mid-segment and queue it again (recompute from outside
        the engine): abort, keep its tokens, and resubmit `prompt + generated` when it is
        admitted again, so the prefix cache serves every full block it had computed.

        A skill language with an output grammar restarts the statement in progress: a
        structured-output constraint can only be entered at a statement boundary, so the
        tokens after the last boundary (less than one segment) are generated again. Without a
        grammar (chat, tool calls) every token is kept, as vLLM's own preemption does."""
        skill_set = self.skill_set_of(task.spec)
        self.stop_engine_request(task)
        task.owed_text = task.generated.cut_for_resume(
            keep_pending=skill_set.output_regex() is None)
        task.preemptions += 1
        self.state.stats.preemptions += 1
        task.lifecycle.preempt(now)
        self.requeue(task, now, computed=context_of(task))
        self.emit(task)

    def requeue(self, task: TaskRecord, now: float, computed: int) -> None:
        """Queue the next run of a generation that had `computed` tokens in the engine: its
        full blocks are expected back (prefix cache, pinned or host copy). Its row keeps the
        reference of the segment it generates (arrival for the first, the robot's estimated
        completion of the previous one after that) and `queued_since_s`."""
        bs = self.state.context.kv_block_size
        cached = (max(0, computed - 1) // bs) * bs
        task.queue_slot = self.state.queue.add(self.queue_row(task, now, cached),
                                               key=task.task_id)

    def emit(self, task: TaskRecord) -> None:
        self.state.listener.on_status(TaskSnapshot.of(task))

    # ------------------------------------------------------------------ queue rows and sizes
    def queue_row(self, task: TaskRecord, now: float, cached: int) -> dict:
        sizes = self.sizes(task, self.skill_set_of(task.spec), cached=cached)
        spec = task.spec
        if task.segments:
            return suspended_row(spec.tuf, spec.arrival_s, task.robot_free_at(now),
                                 len(task.segments), enqueued_s=task.queued_since_s,
                                 is_urgent=spec.is_urgent, **sizes)
        return initial_row(spec.tuf, spec.arrival_s, enqueued_s=task.queued_since_s,
                           is_urgent=spec.is_urgent, **sizes)

    def sizes(self, task: TaskRecord, skill_set: SkillSet, cached: int) -> dict:
        context = context_of(task)
        return {
            "task_seq": task.submit_index,
            "context_tokens": context,
            "bound_tokens": bound_of(task, skill_set),
            "prefill_tokens": max(1, context - min(cached, context - 1)),
            "pause_s": self.mean_segment_time(task.spec.skill_set),
        }

    def note_segment_time(self, skill_set: str, seconds: float, observed: bool) -> None:
        # [sum, count, observed?]: estimates only until the first report of the skill set.
        seg_time = self.state.seg_time
        entry = seg_time.get(skill_set)
        if entry is None or (observed and not entry[2]):
            seg_time[skill_set] = [float(seconds), 1.0, observed]
        elif observed == entry[2]:
            entry[0] += float(seconds)
            entry[1] += 1.0

    def mean_segment_time(self, skill_set: str) -> float:
        entry = self.state.seg_time.get(skill_set)
        return entry[0] / entry[1] if entry else 0.0

    # ------------------------------------------------------------------ prompts
    def skill_set_of(self, spec: TaskSpec) -> SkillSet:
        skill_set = self.state.skill_sets.get(spec.skill_set)
        if skill_set is None:
            raise TaskRejected("skill_set", f"unknown robot kind {spec.skill_set!r}; known: "
                                            f"{', '.join(sorted(self.state.skill_sets))}")
        return skill_set

    def prompt_ids(self, skill_set: SkillSet, instruction: str, scene: str = "") -> list[int]:
        return self.state.engine.render_chat(skill_set.render_messages(instruction, scene))

    def shared_prefix_len(self, skill_set: SkillSet, prompt_ids: list[int]) -> int:
        """Full blocks of `prompt_ids` shared with the skill set's fixed prompt (the part the
        prefix cache is expected to serve)."""
        shared_prefix = self.state.shared_prefix
        shared = shared_prefix.get(skill_set.name)
        if shared is None:
            shared = shared_prefix[skill_set.name] = self.prompt_ids(skill_set, "")
        bs = self.state.context.kv_block_size
        # The most whole blocks that both start with: a binary search over block counts, each
        # probe a list comparison at C speed (prompts run to thousands of tokens, and this runs
        # for every task).
        lo, hi = 0, min(len(shared), len(prompt_ids)) // bs
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if prompt_ids[:mid * bs] == shared[:mid * bs]:
                lo = mid
            else:
                hi = mid - 1
        return lo * bs
