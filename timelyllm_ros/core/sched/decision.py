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

Everything is vectorised with numpy over the candidates (in blocks) and over the generations a
choice can hurt (those that could still be made later than their deadline); the walk stops as
soon as no slot or no candidate's blocks remain. `bench/decision_cost.py` measures a pick.
"""

from __future__ import annotations

import math

import numpy as np

from timelyllm_ros.core.sched.decision_records import (BatchDecision, CandidateQueue,
                                                       DecisionSnapshot, IncomingResponses,
                                                       RunningSet, StepCoefficients)

__all__ = ["BatchDecision", "CandidateQueue", "DecisionSnapshot", "IncomingResponses",
           "RunningSet", "StepCoefficients", "decide"]

# Candidates evaluated together in one numpy pass (a block); a block's work is
# O(block * generations at risk). A throughput setting, not a policy one: the decision is the
# same for any block size (test).
CANDIDATE_BLOCK = 128

HOLD_KV = "kv blocks: it needs more than are free"
HOLD_SLOTS = "no free slot"
HOLD_COST = "admitting it now would cost the running ones more utility than it gains by not waiting"
YIELD_SPEED = ("out of the batch after its boundary it brings late generations back on time, "
               "worth more than it loses")
YIELD_INCOMING = ("its next segment would make the responses arriving meanwhile later, worth "
                  "more than it loses by waiting")
YIELD_ROOM = "its blocks and slot let a queued first segment in, worth more than it loses"


class _Batch:
    """The batch as the walk grows it: every member's steps to its segment end and TUF."""

    def __init__(self, snap: DecisionSnapshot):
        r = snap.running
        c = snap.coefficients
        self.now = snap.now
        self.coef = c
        self.size = float(len(r))
        self.context = float(r.context_tokens.sum())
        self.prefill = 0.0  # admitted, not yet computed
        self.free_blocks = int(snap.free_kv_blocks)  # left after the walk's admissions
        self.free_slots = snap.free_slots
        # One chunk of prefill per step: what the budget leaves after the running decodes.
        self.chunk = float(max(1, snap.step_token_budget - len(r)))
        self.steps = r.remaining_tokens.astype(np.float64)
        self.deadline = r.deadline_s
        # Only utility differences are compared, so U0 cancels; k weighs lateness.
        self.slope = r.slope
        self.incoming = snap.incoming

    def step_s(self, size, context):
        c = self.coef
        return c.decode_fixed_s + c.decode_per_seq_s * size + c.decode_per_ctx_token_s * context

    def finish(self, steps, size, context, prefill):
        """Seconds from now until `steps` more steps have run (module docstring); numpy
        broadcasting over any of the arguments."""
        c = self.coef
        prefill_steps = np.ceil(prefill / self.chunk)
        return (steps * self.step_s(size, context)
                + c.prefill_per_token_s * np.minimum(prefill, steps * self.chunk)
                + c.prefill_fixed_s * np.minimum(steps, prefill_steps))

    def lateness(self, t, deadline):
        return np.maximum(self.now + t - deadline, 0.0)

    def add(self, steps, context, prefill, deadline, slope) -> None:
        self.size += 1
        self.context += context
        self.prefill += prefill
        self.steps = np.append(self.steps, steps)
        self.deadline = np.append(self.deadline, deadline)
        self.slope = np.append(self.slope, slope)


def decide(snap: DecisionSnapshot) -> BatchDecision:
    """The decision for `snap` (module docstring). Deterministic, and it never admits more than
    the free KV blocks and slots hold."""
    batch = _Batch(snap)
    admit, hold = _walk(snap, batch)
    yields = _yields(snap, batch, hold)
    return BatchDecision(tuple(admit), hold, yields)


