"""Yields of a batch decision (core/sched/decision.py): which running resumes to suspend at their
next segment boundary, and why. Three reasons, priced on the batch the admission walk left
(`PredictedBatch`): late generations brought back on time, the responses expected to arrive
while a resume's next segment would run, and room for a queued first segment refused blocks or
a slot. The rules are the decision module's docstring; each function says its own."""

from __future__ import annotations

import math

import numpy as np

from timelyllm_ros.core.sched.decision_batch import PredictedBatch
from timelyllm_ros.core.sched.decision_records import DecisionSnapshot

# Resumes evaluated together in one numpy pass when pricing yields for the arriving responses.
# A throughput setting, not a policy one: the yields are the same for any block size (test).
RESUME_BLOCK = 128

YIELD_SPEED = ("out of the batch after its boundary it brings late generations back on time, "
               "worth more than it loses")
YIELD_INCOMING = ("its next segment would make the responses arriving meanwhile later, worth "
                  "more than it loses by waiting")
YIELD_ROOM = "its blocks and slot let a queued first segment in, worth more than it loses"


def yields(snap: DecisionSnapshot, batch: PredictedBatch,
           held_for_room: list[int]) -> dict[str, str]:
    """The running resumes to suspend at their next boundary, with the reason.
    `held_for_room`: the queued candidates the walk held for blocks or slots, in walk order."""
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
        # Only members the yield brings back on time count, as in the admission: a member
        # still late after it is late either way, the resume's work only moved. A resume that
        # rescues nobody gains nothing and loses something or nothing: it stays, and only the
        # others are priced (found together; they change only when one yields).
        rescues = ((left > 0) & (left <= saved)).any(axis=1)
        row = 0
        while row < len(ys):
            ahead = np.flatnonzero(rescues[row:])
            if not len(ahead):
                break  # nobody left late that a yield brings back on time
            row += int(ahead[0])
            y = int(ys[row])
            rescued = (left > 0) & (left <= saved[row])
            gain = float(slope_late[rescued] @ left[rescued])
            if gain > lose[row]:
                out[r.keys[y]] = YIELD_SPEED
                left = np.maximum(left - saved[row], 0.0)
                after = np.maximum(batch.steps - batch.steps[y], 0.0) * per_step[row]
                after[y] = 0.0
                finish = finish - after
                rescues = ((left > 0) & (left <= saved)).any(axis=1)
            row += 1
    if len(batch.incoming):
        _incoming_yields(snap, batch, finish, step, out)
    _room_yields(snap, batch, held_for_room, finish, step, out)
    return out


def _incoming_yields(snap: DecisionSnapshot, batch: PredictedBatch, finish: np.ndarray,
                     step: float, out: dict[str, str]) -> None:
    """Running resumes that go on past their boundary (work-conserving) keep slowing every
    step for another segment: each is asked to yield at its boundary when what that segment
    costs the responses arriving meanwhile (`PredictedBatch.incoming_cost`, by the rate each
    class arrives at) exceeds what the resume loses by waiting as long as that segment would
    take. Resumes with the most slack first; each yield shortens the step the next one is
    priced on.

    Evaluated in blocks, alternately: a run of yields priced as if every resume before each in
    the block yielded, which holds up to the first one that does not; then, after it, a run of
    resumes that stay priced on the step as it is, which holds up to the first that yields.
    Both are the one-resume-at-a-time rule (test)."""
    r, inc = snap.running, batch.incoming
    coef, c = batch.coef, batch.incoming
    prefill = coef.prefill_fixed_s + coef.prefill_per_token_s * c.prefill_tokens
    # The step an arrival of each class would run in, with the whole batch.
    class_step = batch.step_s(batch.size + 1.0, batch.context + c.context_tokens)

    def late(steps):  # steps: (class, column) -> expected lateness (class, column)
        response = prefill[:, None, None] + c.segment_tokens[:, :, None] * steps[:, None, :]
        return np.maximum(response - c.ert_s[:, None, None], 0.0).mean(axis=1)

    if not late(class_step[:, None]).any():
        return  # every arriving response is on time with the whole batch: nobody to protect
    ys = _resumes_by_slack(snap, batch, finish, out)
    if not len(ys):
        return
    weight = inc.rate_per_s * inc.slope
    shorter = coef.decode_per_seq_s + coef.decode_per_ctx_token_s * r.context_tokens[ys]
    segment_s = r.remaining_tokens[ys] * step
    # Its next segment: right after this one, or after waiting as long as it would run.
    on = finish[ys] + segment_s
    lose = r.slope[ys] * (batch.lateness(on + segment_s, r.deadline_s[ys])
                          - batch.lateness(on, r.deadline_s[ys]))
    cut = 0.0  # how much shorter the step is after the yields so far
    start, n = 0, len(ys)
    in_a_row = True
    while start < n:
        stop = min(n, start + RESUME_BLOCK)
        d = shorter[start:stop]
        if in_a_row:  # each priced as if every resume before it in the block yielded
            before = cut + np.concatenate(([0.0], np.cumsum(d)[:-1]))
        else:  # each priced on the step as it is
            before = np.full(len(d), cut)
        steps_before = class_step[:, None] - before[None, :]
        cost = weight @ (late(steps_before) - late(steps_before - d[None, :])) \
            * segment_s[start:stop]
        yes = cost > lose[start:stop]
        if not in_a_row:
            # A run of resumes that stay leaves the step as it is: priced together, and the
            # first that yields starts a run priced in a row (at the same price for it).
            first = np.flatnonzero(yes)
            start = stop if not len(first) else start + int(first[0])
            in_a_row = bool(len(first))
            continue
        k = len(d) if yes.all() else int(np.argmin(yes))
        for y in ys[start:start + k].tolist():
            out[r.keys[y]] = YIELD_INCOMING
        cut += float(d[:k].sum())
        start += k if k == len(d) else k + 1
        in_a_row = k == len(d)
        if k and not late(class_step[:, None] - cut).any():
            return


def _room_yields(snap: DecisionSnapshot, batch: PredictedBatch, held_for_room: list[int],
                 finish: np.ndarray, step: float, out: dict[str, str]) -> None:
    """Queued first segments held for blocks or slots, in walk order until one is not worth it:
    the resumes with the most slack yield enough room for one when its utility then exceeds
    their losses."""
    if not held_for_room:
        return
    r, cand = snap.running, snap.candidates
    pool = _resumes_by_slack(snap, batch, finish, out).tolist()
    if not pool:
        return
    free_blocks, free_slots = batch.free_blocks, batch.free_slots
    for j in held_for_room:
        if not pool:
            return
        if cand.segment_index[j] > 0:
            continue  # only a first segment is worth a resume's room
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


def _resumes_by_slack(snap: DecisionSnapshot, batch: PredictedBatch, finish: np.ndarray,
                      out: dict[str, str]) -> np.ndarray:
    """The running resumes not yet asked to yield, most slack first (ties in batch order):
    those that lose least by waiting."""
    r = snap.running
    pool = np.array([y for y in np.flatnonzero(r.segment_index > 0).tolist()
                     if r.keys[y] not in out], dtype=np.int64)
    slack = r.deadline_s[pool] - batch.now - finish[pool]
    return pool[np.lexsort((pool, -slack))]
