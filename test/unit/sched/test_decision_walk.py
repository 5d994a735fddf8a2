"""The admission walk in passes over blocks (core/sched/decision.py: each pass guesses which
candidates are admitted and settles the stretch it guessed right) decides exactly as a walk that
takes one candidate at a time, written here from the rule in the module's docstring: random
snapshots with incoming classes, resumes priced at slope 0 and above, KV and slot limits, any
block size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.sched import decision as dec
from timelyllm_ros.core.sched.decision import (HOLD_COST, HOLD_KV, HOLD_SLOTS, BatchDecision,
                                               DecisionSnapshot, IncomingResponses, decide)
from timelyllm_ros.core.sched.decision_batch import PredictedBatch
from timelyllm_ros.core.sched.decision_yields import yields

from test_decision import COEF, NORMAL, NOW, PROFILE, URGENT, queue, running


def _worth(batch: PredictedBatch, cand, j: int) -> bool:
    """Candidate j admitted next onto `batch`: what it gains by starting now against waiting
    for the members it makes later to finish, at least what it costs them (and, for a resume,
    the arriving responses)."""
    size, context = batch.size + 1, batch.context + cand.context_tokens[j]
    prefill = batch.prefill + cand.prefill_tokens[j]
    own_now = float(batch.finish(batch.own_steps(prefill, cand.segment_tokens[j]), size,
                                 context, prefill))
    cost, t_free = 0.0, 0.0
    for m in range(len(batch.steps)):
        base = float(batch.finish(batch.steps[m], batch.size, batch.context, batch.prefill))
        after = float(batch.finish(batch.steps[m], size, context, prefill))
        loss = batch.slope[m] * (float(batch.lateness(after, batch.deadline[m]))
                                 - float(batch.lateness(base, batch.deadline[m])))
        cost += loss
        if loss > 0:
            t_free = max(t_free, base)
    dl = cand.deadline_s[j]
    inc = batch.incoming
    # A resume pays for arrivals only beside something else (one the engine would otherwise
    # idle for runs).
    if len(inc) and cand.segment_index[j] > 0 and batch.size > 0:
        without = batch.incoming_lateness(np.array([batch.size]), np.array([batch.context]))
        with_j = batch.incoming_lateness(np.array([size]), np.array([context]))
        cost += float((inc.rate_per_s * inc.slope) @ (with_j - without)[:, 0]) * own_now
        t_free = max(t_free, float(batch.lateness(0.0, dl)))
    gain = cand.slope[j] * (float(batch.lateness(t_free + own_now, dl))
                            - float(batch.lateness(own_now, dl)))
    return gain >= cost


def one_at_a_time(s: DecisionSnapshot) -> BatchDecision:
    batch = PredictedBatch(s)
    cand = s.candidates
    admit, hold = [], {}
    free_blocks, free_slots = s.free_kv_blocks, s.free_slots
    for j, key in enumerate(cand.keys):
        if free_slots is not None and free_slots <= 0:
            hold[key] = HOLD_SLOTS
        elif cand.blocks_needed[j] > free_blocks:
            hold[key] = HOLD_KV
        elif _worth(batch, cand, j):
            admit.append(key)
            batch.add(cand, np.array([j]))
            free_blocks -= int(cand.blocks_needed[j])
            free_slots = None if free_slots is None else free_slots - 1
        else:
            hold[key] = HOLD_COST
    batch.free_blocks, batch.free_slots = free_blocks, free_slots
    held_for_room = [j for j, key in enumerate(cand.keys) if hold.get(key) in (HOLD_KV, HOLD_SLOTS)]
    return BatchDecision(tuple(admit), hold, yields(s, batch, held_for_room))


def incoming_classes(rates, lengths):
    """Urgent drones (ERT 0.2 s, k 10) and normal tasks (ERT 1 s, k 2), as many as `rates`."""
    n = len(rates)
    if not n:
        return IncomingResponses.empty()
    return IncomingResponses.build(rates, [20.0, 200.0, 60.0][:n], [420.0, 900.0, 2000.0][:n],
                                   [sorted(lengths)] * n, [0.2, 1.0, 0.5][:n],
                                   [10.0, 2.0, 1.0][:n])


def snapshot(run, cands, incoming, free_blocks, free_slots, budget):
    return DecisionSnapshot(NOW, run, cands, free_blocks, free_slots, budget, COEF,
                            PROFILE.kv_block_size, incoming)


_slope = st.sampled_from([0.0, 0.5, 1.0, 2.0, 10.0])
_tuf = st.builds(lambda k: dict(u0=1.0, k=k), _slope)
_gen = st.tuples(st.integers(1, 40), st.integers(1, 6000), st.floats(-0.5, 3),
                 st.integers(0, 3), _tuf)
_cand = st.tuples(st.integers(0, 3000), st.integers(1, 40), st.integers(1, 4000),
                  st.integers(1, 250), st.floats(-0.3, 4), st.integers(0, 3), _tuf)


@settings(max_examples=300, deadline=None)
@given(st.lists(_gen, max_size=40), st.lists(_cand, max_size=80),
       st.lists(st.floats(0.5, 60), max_size=3), st.lists(st.integers(1, 12), min_size=8,
                                                          max_size=8),
       st.integers(0, 6000), st.one_of(st.none(), st.integers(0, 60)),
       st.sampled_from([256, 2048, 8192]), st.sampled_from([1, 3, 16, 128]))
def test_the_walk_in_passes_equals_one_candidate_at_a_time(gens, cands, rates, lengths,
                                                           free_blocks, free_slots, budget,
                                                           block):
    run = running(*[(f"g{i}", *g) for i, g in enumerate(gens)])
    q = queue(*[(f"c{i}", *c) for i, c in enumerate(cands)])
    s = snapshot(run, q, incoming_classes(rates, lengths), free_blocks, free_slots, budget)
    reference = one_at_a_time(s)
    original = dec.CANDIDATE_BLOCK
    try:
        dec.CANDIDATE_BLOCK = block
        assert decide(s) == reference
    finally:
        dec.CANDIDATE_BLOCK = original


@pytest.mark.parametrize("seed", range(8))
def test_long_runs_of_admissions_and_holds_decide_as_one_at_a_time(monkeypatch, seed):
    """Hundreds of candidates, more than a block: under light load (long runs of admissions)
    and with deadlines that bind (admissions and holds mixed), resumes among them."""
    rng = np.random.default_rng(seed)
    slack = 10.0 if seed % 2 else 0.3
    gens = [(f"g{i}", int(rng.integers(1, 30)), int(rng.integers(100, 3000)),
             float(rng.uniform(slack / 5, slack)), int(rng.integers(0, 3)),
             URGENT if i % 3 else dict(u0=1.0, k=0.0))
            for i in range(int(rng.integers(0, 60)))]
    cands = [(f"c{i}", int(rng.integers(0, 2000)), int(rng.integers(1, 20)),
              int(rng.integers(100, 3000)), int(rng.integers(5, 60)),
              float(rng.uniform(-0.1, slack)), int(rng.choice([0, 0, 2])),
              NORMAL if i % 4 else URGENT)
             for i in range(400)]
    incoming = incoming_classes([30.0, 40.0], [2, 3, 3, 4, 4, 5, 6, 9]) if seed % 4 < 2 \
        else IncomingResponses.empty()
    if seed % 2:  # room for every candidate
        free_blocks, free_slots = 30000, None
    else:
        free_blocks, free_slots = int(rng.integers(500, 8000)), int(rng.integers(1, 200))
    s = snapshot(running(*gens), queue(*cands), incoming, free_blocks, free_slots, 2048)
    d = decide(s)
    reference = one_at_a_time(s)
    assert d == reference
    if seed % 2:
        assert len(d.admit) > 50  # runs of admissions longer than a small block
    monkeypatch.setattr(dec, "CANDIDATE_BLOCK", 16)
    assert decide(s) == reference


@pytest.mark.parametrize("seed", range(6))
def test_resumes_shown_never_worth_it_get_the_walks_holds(monkeypatch, seed):
    """The default's overload: hundreds of resumes whose lateness weighs nothing (slope 0)
    queued behind responses, with responses arriving late. `_never_worth` sets them aside
    unpriced; the decision is still the one-at-a-time walk's, holds and their reasons included,
    with room for all, for some (kv) and with few slots."""
    rng = np.random.default_rng(100 + seed)
    gens = [(f"g{i}", int(rng.integers(1, 30)), int(rng.integers(100, 3000)),
             float(rng.uniform(0.05, 2.0)), int(rng.integers(0, 2)), URGENT)
            for i in range(int(rng.integers(5, 40)))]
    resume = dict(u0=1.0, k=0.0)
    cands = [(f"c{i}", int(rng.integers(0, 2000)), int(rng.integers(1, 20)),
              int(rng.integers(100, 3000)), int(rng.integers(5, 60)),
              float(rng.uniform(-0.1, 1.0)), 0 if i < 40 else int(rng.integers(1, 4)),
              URGENT if i < 40 else resume)
             for i in range(400)]
    incoming = incoming_classes([30.0, 40.0], [2, 3, 3, 4, 4, 5, 6, 9])
    room = [(30000, None), (int(rng.integers(300, 3000)), None), (30000, int(rng.integers(0, 6)))]
    free_blocks, free_slots = room[seed % 3]
    s = snapshot(running(*gens), queue(*cands), incoming, free_blocks, free_slots, 2048)
    never = dec._never_worth(s.candidates, PredictedBatch(s))
    assert never is not None and never.sum() == 360  # every resume: the path is exercised
    d = decide(s)
    assert d == one_at_a_time(s)
    assert set(d.admit).isdisjoint(f"c{i}" for i in range(40, 400))
    monkeypatch.setattr(dec, "_never_worth", lambda cand, batch: None)
    assert decide(s) == d and dict(decide(s).hold) == dict(d.hold)


def _speed_yields_one_at_a_time(s: DecisionSnapshot) -> dict[str, str]:
    """The speed rule of `yields`, every resume priced in turn (most slack first)."""
    batch = PredictedBatch(s)
    r = s.running
    finish = batch.finish(batch.steps, batch.size, batch.context, batch.prefill)
    step = batch.step_s(batch.size, batch.context)
    left = batch.lateness(finish, batch.deadline)
    late_at_first, finish_at_first = left > 0, finish.copy()
    pool = sorted((int(y) for y in np.flatnonzero(r.segment_index > 0)),
                  key=lambda y: (-(r.deadline_s[y] - NOW - finish[y]), y))
    out = {}
    for y in pool:
        if not (left > 0).any():
            break
        per_step = COEF.decode_per_seq_s + COEF.decode_per_ctx_token_s * r.context_tokens[y]
        saved = np.maximum(batch.steps - batch.steps[y], 0.0) * per_step
        saved[y] = 0.0
        rescued = (left > 0) & (left <= saved)
        gain = float(batch.slope[rescued] @ left[rescued])
        # When the members it speeds up (those late before any yield) are out.
        helped = max([float(finish_at_first[m])
                      for m in np.flatnonzero((saved > 0) & late_at_first)], default=0.0)
        back = max(float(finish[y]), helped)
        segment_s = r.remaining_tokens[y] * step
        lose = r.slope[y] * (max(back + segment_s + NOW - r.deadline_s[y], 0.0)
                             - max(finish[y] + segment_s + NOW - r.deadline_s[y], 0.0))
        if gain > lose:
            out[r.keys[y]] = dec.YIELD_SPEED
            left = np.maximum(left - saved, 0.0)
            finish = finish - saved
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(_gen, min_size=1, max_size=40), st.sampled_from([256, 2048, 8192]))
def test_speed_yields_equal_one_resume_at_a_time(gens, budget):
    run = running(*[(f"g{i}", *g) for i, g in enumerate(gens)])
    s = snapshot(run, queue(), IncomingResponses.empty(), 0, None, budget)
    assert decide(s).yields == _speed_yields_one_at_a_time(s)


def test_speed_yields_of_many_resumes_equal_one_at_a_time():
    """Batches where several resumes yield (the rule is exercised, not only its exits)."""
    yielded = 0
    for seed in range(150):
        rng = np.random.default_rng(seed)
        # Responses with many steps to go and tight deadlines; resumes with a few steps left,
        # whose leaving after their boundary speeds up the responses' remaining steps.
        gens = [(f"g{i}", int(rng.integers(15, 40)), int(rng.integers(100, 6000)),
                 float(rng.uniform(0.3, 0.8)), 0, URGENT)
                for i in range(int(rng.integers(1, 20)))]
        gens += [(f"r{i}", int(rng.integers(1, 10)), int(rng.integers(100, 6000)),
                  float(rng.uniform(-0.2, 1.5)), int(rng.integers(1, 3)),
                  dict(u0=1.0, k=float(rng.choice([0.0, 0.0, 0.5]))))
                 for i in range(int(rng.integers(5, 60)))]
        s = snapshot(running(*gens), queue(), IncomingResponses.empty(), 0, None, 2048)
        got = decide(s).yields
        assert got == _speed_yields_one_at_a_time(s), seed
        yielded += len(got)
    assert yielded >= 5  # 8 with these seeds
