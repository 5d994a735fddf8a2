"""The batch decision on hand-made snapshots (core/sched/decision.py), without an engine."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.sched import decision as dec
from timelyllm_ros.core.sched.decision import (HOLD_COST, HOLD_KV, HOLD_SLOTS, YIELD_ROOM,
                                               YIELD_SPEED, CandidateQueue, DecisionSnapshot,
                                               RunningSet, StepCoefficients, decide)

PROFILE = EngineProfile()
COEF = StepCoefficients.from_profile(PROFILE)
NOW = 100.0
URGENT = dict(u0=1.0, k=10.0)
NORMAL = dict(u0=1.0, k=1.0)


def running(*gens):
    """gens: (key, remaining tokens, context, deadline in s from NOW, segment index, tuf)."""
    if not gens:
        return RunningSet.empty()
    keys, rem, ctx, dl, seg, tufs = zip(*gens)
    return RunningSet.build(keys, rem, ctx, [NOW + d for d in dl], [t["u0"] for t in tufs],
                            [t["k"] for t in tufs], seg)


def queue(*cands):
    """cands: (key, prefill, segment tokens, context, blocks, deadline from NOW, segment, tuf)."""
    if not cands:
        return CandidateQueue.empty()
    keys, pre, seg_tok, ctx, blocks, dl, seg, tufs = zip(*cands)
    return CandidateQueue.build(keys, pre, seg_tok, seg_tok, ctx, blocks,
                                [NOW + d for d in dl], [t["u0"] for t in tufs],
                                [t["k"] for t in tufs], seg)


def snap(run, cands, free_blocks=2560, free_slots=256, budget=8192):
    return DecisionSnapshot(NOW, run, cands, free_blocks, free_slots, budget, COEF,
                            PROFILE.kv_block_size)


def test_a_slack_rich_prefill_waits_while_it_would_make_an_urgent_response_late():
    # The urgent response needs 5 more steps (~108 ms) of its 200 ms; a 2,000-token prefill
    # (~213 ms) shared with those steps would make it late. The normal task has 5 s.
    urgent = ("u", 5, 1000, 0.2, 0, URGENT)
    long_prefill = ("n", 2000, 10, 2000, 130, 5.0, 0, NORMAL)
    d = decide(snap(running(urgent), queue(long_prefill)))
    assert d.admit == () and d.hold == {"n": HOLD_COST}
    # With the urgent response due later, the same prefill costs it nothing: admitted.
    relaxed = ("u", 5, 1000, 0.5, 0, URGENT)
    assert decide(snap(running(relaxed), queue(long_prefill))).admit == ("n",)
    # And a short prompt beside the tight one costs it nothing either.
    short = ("s", 10, 10, 500, 40, 5.0, 0, NORMAL)
    assert decide(snap(running(urgent), queue(long_prefill, short))).admit == ("s",)


def test_an_urgent_candidate_goes_in_when_its_own_lateness_outweighs_what_it_costs():
    # A normal response 7 ms from its deadline loses ~14 ms x k=1 to the prefill; the urgent
    # candidate would be ~140 ms x k=10 later if it waited for that response to finish.
    tight = ("r", 5, 1000, 0.115, 0, NORMAL)
    urgent = ("u", 100, 10, 600, 40, 0.2, 0, URGENT)
    d = decide(snap(running(tight), queue(urgent)))
    assert d.admit == ("u",)
    # The same candidate with a normal TUF and seconds of slack waits instead.
    patient = ("p", 100, 10, 600, 40, 5.0, 0, NORMAL)
    assert decide(snap(running(tight), queue(patient))).hold == {"p": HOLD_COST}


def test_nothing_is_held_when_nobody_is_hurt():
    cands = [(f"c{i}", 500, 10, 500, 40, 1.0 + i, 0, NORMAL) for i in range(5)]
    d = decide(snap(running(), queue(*cands)))
    assert d.admit == tuple(c[0] for c in cands) and d.hold == {} and d.yields == {}
    relaxed = [(f"r{i}", 5, 1000, 30.0, 0, NORMAL) for i in range(3)]
    d = decide(snap(running(*relaxed), queue(*cands)))
    assert d.admit == tuple(c[0] for c in cands) and d.hold == {} and d.yields == {}


def test_a_resume_yields_only_when_that_saves_a_response():
    # 20 steps of ~22.3 ms: the response finishes ~445 ms from now, 5 ms after its deadline;
    # without the resume's 4,000 tokens of context each step after the resume's boundary is
    # 0.89 ms shorter (~17 ms over 19 steps): that brings it back on time.
    resume = ("y", 1, 4000, 10.0, 3, NORMAL)  # one token to its boundary, 10 s of slack
    late = ("r", 20, 500, 0.44, 0, URGENT)
    d = decide(snap(running(late, resume), queue()))
    assert d.yields == {"y": YIELD_SPEED}
    on_time = ("r", 20, 500, 5.0, 0, URGENT)
    assert decide(snap(running(on_time, resume), queue())).yields == {}
    # Late by more than the yield saves: late either way, the resume's work would only move.
    hopeless = ("r", 20, 500, 0.1, 0, URGENT)
    assert decide(snap(running(hopeless, resume), queue())).yields == {}
    # A resume its robot is already waiting for loses more by waiting than the response gains.
    due = ("y", 1, 4000, 0.0, 3, URGENT)
    slow = ("r", 20, 500, 0.44, 0, dict(u0=1.0, k=0.1))
    assert decide(snap(running(slow, due), queue())).yields == {}
    # First segments are never asked to yield.
    other_response = ("o", 1, 4000, 10.0, 0, NORMAL)
    assert decide(snap(running(late, other_response), queue())).yields == {}


def test_kv_blocks_and_slots_are_respected_and_a_smaller_candidate_still_fits():
    cands = [("a", 10, 10, 800, 50, 5.0, 0, NORMAL), ("b", 10, 10, 800, 50, 5.0, 0, NORMAL),
             ("c", 10, 10, 100, 10, 5.0, 0, NORMAL)]
    d = decide(snap(running(), queue(*cands), free_blocks=60))
    assert d.admit == ("a", "c") and d.hold == {"b": HOLD_KV}
    d = decide(snap(running(), queue(*cands), free_slots=1))
    assert d.admit == ("a",) and d.hold == {"b": HOLD_SLOTS, "c": HOLD_SLOTS}


def test_a_response_refused_a_slot_makes_a_resume_with_slack_yield_its_room():
    resume = ("y", 2, 1000, 10.0, 2, NORMAL)
    response = ("q", 50, 10, 300, 20, 0.5, 0, URGENT)
    d = decide(snap(running(resume), queue(response), free_slots=0))
    assert d.admit == () and d.hold == {"q": HOLD_SLOTS} and d.yields == {"y": YIELD_ROOM}
    # A resume whose robot waits for it, dearer than the response, keeps its slot.
    due = ("y", 2, 1000, 0.0, 2, dict(u0=1.0, k=100.0))
    assert decide(snap(running(due), queue(response), free_slots=0)).yields == {}


def test_snapshots_name_what_is_wrong():
    with pytest.raises(ValueError, match="remaining_tokens"):
        running(("a", 0, 10, 1.0, 0, NORMAL))
    with pytest.raises(ValueError, match="step_token_budget"):
        snap(running(), queue(), budget=0)
    with pytest.raises(ValueError, match="decode_fixed_s"):
        StepCoefficients(-1.0, 0, 0, 0, 0)


_tuf = st.fixed_dictionaries({"u0": st.floats(0, 10), "k": st.floats(0.01, 100)})
_gen = st.tuples(st.integers(1, 60), st.integers(1, 8000), st.floats(-2, 10),
                 st.integers(0, 4), _tuf)
_cand = st.tuples(st.integers(0, 6000), st.integers(1, 60), st.integers(1, 8000),
                  st.integers(1, 600), st.floats(-1, 10), st.integers(0, 4), _tuf)


@settings(max_examples=150, deadline=None)
@given(st.lists(_gen, max_size=12), st.lists(_cand, max_size=40), st.integers(0, 3000),
       st.one_of(st.none(), st.integers(0, 20)), st.integers(64, 8192))
def test_admissions_fit_and_the_decision_is_deterministic(gens, cands, free_blocks, free_slots,
                                                          budget):
    run = running(*[(f"g{i}", *g) for i, g in enumerate(gens)])
    q = queue(*[(f"c{i}", *c) for i, c in enumerate(cands)])
    s = snap(run, q, free_blocks=free_blocks, free_slots=free_slots, budget=budget)
    d = decide(s)
    chosen = [q.keys.index(k) for k in d.admit]
    assert chosen == sorted(chosen)  # walk order
    assert int(q.blocks_needed[chosen].sum()) <= free_blocks
    if free_slots is not None:
        assert len(chosen) <= free_slots
    assert not set(d.admit) & set(d.hold)
    assert set(d.yields) <= {k for k, seg in zip(run.keys, run.segment_index) if seg > 0}
    assert decide(s) == d


def test_the_candidate_block_size_does_not_change_the_decision(monkeypatch):
    rng = np.random.default_rng(3)
    gens = [(f"g{i}", int(rng.integers(1, 30)), int(rng.integers(100, 5000)),
             float(rng.uniform(0.05, 3)), int(rng.integers(0, 3)), URGENT if i % 3 else NORMAL)
            for i in range(20)]
    cands = [(f"c{i}", int(rng.integers(0, 3000)), 10, int(rng.integers(100, 3000)),
              int(rng.integers(5, 60)), float(rng.uniform(0.1, 5)), 0, NORMAL)
             for i in range(300)]
    s = snap(running(*gens), queue(*cands), free_blocks=1500, free_slots=60)
    reference = decide(s)
    for block in (1, 7, 1000):
        monkeypatch.setattr(dec, "CANDIDATE_BLOCK", block)
        assert decide(s) == reference


def test_hold_reasons_read_like_a_dict_and_positions_name_the_admitted():
    # "a" fits, "b" does not (kv), "c" fits again: the walk admits a and c, holds b for blocks.
    d = decide(snap(RunningSet.empty(),
                    queue(("a", 10, 5, 100, 5, 5.0, 0, NORMAL),
                          ("b", 10, 5, 100, 50, 5.0, 0, NORMAL),
                          ("c", 10, 5, 100, 5, 5.0, 0, NORMAL)),
                    free_blocks=12))
    assert d.admit == ("a", "c") and d.admit_positions == (0, 2)
    assert len(d.hold) == 1 and list(d.hold) == ["b"] and "b" in d.hold and "a" not in d.hold
    assert d.hold["b"] == HOLD_KV and d.hold.get("a") is None and dict(d.hold) == {"b": HOLD_KV}
    with pytest.raises(KeyError):
        d.hold["c"]
    # Positions describe where the choices are; equal choices are equal decisions.
    assert d == dec.BatchDecision(("a", "c"), {"b": HOLD_KV}, {})