def _walk(snap: DecisionSnapshot, batch: _Batch) -> tuple[list[str], dict[str, str]]:
    cand = snap.candidates
    n = len(cand)
    admit: list[str] = []
    hold: dict[str, str] = {}
    free_blocks = int(snap.free_kv_blocks)
    free_slots = snap.free_slots
    if n == 0:
        return admit, hold
    # Smallest need from each position on: the walk stops when nothing further fits.
    min_need_from = np.minimum.accumulate(cand.blocks_needed[::-1])[::-1]
    start = 0
    block = CANDIDATE_BLOCK
    while start < n:
        if free_slots is not None and free_slots <= 0:
            break
        if min_need_from[start] > free_blocks:
            break
        stop = min(n, start + block)
        bulk = _admit_all_on_time(batch, cand, start, stop, free_blocks, free_slots)
        if bulk:
            for j in range(start, start + bulk):
                admit.append(cand.keys[j])
                free_blocks -= int(cand.blocks_needed[j])
                _add(batch, cand, j)
            if free_slots is not None:
                free_slots -= bulk
            start += bulk
            continue
        sl = slice(start, stop)
        fits = cand.blocks_needed[sl] <= free_blocks
        admit_now = fits & _worth_admitting(batch, cand, sl)
        picked = np.flatnonzero(admit_now)
        end = stop if not len(picked) else start + int(picked[0])
        # Held: the state is unchanged by them.
        hold.update(zip(cand.keys[start:end],
                        [HOLD_COST if f else HOLD_KV for f in fits[:end - start].tolist()]))
        if not len(picked):
            # A long run of holds (a queue of work that waits for the batch to make room):
            # larger blocks cost fewer numpy passes, the same decisions.
            start, block = stop, 2 * block
            continue
        block = CANDIDATE_BLOCK
        j = end
        key = cand.keys[j]
        admit.append(key)
        free_blocks -= int(cand.blocks_needed[j])
        if free_slots is not None:
            free_slots -= 1
        _add(batch, cand, j)
        start = j + 1
    # What the walk did not reach because nothing further fits is held for that reason too.
    reason = HOLD_SLOTS if free_slots is not None and free_slots <= 0 else HOLD_KV
    hold.update((key, reason) for key in cand.keys[start:n] if key not in hold)
    batch.free_blocks, batch.free_slots = free_blocks, free_slots
    return admit, hold


def _add(batch: _Batch, cand: CandidateQueue, j: int) -> None:
    prefill_after = batch.prefill + cand.prefill_tokens[j]
    steps = np.ceil(prefill_after / batch.chunk) + cand.segment_tokens[j] - 1
    batch.add(max(1.0, steps), cand.context_tokens[j], cand.prefill_tokens[j],
              cand.deadline_s[j], cand.slope[j])


def _admit_all_on_time(batch: _Batch, cand: CandidateQueue, start: int, stop: int,
                       free_blocks: int, free_slots: int | None) -> int:
    """How many candidates from `start` the walk admits in a row because nobody is late even
    with all of them in (every member's finish only grows with each admission, so each of
    their marginal costs is zero and each is admitted): the light-load fast path, equal to
    the candidate-by-candidate walk (test). 0 when that does not hold."""
    blocks = np.cumsum(cand.blocks_needed[start:stop])
    m = int(np.searchsorted(blocks, free_blocks, side="right"))
    if free_slots is not None:
        m = min(m, free_slots)
    if m == 0:
        return 0
    sl = slice(start, start + m)
    prefill = batch.prefill + np.cumsum(cand.prefill_tokens[sl])
    size = batch.size + m
    context = batch.context + float(cand.context_tokens[sl].sum())
    total = float(prefill[-1])
    members = batch.finish(batch.steps, size, context, total)
    if (batch.now + members > batch.deadline).any():
        return 0
    own_steps = np.maximum(1.0, np.ceil(prefill / batch.chunk) + cand.segment_tokens[sl] - 1)
    own = batch.finish(own_steps, size, context, total)
    if (batch.now + own > cand.deadline_s[sl]).any():
        return 0
    if len(batch.incoming) and (cand.segment_index[sl] > 0).any() \
            and _incoming_lateness(batch, np.array([size]), np.array([context])).any():
        return 0  # a resume in the run would make incoming responses later: walk them
    return m


