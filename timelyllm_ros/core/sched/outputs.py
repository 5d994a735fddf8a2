"""The output half of `SegmentScheduler`: what the engine generated becomes segments.

Each engine output's new text goes to the task's skill language. At a segment boundary the
segment is dispatched to the robot; then, by the policy's dispatch mode, the generation is
suspended until the scheduler resumes it ("segment": its KV is preserved, swapped or discarded as
the policy's pause handling says), keeps generating ("stream"), or holds its segments until the
plan is complete ("whole"). Preemption (BROS's displacement) queues a running generation again.
"""

from __future__ import annotations

import logging
import math

from timelyllm_ros.core.engine.base import DISCARD, PAUSE_HANDLINGS, EngineAdapter, EngineOutput
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.sched.admission_step import Contention
from timelyllm_ros.core.sched.interface import (PauseInfo, Policy, SchedulerContext,
                                                SchedulerListener, SegmentDispatch)
from timelyllm_ros.core.sched.queue_view import (QueueArrays, QueueView, initial_row,
                                                 suspended_row)
from timelyllm_ros.core.sched.report_deadlines import ReportDeadlines
from timelyllm_ros.core.sched.robot_timeline import RobotTimelines
from timelyllm_ros.core.sched.sizes import context_of, plan_budget
from timelyllm_ros.core.skills.base import SkillCall, SkillSyntaxError
from timelyllm_ros.core.task import SegmentRecord, TaskRecord

log = logging.getLogger("timelyllm.scheduler")


