"""Batch control as one pure function: a frozen snapshot in, admissions, holds and yields out.

`decide(snapshot)` is what the `timelyllm-pred` policy (core/policies/predictive.py) asks at
every admission pass, and it needs no engine: the snapshot holds the running batch, the queued
candidates in the scheduler's walk order, the free KV blocks and slots, the engine's token
budget per step and the step model's coefficients (core/sched/step_model.py). The way vLLM keeps
`SchedulerOutput` apart from its requests.

**Prediction.** Every choice is priced by when it makes each segment finish. With `b` sequences
in the batch, `ctx` context tokens over them and `P` prefill tokens admitted but not yet
computed, a step decodes one token of every running generation and prefills at most
`chunk = budget - running` tokens (vLLM V1: decodes first, prefills chunked into what is
left). A generation `m` steps from its segment end finishes after

    t(m) = m * step(b, ctx) + prefill_per_token * min(P, m * chunk)
           + prefill_fixed * min(m, ceil(P / chunk))

(every running generation pays the prefill steps it shares). An admitted candidate is
`ceil(Q / chunk) + L - 1` steps from its segment end, `Q` the prefill admitted up to and
including its own (the walk order is the engine's order) and `L` the tokens of its segment
(its first token comes with its last prefill chunk). Utility at a finish `t` is its task's TUF,
`U0 - k * max(0, now + t - deadline)`: a first segment's deadline is arrival + ERT, a resume's
when its robot finishes the previous segment (`TUF.for_suspended`).

**Admission** (a greedy pass in walk order, the scheduler's priority order). A candidate that
fits the free KV blocks and slots is admitted when what it gains by starting now, against
waiting until the generations its admission would make late have finished, is at least what
it costs them (the utility they lose). So a candidate that costs nobody anything is admitted
(work conserving), one with slack to spare waits while its admission would make someone else
late, and an urgent one is admitted when its own lateness outweighs theirs.

**Yields** (a resume at its next segment boundary). A running resume is asked to yield when
taking it out of the batch after its boundary brings late generations back on time, for more
utility than it costs the resume (its next segment starting after they finish rather than
right away, against the deadline of the segment it is on); resumes with the most slack go
first. A generation still late without the resume does not count: it is late either way, and
the resume's work, queued again, only moves to steps that carry someone else (counting it
cost 0.015 of mean utility on mixed-fleet x16, docs/batch-control.md). A queued first segment
that does not fit the KV blocks or slots asks the resumes with the most slack to yield enough
for it when the utility it would then get exceeds what they lose (waiting for a whole plan to
end instead is not predictable from here: taken as its cut-off, zero utility).

**Responses that arrive** (`snap.incoming`, measured by the policy's adapter per class of
task: arrival rate, prompt, first-segment length distribution, TUF). A resume also costs the
responses that arrive while it runs: each class's `rate * residency` arrivals, each made later
by the resume's share of every step of its first segment (expected lateness over the class's
measured lengths). That cost is added to a candidate resume's admission (a response never pays
it: it cannot wait out the responses behind it; nor does a resume the engine would otherwise
idle for), and a running resume that would go on past its boundary yields there when its next
segment costs the arrivals more than it loses by waiting that long. A resume with a TUF slope
waits at most as long again as it is already late (rent or buy). docs/batch-control.md.

Everything is vectorised with numpy over the candidates (in blocks) and over the generations a
choice can hurt (those that could still be made later than their deadline); the walk stops as
soon as no slot or no candidate's blocks remain. A pass settles a stretch of the one-at-a-time
walk, not one admission: it guesses which candidates of its block the walk admits (at first
none, then what the previous pass found for each) and prices each candidate on the batch with
the guessed admissions before it. Every candidate up to the first the pass decides otherwise
than guessed was priced on the batch the walk would have, so that stretch, that candidate
included, is exact; the next pass starts after it. One pass settles a run of holds, a run of
admissions, or (the guesses mostly right) an overloaded queue's mix of both. A pass's work is
O(block * (generations at risk + guessed admissions)). Before the walk, the resumes it can
show it never admits (slope 0, when even the smallest of them costs the arrivals something:
`_never_worth`) are set aside unpriced and given the holds the walk would give them; in
overload they are most of the queue. `bench/decision_cost.py` measures a pick. The prediction and its arithmetic: core/sched/decision_batch.py; the yields:
core/sched/decision_yields.py.
"""