def _incoming_lateness(batch: _Batch, size: np.ndarray, context: np.ndarray) -> np.ndarray:
    """Each incoming class's expected lateness (rows) if it arrived now and joined a batch of
    `size` sequences holding `context` tokens (columns: one per size/context pair). Its
    response is its prefill, then its first segment's steps; the lateness is averaged over
    the class's measured first-segment lengths (lateness is convex in the length, so the mean
    length would understate it)."""
    inc, c = batch.incoming, batch.coef
    prefill = c.prefill_fixed_s + c.prefill_per_token_s * inc.prefill_tokens
    step = batch.step_s(size[None, :] + 1.0, context[None, :] + inc.context_tokens[:, None])
    # (class, length quantile, column)
    response = prefill[:, None, None] + inc.segment_tokens[:, :, None] * step[:, None, :]
    return np.maximum(response - inc.ert_s[:, None, None], 0.0).mean(axis=1)


def _incoming_cost(batch: _Batch, context_k: np.ndarray, residency_s: np.ndarray) -> np.ndarray:
    """What admitting each candidate costs the responses expected to arrive while it runs:
    `rate * residency` arrivals of each class, each made later by the candidate's share of
    every step of its first segment, priced by its TUF (only the lateness it adds past its
    ERT)."""
    inc = batch.incoming
    without = _incoming_lateness(batch, np.array([batch.size]), np.array([batch.context]))
    with_k = _incoming_lateness(batch, np.full(len(context_k), batch.size + 1.0),
                                batch.context + context_k)
    per_second = (inc.rate_per_s * inc.slope) @ (with_k - without)
    return per_second * residency_s


def _worth_admitting(batch: _Batch, cand: CandidateQueue, sl: slice) -> np.ndarray:
    """For each candidate of `sl`, admitted next onto `batch`: gain >= cost (module docstring)."""
    ctx_k = cand.context_tokens[sl]
    pre_k = cand.prefill_tokens[sl]
    size_k = batch.size + 1
    context_k = batch.context + ctx_k
    prefill_k = batch.prefill + pre_k
    own_steps = np.maximum(1.0, np.ceil(prefill_k / batch.chunk) + cand.segment_tokens[sl] - 1)
    own_now = batch.finish(own_steps, size_k, context_k, prefill_k)

    # The members a candidate can make later than their deadline: those late under the largest
    # admission of this block (the finish only grows with the candidate's context and
    # prefill).
    base = batch.finish(batch.steps, batch.size, batch.context, batch.prefill)
    cost = np.zeros(len(ctx_k))
    t_free = np.zeros(len(ctx_k))
    if len(base):
        worst = batch.finish(batch.steps, size_k, batch.context + ctx_k.max(initial=0.0),
                             batch.prefill + pre_k.max(initial=0.0))
        risk = np.flatnonzero(batch.now + worst > batch.deadline)
        if len(risk):
            steps = batch.steps[risk][:, None]
            with_k = batch.finish(steps, size_k, context_k[None, :], prefill_k[None, :])
            late_base = batch.lateness(base[risk], batch.deadline[risk])[:, None]
            late_k = batch.lateness(with_k, batch.deadline[risk][:, None])
            loss = batch.slope[risk][:, None] * (late_k - late_base)
            cost = loss.sum(axis=0)
            hurt = loss > 0
            t_free = np.where(hurt, base[risk][:, None], 0.0).max(axis=0)
    dl = cand.deadline_s[sl]
    if len(batch.incoming):
        # A resume also slows the responses that arrive while it runs; a response does not
        # pay this, since a response cannot wait out the responses behind it (its own
        # deadline comes first), while a resume can be deferred past them. A resume waits
        # at least as long again as it is already late (rent or buy: it is admitted once the
        # lateness it has paid matches what its admission costs).
        resume = cand.segment_index[sl] > 0
        if resume.any():
            cost = cost + np.where(resume, _incoming_cost(batch, ctx_k, own_now), 0.0)
            t_free = np.where(resume, np.maximum(t_free, batch.lateness(0.0, dl)), t_free)
    # Waiting: started once the members it hurts have finished, then the same service.
    own_wait = t_free + own_now
    gain = cand.slope[sl] * (batch.lateness(own_wait, dl) - batch.lateness(own_now, dl))
    return gain >= cost


