"""TimelyLLM, work-conserving: the planner's default policy (docs/bench.md, "The modern
comparison").

The paper's TimelyLLM suspends every generation at every segment boundary and resumes it by
priority. Against today's vLLM (prefix caching, streaming, priority scheduling) that loses at
every load: each suspension costs a resume, and past saturation the suspended generations
compete with new tasks' first segments for an engine that segmenting has made slower. This
policy keeps TimelyLLM's priority (PUD scaled by slack, Eq. 4) and changes when it acts:

- **Responses first.** A task's utility is fixed by its first segment (its response); later
  segments only need to be ready when the robot finishes the previous one. Queued first segments
  rank above every resume; PUD orders each class.
- **Resumes do not slow responses.** While a response runs, a resume is admitted only while
  the step with it stays within `response_step_factor` times the fastest step the engine has
  shown, and running resumes yield at their next boundary while the step is over that
  (`cap_between_responses` holds the cap at every step). A first segment is admitted whenever
  KV blocks and slots allow: making it wait in the queue is what costs utility.
- **Work-conserving suspension** (`Policy.suspend_when = "contended"`): a generation is suspended
  at a segment boundary only when the last admission pass refused a generation that ranks above
  it; otherwise it keeps generating and its segments go out as they complete, as streaming does.
- **Overload** (`Policy.hopeless`): a queued first segment whose utility can no longer be
  positive is shed with a reason (default), or served after everything else (`hopeless="serve"`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from timelyllm_ros.core.engine.base import DISCARD, PRESERVE
from timelyllm_ros.core.policies.builtin import TimelyPolicy
from timelyllm_ros.core.sched.admission import BatchSpeedModel
from timelyllm_ros.core.sched.interface import (AdmissionController, AdmissionPass, Candidate,
                                                CandidateAdmission, PauseInfo, RunningGen,
                                                SchedulerContext)
from timelyllm_ros.core.sched.queue_view import QueueView

# Added to a first segment's priority so that it ranks above every resume. PUD values are
# bounded by U0 / g^2 (U0 <= 1e3, g >= 1 ms: 1e9); the offset keeps the classes apart and PUD's
# order within each.
_RESPONSE_OFFSET = 1e12


class ResponseFirstAdmission(CandidateAdmission):
    """First segments whenever KV blocks and slots allow; resumes only while they do not slow
    the running first segments down (module docstring).

    Every token of a running first segment is on a task's response time, and every sequence in
    the batch lengthens each step. So the batch is kept at a step time of at most `step_factor`
    times the fastest step the engine has shown (the batch of one, predicted by
    `BatchSpeedModel`): a resume is admitted only if the step with it stays under that, and
    running resumes are asked to yield at their next boundary while the measured step is over
    it, while a response due within `horizon_s` runs; otherwise resumes run as fast as the
    batch allows. With `cap_between_responses` the cap holds at every step, since a response
    can arrive at any moment and joins whatever batch is running."""

    # The walk stops at the first refusal, as vLLM's waiting queue does: first segments rank
    # above every resume, and once one resume is refused for the step cap every later one is
    # (the batch only grows during a pass), so walking on would only cost time in overload.
    skip_refused = False

    def __init__(self, max_num_seqs: int | None = None, step_factor: float = 1.5,
                 horizon_s: float = 5.0, *, speed_model: BatchSpeedModel | None = None,
                 cap_between_responses: bool = False):
        if not (step_factor >= 1 and math.isfinite(step_factor)):
            raise ValueError(f"step_factor: must be a finite number >= 1, got {step_factor!r}")
        self.max_num_seqs = max_num_seqs
        self.step_factor = float(step_factor)
        self.horizon_s = float(horizon_s)
        self.speed_model = speed_model if speed_model is not None else BatchSpeedModel()
        self._step_cap_s: float | None = None
        self.cap_between_responses = bool(cap_between_responses)

    def begin_pass(self, admission_pass: AdmissionPass) -> None:
        self._step_cap_s = self._cap(admission_pass.running, admission_pass.now)

    def _cap(self, running: Sequence[RunningGen], now: float) -> float | None:
        """Longest step that keeps responses fast, or None when no response due within
        `horizon_s` is running (a best-effort task due in a minute needs no fast steps). With
        `cap_between_responses` it holds at every step: the next response to arrive joins
        whatever batch resumes swelled meanwhile."""
        due = now + self.horizon_s
        if not self.cap_between_responses and not any(
                g.segment_index == 0 and g.deadline_s <= due for g in running):
            return None
        fastest = self.speed_model.step_time_s(1)
        return None if fastest is None or fastest <= 0 else self.step_factor * fastest

    def may_admit_candidate(self, batch: Sequence[RunningGen], candidate: Candidate,
                            free_kv_blocks: int) -> tuple[bool, str]:
        if candidate.blocks_needed > free_kv_blocks:
            return False, f"kv blocks: need {candidate.blocks_needed}, free {free_kv_blocks}"
        if self.max_num_seqs is not None and len(batch) >= self.max_num_seqs:
            return False, f"all {self.max_num_seqs} slots taken"
        if candidate.segment_index == 0:
            return True, "a response: admitted whenever it fits"
        cap = self._step_cap_s
        if cap is None:
            return True, "no running response to protect"
        step = self.speed_model.step_time_s(len(batch) + 1)
        if step is not None and step > cap:
            return False, (f"resume refused: a step with {len(batch) + 1} sequences would take "
                           f"{step * 1e3:.1f} ms, over {cap * 1e3:.1f} ms while responses run")
        return True, "responses stay fast"

    def yield_below(self, running: Sequence[RunningGen], now: float,
                    rate: float | None) -> float | None:
        cap = self._cap(running, now)
        if cap is None or rate is None or not rate > 0:
            return None
        # `rate` is one generation's measured tokens/s, i.e. 1 / the recent step time.
        return _RESPONSE_OFFSET if 1.0 / rate > cap else None

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None:
        if duration_s is not None and batch_size is not None:
            self.speed_model.record(int(batch_size), duration_s)


@dataclass
class WorkConservingTimelyPolicy(TimelyPolicy):
    """The planner's default (module docstring)."""

    name: str = "timelyllm-wc"
    suspend_when: str = "contended"
    hopeless: str = "shed"
    latency_guided_admission: bool = False
    # Longest step, as a multiple of the fastest, while first segments run (ResponseFirstAdmission).
    response_step_factor: float = 1.5
    # Responses due within this many seconds count as running responses for the step cap
    # (only with cap_between_responses off).
    response_horizon_s: float = 5.0
    # Hold the step cap between responses too (the next response joins the running batch).
    # Off by default: measured mixed (docs/bench.md, "Holding the cap between responses").
    cap_between_responses: bool = False
    # Most of the KV cache that preserved pauses may hold (pause_handling).
    preserve_kv_share: float = 0.5

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        out = super().priorities(view, now)
        out[view.segment_index == 0] += _RESPONSE_OFFSET
        return out

    def make_admission(self, ctx: SchedulerContext) -> AdmissionController | None:
        return ResponseFirstAdmission(ctx.max_num_seqs, self.response_step_factor,
                                      self.response_horizon_s,
                                      cap_between_responses=self.cap_between_responses)

    def pause_handling(self, pause: PauseInfo) -> str:
        """Preserve (keep the KV: the resume computes one token) while preserved pauses hold
        at most `preserve_kv_share` of the KV cache; discard beyond (the resume recomputes the
        last partial block, the prefix cache serves the rest while it holds it). Under KV
        pressure the engine revokes preserves before it preempts anything running."""
        ctx = pause.context
        if ctx.engine is None:
            return DISCARD
        own = -(-pause.context_tokens // ctx.kv_block_size)
        if ctx.engine.pinned_blocks() + own <= self.preserve_kv_share * ctx.kv_total_blocks:
            return PRESERVE
        return DISCARD