from __future__ import annotations

import numpy as np

from timelyllm_ros.core.sched.decision_batch import PredictedBatch
from timelyllm_ros.core.sched.decision_records import (BatchDecision, CandidateQueue,
                                                       DecisionSnapshot, HoldReasons,
                                                       IncomingResponses, RunningSet,
                                                       StepCoefficients)
from timelyllm_ros.core.sched.decision_yields import (YIELD_INCOMING, YIELD_ROOM, YIELD_SPEED,
                                                      yields)

__all__ = ["BatchDecision", "CandidateQueue", "DecisionSnapshot", "HOLD_COST", "HOLD_KV",
           "HOLD_SLOTS", "IncomingResponses", "RunningSet", "StepCoefficients", "YIELD_INCOMING",
           "YIELD_ROOM", "YIELD_SPEED", "decide"]

# Candidates evaluated together in one numpy pass (a block); a block's work is
# O(block * (generations at risk + guessed admissions)). A throughput setting, not a policy one: the decision is the
# same for any block size (test).
CANDIDATE_BLOCK = 128

HOLD_KV = "kv blocks: it needs more than are free"
HOLD_SLOTS = "no free slot"
HOLD_COST = "admitting it now would cost the running ones more utility than it gains by not waiting"


def decide(snap: DecisionSnapshot) -> BatchDecision:
    """The decision for `snap` (module docstring). Deterministic, and it never admits more than
    the free KV blocks and slots hold."""
    batch = PredictedBatch(snap)
    cand = snap.candidates
    never = _never_worth(cand, batch)
    if never is None:
        outcome = _walk(cand, snap.free_kv_blocks, snap.free_slots, batch)
    else:
        # The walk over the others decides exactly as over all (those never admitted change
        # neither the batch nor the room); they get the hold the walk would have given them.
        walked = np.flatnonzero(~never)
        outcome = np.empty(len(cand), dtype=np.int8)
        outcome[walked] = _walk(cand.take(walked), snap.free_kv_blocks, snap.free_slots, batch)
        outcome[never] = _hold_unwalked(cand, np.flatnonzero(never), walked, outcome[walked],
                                        snap.free_kv_blocks, snap.free_slots)
    keys = cand.keys
    admitted = tuple(np.flatnonzero(outcome == _ADMITTED).tolist())
    admit = tuple(keys[j] for j in admitted)
    hold = HoldReasons(keys, outcome, _REASONS, np.flatnonzero(outcome > _ADMITTED))
    held_for_room = np.flatnonzero((outcome == _HELD_KV) | (outcome == _HELD_SLOTS)).tolist()
    return BatchDecision(admit, hold, yields(snap, batch, held_for_room), admitted)


# What the walk did with each candidate (0: not reached).
_ADMITTED, _HELD_COST, _HELD_KV, _HELD_SLOTS = 1, 2, 3, 4
_REASONS = {_HELD_COST: HOLD_COST, _HELD_KV: HOLD_KV, _HELD_SLOTS: HOLD_SLOTS}


def _never_worth(cand: CandidateQueue, batch: PredictedBatch) -> np.ndarray | None:
    """The candidates the walk can be shown never to admit without pricing each (None if it
    cannot): resumes whose lateness weighs nothing (slope 0, the default `resume_weight`), when
    even one with the smallest context, prompt and segment among them would cost the arriving
    responses something on the batch as it is now.

    Such a resume gains nothing by starting now, so the walk admits it only at zero cost. Its
    cost to the arrivals grows with its context (a longer step), with its prompt and segment
    (a longer residency), and with the batch (lateness is convex in the step time, and the walk
    only adds to the batch). So if that smallest resume costs them more than nothing, each of
    them does, at every point of the walk. In overload they are most of a queue of thousands;
    pricing them was most of a decision's time."""
    if not len(batch.incoming) or batch.size <= 0 or not len(cand):
        return None
    never = (cand.slope == 0) & (cand.segment_index > 0)
    if not never.any():
        return None
    context = cand.context_tokens[never].min()
    prefill = batch.prefill + cand.prefill_tokens[never].min()
    step = batch.step_s(batch.size + 1.0, batch.context + context)
    residency = batch.finish_at(batch.own_steps(prefill, cand.segment_tokens[never].min()),
                                step, prefill)
    cost = batch.incoming_cost(batch.size, batch.context, np.array([context]),
                               np.array([residency]))
    return never if cost[0] > 0 else None