def _yields(snap: DecisionSnapshot, batch: _Batch, hold: dict[str, str]) -> dict[str, str]:
    r = snap.running
    out: dict[str, str] = {}
    resumes = np.flatnonzero(r.segment_index > 0)
    if not len(resumes):
        return out
    finish = batch.finish(batch.steps, batch.size, batch.context, batch.prefill)
    step = batch.step_s(batch.size, batch.context)
    lateness = batch.lateness(finish, batch.deadline)
    late = np.flatnonzero(lateness > 0)
    if len(late):
        # Most slack first: the resumes that lose least by waiting.
        slack = r.deadline_s[resumes] - (batch.now + finish[resumes])
        ys = resumes[np.lexsort((resumes, -slack))]
        coef = batch.coef
        per_step = coef.decode_per_seq_s + coef.decode_per_ctx_token_s * r.context_tokens[ys]
        # Seconds each late member saves when y leaves after its boundary (rows: y); what y
        # saves does not depend on which other resumes leave, so one matrix serves the pass.
        saved = np.maximum(batch.steps[late][None, :] - batch.steps[ys][:, None], 0.0) \
            * per_step[:, None]
        saved[ys[:, None] == late[None, :]] = 0.0
        helped_finish = np.where(saved > 0, finish[late][None, :], 0.0).max(axis=1)
        back = np.maximum(finish[ys], helped_finish)
        segment_s = r.remaining_tokens[ys] * step
        lose = r.slope[ys] * (batch.lateness(back + segment_s, r.deadline_s[ys])
                              - batch.lateness(finish[ys] + segment_s, r.deadline_s[ys]))
        slope_late = batch.slope[late]
        left = lateness[late]
        for row, y in enumerate(ys.tolist()):
            if not left.any():
                break  # nobody is late any more: a yield saves nothing
            # Only members the yield brings back on time count, as in the admission: a member
            # still late after it is late either way, the resume's work only moved.
            rescued = (left > 0) & (left <= saved[row])
            gain = float(slope_late[rescued] @ left[rescued])
            if gain > lose[row]:
                out[r.keys[y]] = YIELD_SPEED
                left = np.maximum(left - saved[row], 0.0)
                after = np.maximum(batch.steps - batch.steps[y], 0.0) * per_step[row]
                after[y] = 0.0
                finish = finish - after
    if len(batch.incoming):
        _incoming_yields(snap, batch, finish, step, out)
    _room_yields(snap, batch, hold, finish, step, out)
    return out


def _incoming_yields(snap: DecisionSnapshot, batch: _Batch, finish: np.ndarray, step: float,
                     out: dict[str, str]) -> None:
    """Running resumes that go on past their boundary (work-conserving) keep slowing every
    step for another segment: each is asked to yield at its boundary when what that segment
    costs the responses arriving meanwhile (`_incoming_cost`, by the rate each class arrives
    at) exceeds what the resume loses by waiting as long as that segment would take. Resumes
    with the most slack first; each yield shortens the step the next one is priced on.

    Evaluated in blocks: each block is priced as if every resume before it in the block
    yielded, which holds up to the first one that does not; the walk resumes after it."""
    r, inc = snap.running, batch.incoming
    pool = np.array([y for y in np.flatnonzero(r.segment_index > 0).tolist()
                     if r.keys[y] not in out], dtype=np.int64)
    if not len(pool):
        return
    slack = r.deadline_s[pool] - batch.now - finish[pool]
    ys = pool[np.lexsort((pool, -slack))]
    coef, c = batch.coef, batch.incoming
    weight = inc.rate_per_s * inc.slope
    prefill = coef.prefill_fixed_s + coef.prefill_per_token_s * c.prefill_tokens
    # The step an arrival of each class would run in, with the whole batch.
    class_step = batch.step_s(batch.size + 1.0, batch.context + c.context_tokens)

    def late(steps):  # steps: (class, column) -> expected lateness (class, column)
        response = prefill[:, None, None] + c.segment_tokens[:, :, None] * steps[:, None, :]
        return np.maximum(response - c.ert_s[:, None, None], 0.0).mean(axis=1)

    if not late(class_step[:, None]).any():
        return  # every arriving response is on time with the whole batch: nobody to protect
    shorter = coef.decode_per_seq_s + coef.decode_per_ctx_token_s * r.context_tokens[ys]
    segment_s = r.remaining_tokens[ys] * step
    # Its next segment: right after this one, or after waiting as long as it would run.
    on = finish[ys] + segment_s
    lose = r.slope[ys] * (batch.lateness(on + segment_s, r.deadline_s[ys])
                          - batch.lateness(on, r.deadline_s[ys]))
    cut = 0.0  # how much shorter the step is after the yields so far
    start, n = 0, len(ys)
    while start < n:
        stop = min(n, start + CANDIDATE_BLOCK)
        d = shorter[start:stop]
        before = cut + np.concatenate(([0.0], np.cumsum(d)[:-1]))
        steps_before = class_step[:, None] - before[None, :]
        cost = weight @ (late(steps_before) - late(steps_before - d[None, :])) \
            * segment_s[start:stop]
        yes = cost > lose[start:stop]
        k = len(d) if yes.all() else int(np.argmin(yes))
        for y in ys[start:start + k].tolist():
            out[r.keys[y]] = YIELD_INCOMING
        cut += float(d[:k].sum())
        start += k if k == len(d) else k + 1
        if not late(class_step[:, None] - cut).any():
            return