class OutputStep:
    """Mixin of `SegmentScheduler` (core.sched.scheduler), which owns the state declared here."""

    engine: EngineAdapter
    policy: Policy
    context: SchedulerContext
    listener: SchedulerListener
    exec_model: ExecutionTimeModel
    preemptions: int
    pause_counts: dict[str, int]
    _queue: QueueArrays
    _robots: RobotTimelines
    _deadlines: ReportDeadlines
    _running: dict[str, TaskRecord]
    _run_bound: dict[str, int]
    _paused: dict[str, tuple[str, str]]
    _hook_pause: bool
    _engine_pauses: bool
    _contention: Contention | None
    suspensions_avoided: int
    # (and `_note_resumed_after_eviction`, `_note_run_to_segment`: parked.py)
    _evicted: dict[str, int]

    def _consume(self, task: TaskRecord, output: EngineOutput, now: float) -> None:
        if output.error is not None:
            # The engine cannot go on with it (a server that died, a request refused
            # mid-stream): the task fails with the engine's reason, and its robot is told.
            self._finish(task, "fail", f"engine: {output.error}", now)
            return
        if output.recomputed_tokens is not None and task.awaiting_cached_count:
            task.recomputed_tokens_last_resume = int(output.recomputed_tokens)
            task.recomputed_tokens_total += int(output.recomputed_tokens)
        if task.awaiting_cached_count and output.num_cached_tokens is not None:
            if self._evicted:
                self._note_resumed_after_eviction(task, output.recomputed_tokens,
                                                  output.num_cached_tokens)
            task.awaiting_cached_count = False
            task.cached_tokens_last_resume = int(output.num_cached_tokens)
            task.cached_tokens_total += int(output.num_cached_tokens)
            log.info("task %s resumed with %d cached prompt tokens of %d", task.task_id,
                     output.num_cached_tokens, context_of(task))
        task.generated.append(output.new_token_ids, output.new_text)
        task.tokens_this_run += len(output.new_token_ids)
        skill_set = self._skill_set_of(task.spec)
        language = skill_set.language
        gen = task.generated

        found = []
        while True:
            end = language.next_boundary(gen.text, gen.consumed)
            if end is None:
                break
            found.append((gen.consumed, end))
            gen.consumed = end
            gen.statements_done += 1
        if output.finished:
            tail_end = language.final_segment_end(gen.text, gen.consumed)
            if tail_end is not None and gen.text[gen.consumed:tail_end].strip():
                if output.finish_reason == "length" and not _parses(
                        language, gen.text[gen.consumed:tail_end]):
                    # The token budget cut a statement short (`mf` without its distance):
                    # the plan ends before it, as if the budget had ended at the `;`.
                    log.info("task %s: plan budget cut %r short; dropped", task.task_id,
                             gen.text[gen.consumed:tail_end])
                else:
                    found.append((gen.consumed, tail_end))
                gen.consumed = tail_end
                gen.statements_done += 1

        plan_full = (gen.statements_done >= skill_set.max_statements
                     or len(gen.token_ids) >= plan_budget(task.spec, skill_set))
        plan_done = output.finished or plan_full
        binds: tuple[str, ...] = ()
        if found:
            if task.run_started_s == task.run_started_s:  # (not NaN: the run's first segment)
                self._note_run_to_segment(skill_set.name, now - task.run_started_s)
                task.run_started_s = math.nan
            text = gen.text[found[0][0]:found[-1][1]]
            try:
                parsed = language.parse(text)
            except SkillSyntaxError as err:
                self._finish(task, "fail", f"generated text is not executable: {err}", now)
                return
            binds = parsed.binds
            self._on_segment_text(task, text, parsed.calls, plan_done, now)
        if task.lifecycle.is_terminal:
            return
        if plan_done:
            self._end_generation(task, output.finished, now)
        elif found and self.policy.dispatch == "segment":
            if binds and skill_set.observations:
                # What the robot observes decides what comes next (core/sched/observations.py).
                task.segments[-1].binds = binds
                task.awaiting_report = task.segments[-1].sequence
                self._suspend(task, now)
            elif self._suspension_pays(task, now):
                self._suspend(task, now)

    def _suspension_pays(self, task: TaskRecord, now: float) -> bool:
        """Whether to suspend `task` at the boundary it just reached (`Policy.suspend_when`).

        Work-conserving ("contended"): a suspension costs a resume (the partial last block is
        recomputed, or the preserved KV and slot are held idle), and it buys a slot and KV for
        a queued generation only if one is waiting for them. So suspend only when the last
        admission pass refused a generation that ranks above this one were it queued now;
        each suspension answers one refused generation. Otherwise it keeps generating and its
        segments go out as they complete, as streaming does."""
        if self.policy.suspend_when == "always":
            return True
        contention = self._contention
        if contention is not None and task.task_id in contention.yield_keys:
            return True  # the admission controller named it (CandidateAdmission.yield_keys)
        if contention is None or contention.refused <= 0:
            self.suspensions_avoided += 1
            return False
        row = self._queue_row(task, now, cached=0)
        mine = float(self.policy.priorities(QueueView.from_rows([row]), now)[0])
        if mine >= contention.best_refused_priority:
            self.suspensions_avoided += 1
            return False
        contention.refused -= 1
        return True

    def _on_segment_text(self, task: TaskRecord, text: str, calls: tuple[SkillCall, ...],
                         is_last: bool, now: float) -> None:
        if self.policy.dispatch == "whole":
            task.held_segments.append((text, calls))
            if is_last:
                for i, (held_text, held_calls) in enumerate(task.held_segments):
                    self._dispatch(task, held_text, held_calls,
                                   is_last=i == len(task.held_segments) - 1, now=now)
                task.held_segments.clear()
            return
        self._dispatch(task, text, calls, is_last, now)

    def _dispatch(self, task: TaskRecord, text: str, calls: tuple[SkillCall, ...], is_last: bool,
                  now: float) -> None:
        estimate = self.exec_model.estimate_segment_min(calls) if calls else 0.0
        if calls:
            self._note_segment_time(task.spec.skill_set, estimate, observed=False)
        arrive = now + self.config.network_latency_s
        start = max(arrive, task.robot_free_at(arrive),
                    self._robots.free_at(task.spec.robot_id, arrive))
        done = start + estimate
        # Priorities plan with the minimum (the paper's rule); the dead-robot timeout must not:
        # a sweep's minimum is one 45-degree step, its longest a full turn. Nor may it assume
        # the minimum for the segments queued ahead of this one (robot_timeline.py).
        longest = self.exec_model.estimate_segment_max(calls) if calls else 0.0
        latest_start = max(start, self._robots.latest_free_at(task.spec.robot_id, arrive))
        segment = SegmentRecord(
            sequence=len(task.segments), text=text, calls=calls, is_last=is_last,
            estimated_execution_s=estimate, dispatched_s=now, estimated_done_s=done,
            report_deadline_s=latest_start + longest + self.config.network_latency_s + max(
                self.config.report_timeout_factor * estimate, self.config.report_timeout_min_s))
        task.segments.append(segment)
        self._robots.dispatched(task.spec.robot_id, segment, owner=task,
                                latest_start=latest_start, longest_s=longest)
        self._deadlines.note(task)
        if segment.sequence == 0:
            task.response_time_s = arrive - task.spec.arrival_s
            task.utility = float(task.spec.tuf.utility(task.response_time_s))
        self.listener.on_segment(SegmentDispatch(
            task_id=task.task_id, robot_id=task.spec.robot_id, skill_set=task.spec.skill_set,
            sequence=segment.sequence, text=text, calls=calls, is_last=is_last,
            estimated_execution_s=estimate, dispatched_s=now, estimated_done_s=done))

    def _suspend(self, task: TaskRecord, now: float) -> None:
        context = context_of(task)
        handling = self._pause_handling(task, context, now)
        rid = task.engine_request_id
        if handling != DISCARD and rid is not None:
            self.engine.suspend_request(rid, handling)
            self._running.pop(rid, None)
            self._run_bound.pop(rid, None)
            task.engine_request_id = None
            self._paused[task.task_id] = (rid, handling)
        else:
            handling = DISCARD
            self._stop_engine_request(task)
        self.pause_counts[handling] += 1
        task.owed_text = task.generated.cut_for_resume()
        task.lifecycle.suspend(now)
        task.queued_since_s = now
        if task.awaiting_report is None:
            self._requeue(task, now, computed=context)
        # else queued by on_report, with the robot's report appended (observations.py)
        self._emit(task)

    def _preempt(self, task: TaskRecord, now: float) -> None:
        """Stop a running generation mid-segment and queue it again (recompute from outside
        the engine): abort, keep its tokens, and resubmit `prompt + generated` when it is
        admitted again, so the prefix cache serves every full block it had computed.

        A skill language with an output grammar restarts the statement in progress: a
        structured-output constraint can only be entered at a statement boundary, so the
        tokens after the last boundary (less than one segment) are generated again. Without a
        grammar (chat, tool calls) every token is kept, as vLLM's own preemption does."""
        skill_set = self._skill_set_of(task.spec)
        self._stop_engine_request(task)
        task.owed_text = task.generated.cut_for_resume(
            keep_pending=skill_set.output_regex() is None)
        task.preemptions += 1
        self.preemptions += 1
        task.lifecycle.preempt(now)
        self._requeue(task, now, computed=context_of(task))
        self._emit(task)

    def _requeue(self, task: TaskRecord, now: float, computed: int) -> None:
        """Queue the next run of a generation that had `computed` tokens in the engine: its
        full blocks are expected back (prefix cache, pinned or host copy). Its row keeps the
        reference of the segment it generates (arrival for the first, the robot's estimated
        completion of the previous one after that) and `queued_since_s`."""
        bs = self.context.kv_block_size
        cached = (max(0, computed - 1) // bs) * bs
        task.queue_slot = self._queue.add(self._queue_row(task, now, cached), key=task.task_id)

    def _queue_row(self, task: TaskRecord, now: float, cached: int) -> dict:
        sizes = self._sizes(task, self._skill_set_of(task.spec), cached=cached)
        spec = task.spec
        if task.segments:
            return suspended_row(spec.tuf, spec.arrival_s, task.robot_free_at(now),
                                 len(task.segments), enqueued_s=task.queued_since_s,
                                 is_urgent=spec.is_urgent, **sizes)
        return initial_row(spec.tuf, spec.arrival_s, enqueued_s=task.queued_since_s,
                           is_urgent=spec.is_urgent, **sizes)

    def _pause_handling(self, task: TaskRecord, context: int, now: float) -> str:
        if not self._engine_pauses or task.engine_request_id is None:
            return DISCARD
        if not self._hook_pause:
            # The policy has no opinion: the engine's own best path (a vLLM session parks and
            # resumes computing one token; other engines discard).
            return self.context.default_pause_handling
        rid = task.engine_request_id
        other = sum(context_of(t) for r, t in self._running.items() if r != rid)
        free_at = task.robot_free_at(now)
        lead = self.config.resume_lead_s
        handling = self.policy.pause_handling(PauseInfo(
            task_id=task.task_id, context_tokens=context, other_tokens=other,
            pause_s=max(0.0, free_at - now),
            eligible_in_s=0.0 if lead is None else max(0.0, free_at - lead - now),
            segment_index=len(task.segments), is_urgent=task.spec.is_urgent,
            context=self.context))
        if handling not in PAUSE_HANDLINGS:
            raise ValueError(f"policy {self.policy.name!r}: pause handling must be one of "
                             f"{PAUSE_HANDLINGS}, got {handling!r}")
        return handling

    def _end_generation(self, task: TaskRecord, engine_finished: bool, now: float) -> None:
        if not engine_finished:
            self._stop_engine_request(task)
        else:
            self._running.pop(task.engine_request_id, None)
            self._run_bound.pop(task.engine_request_id, None)
            task.engine_request_id = None
        if task.held_segments:  # whole-plan dispatch of a plan cut short
            self._on_segment_text(task, *task.held_segments.pop(), is_last=True, now=now)
        if not task.segments:
            self._finish(task, "fail", "the model produced no executable statement", now)
            return
        if not task.segments[-1].is_last:
            # The plan ended right after a segment boundary; tell the robot with an empty closing
            # segment so it knows nothing more is coming (it reports it at once).
            self._dispatch(task, "", (), is_last=True, now=now)
        task.generation_finished = True
        task.lifecycle.finish_generation(now)
        self._maybe_complete(task, now)
        self._emit(task)


def _parses(language, text: str) -> bool:
    try:
        language.parse(text)
    except SkillSyntaxError:
        return False
    return True
