"""The output half of `SegmentScheduler`: what the engine generated becomes segments.

Each engine output's new text goes to the task's skill language. At a segment boundary the
segment is dispatched to the robot; then, by the policy's dispatch mode, the generation is
suspended until the scheduler resumes it ("segment": its KV is preserved, swapped or discarded as
the policy's pause handling says), keeps generating ("stream"), or holds its segments until the
plan is complete ("whole"). Preemption (BROS's displacement) is `TaskBook.preempt`.
"""

from __future__ import annotations

import logging
import math

from timelyllm_ros.core.engine.base import DISCARD, PAUSE_HANDLINGS, EngineOutput
from timelyllm_ros.core.sched.interface import PauseInfo, SegmentDispatch
from timelyllm_ros.core.sched.parked import ParkedEviction
from timelyllm_ros.core.sched.queue_view import QueueView
from timelyllm_ros.core.sched.sizes import context_of, plan_budget
from timelyllm_ros.core.sched.state import SchedulerState
from timelyllm_ros.core.sched.task_book import TaskBook
from timelyllm_ros.core.skills.base import SkillCall, SkillSyntaxError
from timelyllm_ros.core.task import SegmentRecord, TaskRecord

log = logging.getLogger("timelyllm.scheduler")


class OutputStep:
    """Turns each engine output into segments (module docstring), over the scheduler's state,
    with the task transitions (`book`) and the eviction book-keeping of parked generations
    (`parked`: a resumed run measures what its eviction cost, a first segment how long a run
    takes to reach it)."""

    def __init__(self, state: SchedulerState, book: TaskBook, parked: ParkedEviction):
        self.state = state
        self.book = book
        self.parked = parked

    def consume(self, task: TaskRecord, output: EngineOutput, now: float) -> None:
        if output.error is not None:
            # The engine cannot go on with it (a server that died, a request refused
            # mid-stream): the task fails with the engine's reason, and its robot is told.
            self.book.finish(task, "fail", f"engine: {output.error}", now)
            return
        if output.recomputed_tokens is not None and task.awaiting_cached_count:
            task.recomputed_tokens_last_resume = int(output.recomputed_tokens)
            task.recomputed_tokens_total += int(output.recomputed_tokens)
        if task.awaiting_cached_count and output.num_cached_tokens is not None:
            if self.state.evicted:
                self.parked.note_resumed_after_eviction(task, output.recomputed_tokens,
                                                        output.num_cached_tokens)
            task.awaiting_cached_count = False
            task.cached_tokens_last_resume = int(output.num_cached_tokens)
            task.cached_tokens_total += int(output.num_cached_tokens)
            log.info("task %s resumed with %d cached prompt tokens of %d", task.task_id,
                     output.num_cached_tokens, context_of(task))
        task.generated.append(output.new_token_ids, output.new_text)
        task.tokens_this_run += len(output.new_token_ids)
        self.state.running_context += len(output.new_token_ids)
        skill_set = self.book.skill_set_of(task.spec)
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
                self.parked.note_run_to_segment(skill_set.name, now - task.run_started_s)
                task.run_started_s = math.nan
            text = gen.text[found[0][0]:found[-1][1]]
            try:
                parsed = language.parse(text)
            except SkillSyntaxError as err:
                self.book.finish(task, "fail", f"generated text is not executable: {err}", now)
                return
            binds = parsed.binds
            self._on_segment_text(task, text, parsed.calls, plan_done, now)
        if task.lifecycle.is_terminal:
            return
        if plan_done:
            self._end_generation(task, output.finished, now)
        elif found and self.state.policy.dispatch == "segment":
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
        if self.state.policy.suspend_when == "always":
            return True
        contention = self.state.contention
        if contention is not None and task.task_id in contention.yield_keys:
            return True  # the admission controller named it (CandidateAdmission.yield_keys)
        if contention is None or contention.refused <= 0:
            self.state.stats.suspensions_avoided += 1
            return False
        row = self.book.queue_row(task, now, cached=0)
        mine = float(self.state.policy.priorities(QueueView.from_rows([row]), now)[0])
        if mine >= contention.best_refused_priority:
            self.state.stats.suspensions_avoided += 1
            return False
        contention.refused -= 1
        return True

    def _on_segment_text(self, task: TaskRecord, text: str, calls: tuple[SkillCall, ...],
                         is_last: bool, now: float) -> None:
        if self.state.policy.dispatch == "whole":
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
        state, config, robots = self.state, self.state.config, self.state.robots
        estimate = state.exec_model.estimate_segment_min(calls) if calls else 0.0
        if calls:
            self.book.note_segment_time(task.spec.skill_set, estimate, observed=False)
        arrive = now + config.network_latency_s
        start = max(arrive, task.robot_free_at(arrive), robots.free_at(task.spec.robot_id, arrive))
        done = start + estimate
        # Priorities plan with the minimum (the paper's rule); the dead-robot timeout must not:
        # a sweep's minimum is one 45-degree step, its longest a full turn. Nor may it assume
        # the minimum for the segments queued ahead of this one (robot_timeline.py).
        longest = state.exec_model.estimate_segment_max(calls) if calls else 0.0
        latest_start = max(start, robots.latest_free_at(task.spec.robot_id, arrive))
        segment = SegmentRecord(
            sequence=len(task.segments), text=text, calls=calls, is_last=is_last,
            estimated_execution_s=estimate, dispatched_s=now, estimated_done_s=done,
            report_deadline_s=latest_start + longest + config.network_latency_s + max(
                config.report_timeout_factor * estimate, config.report_timeout_min_s))
        task.segments.append(segment)
        robots.dispatched(task.spec.robot_id, segment, owner=task, latest_start=latest_start,
                          longest_s=longest)
        state.deadlines.note(task)
        if segment.sequence == 0:
            task.response_time_s = arrive - task.spec.arrival_s
            task.utility = float(task.spec.tuf.utility(task.response_time_s))
        state.listener.on_segment(SegmentDispatch(
            task_id=task.task_id, robot_id=task.spec.robot_id, skill_set=task.spec.skill_set,
            sequence=segment.sequence, text=text, calls=calls, is_last=is_last,
            estimated_execution_s=estimate, dispatched_s=now, estimated_done_s=done))

    def _suspend(self, task: TaskRecord, now: float) -> None:
        state = self.state
        context = context_of(task)
        handling = self._pause_handling(task, context, now)
        rid = task.engine_request_id
        if handling != DISCARD and rid is not None:
            state.engine.suspend_request(rid, handling)
            if state.running.pop(rid, None) is not None:
                state.running_context -= context
            state.run_bound.pop(rid, None)
            task.engine_request_id = None
            state.paused[task.task_id] = (rid, handling)
        else:
            handling = DISCARD
            self.book.stop_engine_request(task)
        state.stats.pause_counts[handling] += 1
        task.owed_text = task.generated.cut_for_resume()
        task.lifecycle.suspend(now)
        task.queued_since_s = now
        if task.awaiting_report is None:
            self.book.requeue(task, now, computed=context)
        # else queued by on_report, with the robot's report appended (observations.py)
        self.book.emit(task)

    def _pause_handling(self, task: TaskRecord, context: int, now: float) -> str:
        state = self.state
        if not state.context.supports_pause_handling or task.engine_request_id is None:
            return DISCARD
        if not state.hooks.pause:
            # The policy has no opinion: the engine's own best path (a vLLM session parks and
            # resumes computing one token; other engines discard).
            return state.context.default_pause_handling
        rid = task.engine_request_id
        other = state.running_context - context  # (it is running: the others' contexts)
        free_at = task.robot_free_at(now)
        lead = state.config.resume_lead_s
        handling = state.policy.pause_handling(PauseInfo(
            task_id=task.task_id, context_tokens=context, other_tokens=other,
            pause_s=max(0.0, free_at - now),
            eligible_in_s=0.0 if lead is None else max(0.0, free_at - lead - now),
            segment_index=len(task.segments), is_urgent=task.spec.is_urgent,
            context=state.context, pinned_blocks=state.engine.pinned_blocks()))
        if handling not in PAUSE_HANDLINGS:
            raise ValueError(f"policy {state.policy.name!r}: pause handling must be one of "
                             f"{PAUSE_HANDLINGS}, got {handling!r}")
        return handling

    def _end_generation(self, task: TaskRecord, engine_finished: bool, now: float) -> None:
        if not engine_finished:
            self.book.stop_engine_request(task)
        else:
            state = self.state
            if state.running.pop(task.engine_request_id, None) is not None:
                state.running_context -= context_of(task)
            state.run_bound.pop(task.engine_request_id, None)
            task.engine_request_id = None
        if task.held_segments:  # whole-plan dispatch of a plan cut short
            self._on_segment_text(task, *task.held_segments.pop(), is_last=True, now=now)
        if not task.segments:
            self.book.finish(task, "fail", "the model produced no executable statement", now)
            return
        if not task.segments[-1].is_last:
            # The plan ended right after a segment boundary; tell the robot with an empty closing
            # segment so it knows nothing more is coming (it reports it at once).
            self._dispatch(task, "", (), is_last=True, now=now)
        task.generation_finished = True
        task.lifecycle.finish_generation(now)
        self.book.maybe_complete(task, now)
        self.book.emit(task)


def _parses(language, text: str) -> bool:
    try:
        language.parse(text)
    except SkillSyntaxError:
        return False
    return True