def _room_yields(snap: DecisionSnapshot, batch: _Batch, hold: dict[str, str],
                 finish: np.ndarray, step: float, out: dict[str, str]) -> None:
    """Queued first segments held for blocks or slots, in walk order until one is not worth it:
    the resumes with the most slack yield enough room for one when its utility then exceeds
    their losses."""
    r, cand = snap.running, snap.candidates
    pool = [int(y) for y in np.flatnonzero(r.segment_index > 0) if r.keys[y] not in out]
    if not pool:
        return
    pool.sort(key=lambda y: (-(r.deadline_s[y] - batch.now - finish[y]), y))
    free_blocks, free_slots = batch.free_blocks, batch.free_slots
    for j in np.flatnonzero(cand.segment_index == 0).tolist():
        if not pool:
            return
        if hold.get(cand.keys[j]) not in (HOLD_KV, HOLD_SLOTS):
            continue
        need_blocks = int(cand.blocks_needed[j]) - free_blocks
        need_slots = 0 if free_slots is None else 1 - free_slots
        chosen, got_blocks, lose, when = [], 0, 0.0, 0.0
        for y in pool:
            if got_blocks >= need_blocks and len(chosen) >= need_slots:
                break
            chosen.append(y)
            # A resume holds its context and the rest of its segment.
            got_blocks += -(-int(r.context_tokens[y] + r.remaining_tokens[y])
                            // snap.kv_block_size)
            when = max(when, float(finish[y]))
        if got_blocks < need_blocks or len(chosen) < need_slots:
            return  # the resumes left cannot make room: nothing later in the walk gets any
        service = float(batch.finish(
            max(1.0, math.ceil(cand.prefill_tokens[j] / batch.chunk) + cand.segment_tokens[j] - 1),
            batch.size, batch.context + cand.context_tokens[j], cand.prefill_tokens[j]))
        for y in chosen:  # each resumes once the candidate's segment is out
            segment_s = r.remaining_tokens[y] * step
            lose += float(r.slope[y] * (
                batch.lateness(when + service + segment_s, r.deadline_s[y])
                - batch.lateness(finish[y] + segment_s, r.deadline_s[y])))
        gain = cand.initial_utility[j] - cand.slope[j] * float(
            batch.lateness(when + service, cand.deadline_s[j]))
        if not gain > lose:
            return  # in walk order until one is not worth its room
        for y in chosen:
            out[r.keys[y]] = YIELD_ROOM
            pool.remove(y)
        free_blocks += got_blocks - int(cand.blocks_needed[j])
        if free_slots is not None:
            free_slots += len(chosen) - 1
