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
  shown, and running resumes yield at their next boundary while the step is over that and no
  response waits for KV blocks (`cap_between_responses` holds the cap at every step). A first
  segment is admitted whenever KV blocks and slots allow (but for the hold below): making it
  wait in the queue is what costs utility.
- **Prefills that would make an earlier response late wait.** Tasks that arrive together, each
  with its own context, share their prefill steps; a queued response waits while a running
  one, due no later, still on its first segment, needs the time its prefill would take
  (`core.policies.prefill_hold`).
- **Work-conserving suspension** (`Policy.suspend_when = "contended"`): a generation is suspended
  at a segment boundary only when the last admission pass refused a generation that ranks above
  it; otherwise it keeps generating and its segments go out as they complete, as streaming does.
- **Overload** (`Policy.hopeless`): a queued first segment whose utility can no longer be
  positive is shed with a reason (default), or served after everything else (`hopeless="serve"`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from timelyllm_ros.core.policies.builtin import TimelyPolicy
from timelyllm_ros.core.policies.prefill_hold import FirstSegmentLengths, PrefillHold
from timelyllm_ros.core.policies.responses_first import (RESPONSE_OFFSET,
                                                         preserve_within_share,
                                                         responses_first)
from timelyllm_ros.core.sched.admission import BatchSpeedModel, ReplicaSpeed
from timelyllm_ros.core.sched.interface import (AdmissionController, AdmissionPass, Candidate,
                                                CandidateAdmission, PauseInfo, RunningGen,
                                                SchedulerContext)
from timelyllm_ros.core.sched.queue_view import QueueView

class ResponseFirstAdmission(CandidateAdmission):
    """First segments whenever KV blocks and slots allow; resumes only while they do not slow
    the running first segments down (module docstring).

    Every token of a running first segment is on a task's response time, and every sequence in
    the batch lengthens each step. So the batch is kept at a step time of at most `step_factor`
    times the fastest step the engine has shown (the shortest step measured so far: in overload
    the batch never gets small, and extrapolating the recent steps' line down to a batch of one
    swung the cap from step to step, to zero at times, which let every queued resume in at
    once; docs/bench.md, "The step cap"): a resume is admitted only if the step with it
    (predicted by `BatchSpeedModel`) stays under that, and running resumes are asked to yield
    at their next boundary while the measured step is over it, while a response due within
    `horizon_s` runs and no response waits for KV blocks (a yield then costs a recompute of
    the resume's whole context); otherwise resumes run as fast as the batch allows. With
    `cap_between_responses` the cap holds at every step, since a response can arrive at any
    moment and joins whatever batch is running. Responses themselves may be held for a pass
    (`prefill_hold`).

    On a fleet whose replicas step on their own (the engine reports `StepTiming.replica`), all
    of this holds per replica: a resume slows only the replica it goes to. Each replica's step
    is learnt against its own batch (`ReplicaSpeed`), a resume is predicted from the running
    count on its replica (`Candidate.replica`) plus one and capped at that replica's fastest
    step, only where a response runs on that replica (every replica with
    `cap_between_responses`), and only the resumes on a replica whose own measured step is over
    its cap yield. A refused resume no longer ends the walk while another replica may still
    take one. A fleet reported as one engine (`ReplicaEngine` over servers steps them all in
    one call) is reasoned about as one engine."""

    # The walk stops at the first refusal, as vLLM's waiting queue does: first segments rank
    # above every resume, and once one resume is refused for the step cap every later one is
    # (the batch only grows during a pass), so walking on would only cost time in overload.
    # On a fleet that holds per replica: the walk goes on past a resume refused on one replica
    # until every replica has refused one (`_resume_on_replica` sets it per refusal).
    skip_refused = False

    def __init__(self, max_num_seqs: int | None = None, step_factor: float = 1.75,
                 horizon_s: float = 5.0, *, speed_model: BatchSpeedModel | None = None,
                 cap_between_responses: bool = False,
                 prefill_hold: PrefillHold | None = None):
        if not (step_factor >= 1 and math.isfinite(step_factor)):
            raise ValueError(f"step_factor: must be a finite number >= 1, got {step_factor!r}")
        self.max_num_seqs = max_num_seqs
        self.step_factor = float(step_factor)
        self.horizon_s = float(horizon_s)
        self.speed_model = speed_model if speed_model is not None else BatchSpeedModel()
        self._step_cap_s: float | None = None
        self._pass_s: float | None = None
        self._response_refused_kv_s: float | None = None
        self.cap_between_responses = bool(cap_between_responses)
        # Queued responses that wait for a running one (core.policies.prefill_hold).
        self.prefill_hold = prefill_hold
        # Per replica of a fleet (empty on one engine), and this pass's view of them: each
        # replica's cap (absent: no cap there), running count and running responses (the batch
        # as far as `_counted`), and the replicas closed to resumes.
        self.replica_speeds: dict[int, ReplicaSpeed] = {}
        self._replica_caps: dict[int, float] = {}
        self._running_on: Counter = Counter()
        self._responses_on: dict[int | None, list[RunningGen]] = {}
        self._counted = 0
        self._closed: set[int] = set()

    def begin_pass(self, admission_pass: AdmissionPass) -> None:
        self._pass_s = admission_pass.now
        self._step_cap_s = self._cap(admission_pass.running, admission_pass.now)
        if self.replica_speeds:
            running = admission_pass.running
            self._replica_caps = self._replica_cap_map(running, admission_pass.now)
            self._running_on, self._responses_on, self._counted = Counter(), {}, 0
            self._closed = set()
            self._see(running)
        if self.prefill_hold is not None:
            rate = admission_pass.rate
            fastest = self.speed_model.fastest_step_s
            step = 1.0 / rate if rate is not None and rate > 0 else fastest
            self.prefill_hold.begin_pass(admission_pass.now, step, admission_pass.running)

    def _cap(self, running: Sequence[RunningGen], now: float) -> float | None:
        """Longest step that keeps responses fast, or None when no response due within
        `horizon_s` is running (a best-effort task due in a minute needs no fast steps). With
        `cap_between_responses` it holds at every step: the next response to arrive joins
        whatever batch resumes swelled meanwhile."""
        due = now + self.horizon_s
        if not self.cap_between_responses and not any(
                g.segment_index == 0 and g.deadline_s <= due for g in running):
            return None
        fastest = self.speed_model.fastest_step_s
        return None if fastest is None else self.step_factor * fastest

    def _replica_cap_map(self, running: Sequence[RunningGen], now: float) -> dict[int, float]:
        """`_cap` for each replica of a fleet: the replicas where a response due within
        `horizon_s` runs (all with `cap_between_responses`), with their caps."""
        factor = self.step_factor
        if self.cap_between_responses:
            return {r: factor * speed.model.fastest_step_s
                    for r, speed in self.replica_speeds.items()
                    if speed.model.fastest_step_s is not None}
        due = now + self.horizon_s
        caps = {}
        for g in running:
            if g.segment_index == 0 and g.deadline_s <= due and g.replica not in caps:
                speed = self.replica_speeds.get(g.replica)
                if speed is not None and speed.model.fastest_step_s is not None:
                    caps[g.replica] = factor * speed.model.fastest_step_s
        return caps

    def _see(self, batch: Sequence[RunningGen]) -> None:
        """Count, per replica, the generations of `batch` not yet counted (those the walk
        admitted since the last candidate; it only appends during a pass)."""
        if len(batch) < self._counted:  # (a displacement shrank it: count again)
            self._running_on, self._responses_on, self._counted = Counter(), {}, 0
        for g in batch[self._counted:]:
            self._running_on[g.replica] += 1
            if g.segment_index == 0:
                self._responses_on.setdefault(g.replica, []).append(g)
        self._counted = len(batch)

    def _resume_on_replica(self, batch: Sequence[RunningGen],
                           replica: int) -> tuple[bool, str]:
        self._see(batch)
        cap = self._replica_caps.get(replica)
        if cap is None:
            return True, f"no running response to protect on replica {replica}"
        size = self._running_on[replica] + 1
        step = self.replica_speeds[replica].model.step_time_s(size)
        if step is not None and step > cap:
            # Its replica's batch only grows during the pass, so every later resume there is
            # refused too; the walk goes on while another replica may still take one.
            self._closed.add(replica)
            self.skip_refused = len(self._closed) < len(self.replica_speeds)
            return False, (f"resume refused: a step of replica {replica} with {size} sequences "
                           f"would take {step * 1e3:.1f} ms, over {cap * 1e3:.1f} ms while "
                           f"responses run there")
        return True, f"responses on replica {replica} stay fast"

    def may_admit_candidate(self, batch: Sequence[RunningGen], candidate: Candidate,
                            free_kv_blocks: int) -> tuple[bool, str]:
        self.skip_refused = False  # (but for a resume refused on one replica of a fleet)
        if candidate.blocks_needed > free_kv_blocks:
            if candidate.segment_index == 0:
                self._response_refused_kv_s = self._pass_s
            return False, f"kv blocks: need {candidate.blocks_needed}, free {free_kv_blocks}"
        if self.max_num_seqs is not None and len(batch) >= self.max_num_seqs:
            return False, f"all {self.max_num_seqs} slots taken"
        if candidate.segment_index == 0:
            hold = self.prefill_hold
            protected = None
            if hold is not None:
                if self.replica_speeds and candidate.replica is not None:
                    # A prefill slows only the responses on its own replica.
                    self._see(batch)
                    protected = hold.response_to_protect(
                        self._responses_on.get(candidate.replica, ()), candidate)
                else:
                    protected = hold.response_to_protect(batch, candidate)
            if protected is not None:
                return False, (f"response held: its {candidate.prefill_tokens}-token prefill "
                               f"would make {protected.key} late")
            if hold is not None:
                hold.note_admitted(candidate)
            return True, "a response: admitted whenever it fits"
        if self.replica_speeds and candidate.replica is not None:
            return self._resume_on_replica(batch, candidate.replica)
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
        # While a response waits for KV blocks (refused in this pass), whatever a yielding
        # resume frees goes to it and the resume's prefix leaves the cache: its resume would
        # prefill its whole context again, in steps that carry responses. Measured on the KV-
        # limited profiles (docs/bench.md, "The step cap"): fp8-rtx4080 mixed-fleet-long
        # -0.304 with these yields, 0.422 without.
        if self._response_refused_kv_s == now or self.replica_speeds:
            return None  # (a fleet's replicas yield by key: yield_keys)
        cap = self._cap(running, now)
        if cap is None or rate is None or not rate > 0:
            return None
        # `rate` is one generation's measured tokens/s, i.e. 1 / the recent step time.
        return RESPONSE_OFFSET if 1.0 / rate > cap else None

    def yield_keys(self, running: Sequence[RunningGen], now: float) -> list[str]:
        """On a fleet: the running resumes on replicas whose own recent step is over their cap
        (`yield_below` for one engine)."""
        if not self.replica_speeds or self._response_refused_kv_s == now:
            return []
        over = set()
        for replica, cap in self._replica_cap_map(running, now).items():
            step = self.replica_speeds[replica].recent_step_s()
            if step is not None and step > cap:
                over.add(replica)
        if not over:
            return []
        return [g.key for g in running if g.segment_index > 0 and g.replica in over]

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None:
        if duration_s is not None and batch_size is not None:
            self.speed_model.record(int(batch_size), duration_s)

    def note_replica_step(self, replica: int, duration_s: float, batch_size: int) -> None:
        speed = self.replica_speeds.get(replica)
        if speed is None:
            speed = self.replica_speeds[replica] = ReplicaSpeed(self.speed_model.window)
        speed.record(int(batch_size), duration_s)


@dataclass
class WorkConservingTimelyPolicy(TimelyPolicy):
    """The planner's default (module docstring)."""

    name: str = "timelyllm-wc"
    suspend_when: str = "contended"
    hopeless: str = "shed"
    latency_guided_admission: bool = False
    # Longest step, as a multiple of the fastest, while first segments run (ResponseFirstAdmission).
    response_step_factor: float = 1.75
    # Responses due within this many seconds count as running responses for the step cap
    # (only with cap_between_responses off).
    response_horizon_s: float = 5.0
    # Hold the step cap between responses too (the next response joins the running batch).
    # Off by default: measured mixed (docs/bench.md, "Holding the cap between responses").
    cap_between_responses: bool = False
    # The prefill hold (core.policies.prefill_hold): a response due later waits while one due
    # earlier is on its first segment, if its prefill is at least this share of that one's
    # slack (None: no hold).
    prefill_hold_share: float | None = 0.1
    # Tokens assumed for a skill set's first segment until one has been measured.
    first_segment_tokens: float = 8.0
    # Most of the KV cache that preserved pauses may hold (pause_handling).
    preserve_kv_share: float = 0.5

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        return responses_first(super().priorities(view, now), view)

    def make_admission(self, ctx: SchedulerContext) -> AdmissionController | None:
        # Pricing a prefill needs the engine's cost profile (simulated engines; a real engine
        # given one, the planner's `engine.profile`); without it nothing is held.
        hold = None
        if ctx.profile is not None and self.prefill_hold_share is not None:
            hold = PrefillHold(ctx.profile.prefill_s, self.prefill_hold_share,
                               FirstSegmentLengths(self.first_segment_tokens))
        return ResponseFirstAdmission(ctx.max_num_seqs, self.response_step_factor,
                                      self.response_horizon_s,
                                      cap_between_responses=self.cap_between_responses,
                                      prefill_hold=hold)

    def pause_handling(self, pause: PauseInfo) -> str:
        return preserve_within_share(pause, self.preserve_kv_share)