def _hold_unwalked(cand: CandidateQueue, unwalked: np.ndarray, walked: np.ndarray,
                   walked_outcome: np.ndarray, free_blocks: int,
                   free_slots: int | None) -> np.ndarray:
    """The hold the walk gives each candidate at `unwalked` (positions, ascending) that it
    never admits, from what it did with the others: no slot left once the admission that took
    the last one is behind it; else its blocks against those left by the admissions before
    it (kv, or the cost that holds it)."""
    admitted = walked[walked_outcome == _ADMITTED]
    before = np.searchsorted(admitted, unwalked)
    taken = np.concatenate(([0], np.cumsum(cand.blocks_needed[admitted])))[before]
    out = np.where(cand.blocks_needed[unwalked] <= free_blocks - taken, _HELD_COST, _HELD_KV)
    if free_slots is not None:
        if free_slots <= 0:
            out[:] = _HELD_SLOTS
        elif len(admitted) >= free_slots:
            out[unwalked > admitted[free_slots - 1]] = _HELD_SLOTS
    return out.astype(np.int8)


def _walk(cand: CandidateQueue, free_kv_blocks: int, free_slots: int | None,
          batch: PredictedBatch) -> np.ndarray:
    """What the walk does with each candidate of `cand`, in walk order (`_ADMITTED`,
    `_HELD_*`); the admissions are added to `batch`, and the room they leave set on it."""
    n = len(cand)
    outcome = np.zeros(n, dtype=np.int8)
    free_blocks = int(free_kv_blocks)
    if n == 0:
        return outcome
    # Smallest need from each position on: the walk stops when nothing further fits.
    min_need_from = np.minimum.accumulate(cand.blocks_needed[::-1])[::-1]
    # What a pass takes the walk to do with each candidate: at first nothing admitted, then
    # what the latest pass found for it (module docstring).
    guess = np.zeros(n, dtype=bool)
    start = 0
    block = CANDIDATE_BLOCK
    while start < n:
        if free_slots is not None and free_slots <= 0:
            break
        if min_need_from[start] > free_blocks:
            break
        stop = min(n, start + block)
        if free_slots is not None:
            # Past the guessed admission that takes the last slot the walk would stop.
            last = np.flatnonzero(np.cumsum(guess[start:stop]) >= free_slots)
            stop = stop if not len(last) else start + int(last[0]) + 1
        sl = slice(start, stop)
        admitted_before = guess[sl]
        need = cand.blocks_needed[sl]
        fits = need <= free_blocks - _before_each(0, need * admitted_before)
        admit_now = fits & _worth_admitting(batch, cand, sl, admitted_before)
        # Exact up to and including the first candidate the pass decides otherwise than it
        # guessed: every one before it was priced on the batch the walk would have.
        differ = np.flatnonzero(admit_now != admitted_before)
        settled = len(admit_now) if not len(differ) else int(differ[0]) + 1
        outcome[start:start + settled] = np.where(
            admit_now[:settled], _ADMITTED, np.where(fits[:settled], _HELD_COST, _HELD_KV))
        taken = start + np.flatnonzero(admit_now[:settled])
        if len(taken):
            free_blocks -= int(cand.blocks_needed[taken].sum())
            if free_slots is not None:
                free_slots -= len(taken)
            batch.add(cand, taken)
        guess[sl] = admit_now
        # A whole block as guessed (long runs under light load, or of holds): larger blocks,
        # fewer passes, the same decisions.
        block = 2 * block if settled == len(admit_now) else CANDIDATE_BLOCK
        start += settled
    # What the walk did not reach because nothing further fits is held for that reason too.
    outcome[start:] = _HELD_SLOTS if free_slots is not None and free_slots <= 0 else _HELD_KV
    batch.free_blocks, batch.free_slots = free_blocks, free_slots
    return outcome


