"""TimelyLLM with batch control predicted from the cost model (`timelyllm-pred`).

The ranking is the default's (`timelyllm-wc`, core/policies/work_conserving.py): responses (first
segments) above every resume, PUD scaled by slack within each class, hopeless first segments
shed, work-conserving suspension. What differs is how the batch is controlled: instead of a step
cap, a prefill hold and a response horizon chosen on presets, every admission pass builds a
frozen `DecisionSnapshot` (core/sched/decision.py) and takes its admissions, holds and yields
from `decide`, which predicts each segment's finish under each choice with the step-time model
learned online from the engine's steps (core/sched/step_model.py; the engine's cost profile is
its prior) and maximises the summed predicted utility of the tasks' TUFs. docs/batch-control.md
explains the rule, the knobs and the measured figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

import numpy as np

from timelyllm_ros.core.engine.base import ReplicaRoom
from timelyllm_ros.core.policies.builtin import TimelyPolicy
from timelyllm_ros.core.policies.responses_first import (preserve_within_share,
                                                         responses_first)
from timelyllm_ros.core.sched.arrival_rates import ArrivalRates
from timelyllm_ros.core.sched.decision import (BatchDecision, CandidateQueue, DecisionSnapshot,
                                               IncomingResponses, RunningSet,
                                               StepCoefficients, decide)
from timelyllm_ros.core.sched.interface import (AdmissionController, AdmissionPass, Candidate,
                                                CandidateAdmission, PauseInfo, RunningGen,
                                                SchedulerContext, StepInfo)
from timelyllm_ros.core.sched.queue_view import QueueView
from timelyllm_ros.core.sched.step_model import StepTimeModel


# The first-segment length distribution is passed to the decision as this many equally likely
# values (the midpoints of as many equal-probability bins): a numerical resolution
# (`PredictiveTimelyPolicy.length_quantiles`, swept in docs/batch-control.md).
LENGTH_QUANTILES = 8


class FirstSegmentMeans:
    """Mean tokens of a first segment per skill set, and per segment bound, from what the
    admission passes see of the running batch: a generation seen on its first segment and then
    on a later one, or gone, had about as many tokens as when last seen. A queued candidate's
    skill set is not one of the queue's columns, but its bound is (each skill set has its own
    max_segment_tokens), so candidates are priced by bound. Before a first measurement the bound
    is the estimate (the most a segment can take)."""

    def __init__(self, quantiles: int = LENGTH_QUANTILES) -> None:
        if isinstance(quantiles, bool) or not isinstance(quantiles, int) or quantiles < 1:
            raise ValueError(f"length_quantiles: must be an integer >= 1, got {quantiles!r}")
        self.quantiles = quantiles
        self._sum: dict = {}
        self._count: dict = {}
        self._watching: dict[str, tuple[str, int, int]] = {}
        # Per segment bound: how many first segments had each length (index = tokens).
        self._lengths: dict[int, np.ndarray] = {}
        # `length_quantiles` per bound, until a first segment of that bound is next measured
        # (asked for every arrival class at every pass; measured far less often).
        self._quantiles: dict[int, np.ndarray] = {}

    def observe(self, running: Sequence[RunningGen]) -> None:
        still = {g.key: (g.skill_set, g.bound_tokens, g.tokens_this_run) for g in running
                 if g.segment_index == 0}
        for key, (skill_set, bound, tokens) in self._watching.items():
            if key not in still:
                for group in (skill_set, ("bound", bound)):
                    self._sum[group] = self._sum.get(group, 0.0) + max(1, tokens)
                    self._count[group] = self._count.get(group, 0) + 1
                counts = self._lengths.setdefault(bound, np.zeros(max(1, bound) + 1))
                counts[min(max(1, tokens), len(counts) - 1)] += 1
                self._quantiles.pop(bound, None)
        self._watching = still

    def _mean(self, group, bound: int) -> float:
        n = self._count.get(group)
        if not n:
            return float(max(1, bound))
        return min(float(max(1, bound)), self._sum[group] / n)

    def tokens(self, skill_set: str, bound: int) -> float:
        return self._mean(skill_set, bound)

    def length_quantiles(self, bound: int) -> np.ndarray:
        """`quantiles` equally likely first-segment lengths for segments of `bound` tokens (the
        measured distribution's quantiles at the midpoints of as many equal bins); the bound
        itself before any was measured."""
        bound = int(bound)
        known = self._quantiles.get(bound)
        if known is None:
            known = self._quantiles[bound] = self._measured_quantiles(bound)
            known.setflags(write=False)
        return known

    def _measured_quantiles(self, bound: int) -> np.ndarray:
        n = self.quantiles
        counts = self._lengths.get(bound)
        if counts is None or not counts.sum():
            return np.full(n, float(max(1, bound)))
        cdf = np.cumsum(counts) / counts.sum()
        levels = (np.arange(n) + 0.5) / n
        return np.searchsorted(cdf, levels, side="left").astype(np.float64).clip(min=1.0)

    def tokens_by_bound(self, bounds: np.ndarray) -> np.ndarray:
        """For an array of segment bounds: the measured first-segment tokens of each."""
        values, inverse = np.unique(bounds, return_inverse=True)
        means = np.array([self._mean(("bound", int(b)), int(b)) for b in values])
        return means[inverse] if len(values) else np.zeros(0)


class PredictiveAdmission(CandidateAdmission):
    """Answers the scheduler's walk from one `decide` per pass (module docstring).

    On a fleet whose replicas step on their own (`AdmissionPass.replica_rooms`), one `decide`
    per replica: a segment's finish depends only on the batch of the replica it runs on, so
    each replica's decision sees its own running generations, the queued candidates it would
    run (in walk order: a resume's task's replica, a new plan the router's pick of now,
    `AdmissionPass.candidate_replicas`), its own free KV blocks and slots, and the arrivals it
    will get: the fleet's measured rate divided by the number of replicas (the router spreads
    new plans over them; counting each replica's own arrivals is not done)."""

    # The decision has chosen the whole pass: the walk skips what it holds and goes on to the
    # next key it admits (the shortlist), without building a candidate for the others.
    skip_refused = True
    reads_preserved_blocks = True
    reads_replicas = True

    def __init__(self, model: StepTimeModel, *, step_token_budget: int, kv_block_size: int,
                 max_num_seqs: int | None = None, lengths: FirstSegmentMeans | None = None,
                 resume_weight: float = 1.0, arrivals: ArrivalRates | None = None):
        if not (0 <= resume_weight and np.isfinite(resume_weight)):
            raise ValueError(f"resume_weight: must be a finite number >= 0, got {resume_weight!r}")
        self.resume_weight = float(resume_weight)
        self.model = model
        self.step_token_budget = int(step_token_budget)
        self.kv_block_size = int(kv_block_size)
        self.max_num_seqs = max_num_seqs
        self.lengths = lengths if lengths is not None else FirstSegmentMeans()
        # None: resumes are not priced by the responses that arrive while they run.
        self.arrivals = arrivals
        self.decision: BatchDecision | None = None
        self._decided_at: float | None = None
        self._admit: frozenset = frozenset()
        self.last_snapshot: DecisionSnapshot | None = None
        # On a fleet: each replica's snapshot of the last decision, by replica index (empty on
        # one engine), and how many replicas the last pass saw (None: one engine).
        self.replica_snapshots: dict[int, DecisionSnapshot] = {}
        self.replicas: int | None = None

    # ---- snapshot
    def running_set(self, running: Sequence[RunningGen]) -> RunningSet:
        remaining = []
        for g in running:
            if g.segment_index == 0:
                left = self.lengths.tokens(g.skill_set, g.bound_tokens) - g.tokens_this_run
            else:
                # A resume's run may go on past its first boundary (work-conserving): then
                # how far into its current segment it is is not known, and its bound is the
                # most the segment can still take.
                left = g.bound_tokens - g.tokens_this_run
                if left < 1:
                    left = g.bound_tokens
            remaining.append(max(1.0, left))
        return RunningSet.build(
            [g.key for g in running], remaining, [g.context_tokens for g in running],
            [g.deadline_s for g in running], [g.initial_utility for g in running],
            [g.slope * (self.resume_weight if g.segment_index else 1.0) for g in running],
            [g.segment_index for g in running],
            [g.is_urgent for g in running])

    def candidate_queue(self, p: AdmissionPass) -> CandidateQueue:
        view, rows = p.view, p.rows
        context = view.context_tokens[rows]
        bound = view.bound_tokens[rows]
        blocks = -(-(context + bound) // p.block_size)
        # Read from the paused generations (a few dozen), not the queue (thousands).
        for j, held in p.preserved_blocks.held_at():
            blocks[j] -= held
        segment_index = view.segment_index[rows]
        first = segment_index == 0
        # A first segment is priced at the measured first segments of its bound (its skill
        # set's), a resume's at its bound.
        segment = np.maximum(bound, 1).astype(np.float64)
        if first.any():
            segment[first] = self.lengths.tokens_by_bound(bound[first])
        slope = view.slope[rows]
        return CandidateQueue(
            tuple(p.keys), view.prefill_tokens[rows].astype(np.float64),
            segment, bound.astype(np.float64),
            context.astype(np.float64), blocks,
            view.reference_s[rows] + view.ert_s[rows], view.initial_utility[rows],
            np.where(first, slope, slope * self.resume_weight), segment_index)

    def snapshot(self, now: float, running: Sequence[RunningGen],
                 candidates: CandidateQueue, free_kv_blocks: int) -> DecisionSnapshot:
        free_slots = None
        if self.max_num_seqs is not None:
            free_slots = max(0, self.max_num_seqs - len(running))
        return self._snapshot(now, running, candidates, free_kv_blocks, free_slots,
                              self.coefficients(), self.incoming(now))

    def coefficients(self) -> StepCoefficients:
        """The step model's coefficients as now learnt."""
        return StepCoefficients(*map(float, self.model.coefficient_array()))

    def _snapshot(self, now: float, running: Sequence[RunningGen], candidates: CandidateQueue,
                  free_kv_blocks: int, free_slots: int | None, coef: StepCoefficients,
                  incoming: IncomingResponses) -> DecisionSnapshot:
        return DecisionSnapshot(now, self.running_set(running), candidates, int(free_kv_blocks),
                                free_slots, self.step_token_budget, coef, self.kv_block_size,
                                incoming)

    def incoming(self, now: float, share: float = 1.0) -> IncomingResponses:
        """The measured arrival classes, each priced at its bound's measured first segment;
        `share`: the part of the arrivals this decision's engine gets (a replica's)."""
        if self.arrivals is None:
            return IncomingResponses.empty()
        classes = self.arrivals.classes(now)
        if not classes:
            return IncomingResponses.empty()
        return IncomingResponses.build(
            [rate * share for _, rate, _, _ in classes], [pre for _, _, pre, _ in classes],
            [ctx for *_, ctx in classes],
            np.array([self.lengths.length_quantiles(key[2]) for key, *_ in classes]),
            [key[0] for key, *_ in classes], [key[1] for key, *_ in classes])

    def _observe_arrivals(self, p: AdmissionPass) -> None:
        if self.arrivals is None:
            return
        view, rows = p.view, p.rows
        first = rows[view.segment_index[rows] == 0]
        self.arrivals.observe(p.now, view.arrival_s[first], view.ert_s[first],
                              view.slope[first], view.bound_tokens[first],
                              view.prefill_tokens[first], view.context_tokens[first])

    # ---- per replica of a fleet
    def decide_per_replica(self, now: float, running: Sequence[RunningGen],
                           candidates: CandidateQueue, where: np.ndarray,
                           rooms: Sequence[ReplicaRoom]) -> BatchDecision:
        """One `decide` per replica (class docstring), merged: admissions in walk order.
        `where`: each candidate's replica (-1: none can take it; it is not admitted)."""
        self.replicas = n = len(rooms)
        on = [[] for _ in range(n)]
        for g in running:
            if g.replica is not None and 0 <= g.replica < n:
                on[g.replica].append(g)
        coef = self.coefficients()
        incoming = self.incoming(now, 1.0 / n)
        admitted, hold, yields = [], {}, {}
        self.replica_snapshots = {}
        for r, room in enumerate(rooms):
            mine = np.flatnonzero(where == r)
            snap = self._snapshot(now, on[r], candidates.take(mine), room.free_blocks,
                                  room.free_slots, coef, incoming)
            decision = decide(snap)
            self.replica_snapshots[r] = snap
            admitted.extend(mine[list(decision.admit_positions)].tolist())
            hold.update(decision.hold)
            yields.update(decision.yields)
        admitted.sort()
        keys = candidates.keys
        return BatchDecision(tuple(keys[j] for j in admitted), hold, yields, tuple(admitted))

    # ---- CandidateAdmission
    def begin_pass(self, admission_pass: AdmissionPass) -> None:
        p = admission_pass
        self.lengths.observe(p.running)
        self._observe_arrivals(p)
        queue = self.candidate_queue(p)
        if p.replica_rooms is not None and p.candidate_replicas is not None:
            decision = self.decide_per_replica(p.now, p.running, queue, p.candidate_replicas,
                                               p.replica_rooms)
            self._set(decision, p.now, None)
            return
        self.replicas = None
        snap = self.snapshot(p.now, p.running, queue, p.free_kv_blocks)
        self._set(decide(snap), p.now, snap)

    def _set(self, decision: BatchDecision, now: float, snap: DecisionSnapshot | None) -> None:
        self.decision = decision
        self._decided_at = now
        self._admit = frozenset(decision.admit)
        self.last_snapshot = snap

    def shortlist(self) -> Collection | None:
        return self._admit

    def shortlist_positions(self) -> Sequence[int] | None:
        # The decision's positions are in the pass's candidate queue, built from its keys.
        return None if self.decision is None else self.decision.admit_positions

    def may_admit_candidate(self, batch: Sequence[RunningGen], candidate: Candidate,
                            free_kv_blocks: int) -> tuple[bool, str]:
        if candidate.key not in self._admit:
            hold = {} if self.decision is None else self.decision.hold
            return False, hold.get(candidate.key, "not reached by the decision's walk")
        if candidate.blocks_needed > free_kv_blocks:
            return False, f"kv blocks: need {candidate.blocks_needed}, free {free_kv_blocks}"
        if self.max_num_seqs is not None and len(batch) >= self.max_num_seqs:
            return False, f"all {self.max_num_seqs} slots taken"
        return True, "admitted by the predicted-utility decision"

    def yield_keys(self, running: Sequence[RunningGen], now: float) -> Collection[str]:
        if self._decided_at != now:
            # No admission pass ran at this step (empty queue): decide on the batch alone.
            self.lengths.observe(running)
            if self.replicas is not None:
                # Nothing queued: no room to share out, no slot to count.
                rooms = [ReplicaRoom(0, None)] * self.replicas
                self._set(self.decide_per_replica(now, running, CandidateQueue.empty(),
                                                  np.zeros(0, np.int64), rooms), now, None)
                return self.decision.yields.keys()
            snap = self.snapshot(now, running, CandidateQueue.empty(), 0)
            self._set(decide(snap), now, snap)
        return self.decision.yields.keys()


@dataclass
class PredictiveTimelyPolicy(TimelyPolicy):
    """`timelyllm-pred` (module docstring). Knobs: the step model's `prior_steps` and
    `memory_steps` (core/sched/step_model.py), and `preserve_kv_share` as in `timelyllm-wc`."""

    name: str = "timelyllm-pred"
    suspend_when: str = "contended"
    hopeless: str = "shed"
    latency_guided_admission: bool = False
    prior_steps: float = 50.0
    memory_steps: float = 2000.0
    preserve_kv_share: float = 0.5
    # What a resume's lateness weighs in the decision, as a multiple of its task's TUF slope:
    # 1 is the paper's suspended TUF; 0 ranks every response's utility above any resume's
    # timeliness (the bench's utility counts first segments only). docs/batch-control.md.
    resume_weight: float = 0.0
    # Seconds of arrivals over which each class's arrival rate is measured, for pricing what a
    # resume does to the responses that arrive while it runs (None: not priced).
    # docs/batch-control.md.
    arrival_window_s: float | None = 5.0
    # Equally likely first-segment lengths an arrival class is priced at (LENGTH_QUANTILES).
    length_quantiles: int = LENGTH_QUANTILES

    def __post_init__(self) -> None:
        super().__post_init__()
        self.step_model: StepTimeModel | None = None

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        return responses_first(super().priorities(view, now), view)

    def make_admission(self, ctx: SchedulerContext) -> AdmissionController | None:
        self.step_model = StepTimeModel(ctx.profile, informed=ctx.profile is not None,
                                        prior_steps=self.prior_steps,
                                        memory_steps=self.memory_steps)
        budget = ctx.max_num_batched_tokens
        if not budget:
            budget = self.step_model.profile.max_num_batched_tokens
        return PredictiveAdmission(self.step_model, step_token_budget=int(budget),
                                   kv_block_size=ctx.kv_block_size,
                                   max_num_seqs=ctx.max_num_seqs,
                                   resume_weight=self.resume_weight,
                                   lengths=FirstSegmentMeans(self.length_quantiles),
                                   arrivals=None if self.arrival_window_s is None
                                   else ArrivalRates(self.arrival_window_s))

    def on_step(self, step: StepInfo) -> None:
        if self.step_model is None:
            return
        if step.replica is None:
            self.step_model.observe(step.duration_s, step.batch_size, step.context_tokens,
                                    step.prefill_tokens)
            return
        # A fleet's replica stepped on its own: its step is learnt against its own batch, and
        # its share of the running context (the scheduler counts the fleet's; its generations
        # are alike, so a replica's context is about its share of the running count).
        batch = step.replica_batch_size
        context = step.context_tokens * batch // step.batch_size if step.batch_size else 0
        self.step_model.observe(step.duration_s, batch, context, step.prefill_tokens)

    def pause_handling(self, pause: PauseInfo) -> str:
        return preserve_within_share(pause, self.preserve_kv_share)