def _before_each(start, values: np.ndarray) -> np.ndarray:
    """`start` plus the sum of the values before each: a quantity as it grows along a pass."""
    return start + np.concatenate(([0], np.cumsum(values)[:-1]))


def _worth_admitting(batch: PredictedBatch, cand: CandidateQueue, sl: slice,
                     admitted_before: np.ndarray) -> np.ndarray:
    """For each candidate of `sl`: gain >= cost (module docstring) when it is admitted onto
    `batch` together with the candidates of `sl` before it that `admitted_before` marks (those
    become members it can make late)."""
    ctx_k = cand.context_tokens[sl]
    pre_k = cand.prefill_tokens[sl]
    admitted = np.flatnonzero(admitted_before)
    admitted_none = not len(admitted)
    if not admitted_none:
        size_0 = batch.size + _before_each(0, admitted_before)
        context_0 = _before_each(batch.context, ctx_k * admitted_before)
        prefill_0 = _before_each(batch.prefill, pre_k * admitted_before)
    else:  # each on the batch as it is (the common pass: a single candidate, a run of holds)
        size_0, context_0, prefill_0 = batch.size, batch.context, batch.prefill
    size_k = size_0 + 1
    context_k = context_0 + ctx_k
    prefill_k = prefill_0 + pre_k
    step_k = batch.step_s(size_k, context_k)
    own_steps = batch.own_steps(prefill_k, cand.segment_tokens[sl])
    own_now = batch.finish_at(own_steps, step_k, prefill_k)
    dl = cand.deadline_s[sl]

    steps, deadline, slope = batch.steps, batch.deadline, batch.slope
    if len(admitted):
        steps = np.concatenate((steps, own_steps[admitted]))
        deadline = np.concatenate((deadline, dl[admitted]))
        slope = np.concatenate((slope, cand.slope[sl][admitted]))
    # The members a candidate can make later than their deadline: those late under the largest
    # admission of this pass (the finish only grows with size, context and prefill). (Scalars
    # where every candidate sees the same batch: a pass costs its numpy calls more than its
    # arithmetic, and the walk makes several per admission pass.)
    cost = t_free = 0.0
    if len(steps):
        worst = batch.finish(steps, size_k if admitted_none else size_k[-1], context_k.max(),
                             prefill_k.max())
        risk = np.flatnonzero(batch.now + worst > deadline)
        if len(risk):
            risk_steps = steps[risk][:, None]
            base = batch.finish(risk_steps, size_0, context_0, prefill_0)
            with_k = batch.finish_at(risk_steps, step_k, prefill_k)
            risk_deadline = deadline[risk][:, None]
            loss = slope[risk][:, None] * (batch.lateness(with_k, risk_deadline)
                                           - batch.lateness(base, risk_deadline))
            if len(admitted):  # a candidate of the pass is a member only after its admission
                joined = np.concatenate((np.full(len(batch.steps), -1), admitted))
                loss = np.where(joined[risk][:, None] < np.arange(len(ctx_k)), loss, 0.0)
            cost = loss.sum(axis=0)
            t_free = np.where(loss > 0, base, 0.0).max(axis=0)
    if len(batch.incoming):
        # A resume also slows the responses that arrive while it runs; a response does not
        # pay this, since a response cannot wait out the responses behind it (its own
        # deadline comes first), while a resume can be deferred past them. A resume waits
        # at least as long again as it is already late (rent or buy: it is admitted once the
        # lateness it has paid matches what its admission costs).
        # Nor does a resume the engine would otherwise idle for: with nothing else in the
        # batch it runs (work conserving), and yields at its boundary if arrivals need it to.
        resume = cand.segment_index[sl] > 0
        if not admitted_none:
            resume &= size_0 > 0
        elif size_0 <= 0:
            resume = None
        if resume is not None and resume.any():
            incoming = batch.incoming_cost(size_0, context_0, ctx_k, own_now)
            cost = cost + np.where(resume, incoming, 0.0)
            t_free = np.where(resume, np.maximum(t_free, batch.lateness(0.0, dl)), t_free)
    # Waiting: started once the members it hurts have finished, then the same service.
    own_wait = t_free + own_now
    gain = cand.slope[sl] * (batch.lateness(own_wait, dl) - batch.lateness(own_now, dl))
    return gain >= cost
