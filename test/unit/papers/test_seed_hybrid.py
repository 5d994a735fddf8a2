"""Seed 003 (hybrid offline-online): time model, packing and bounds, Algorithm 1, the gate, and
the batch simulator."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from timelyllm_ros.papers.hybrid.dispatch import SlotDispatcher
from timelyllm_ros.papers.hybrid.gate import PrefillDecodeGate
from timelyllm_ros.papers.hybrid.gsm8k import PAPER_VARIANTS, gsm8k_like, simulate_batch
from timelyllm_ros.papers.hybrid.packing import (hybrid_lower_bound, lpt, makespan_lower_bound,
                                                 pack_min_makespan, prefill_lower_bound)
from timelyllm_ros.papers.hybrid.time_model import TimeModel


def test_time_model():
    tm = TimeModel()
    assert tm.decode_ms(200) == pytest.approx(71.0)
    assert tm.prefill_ms(5000) == pytest.approx(675.0)
    assert tm.decode_marginal_ms(190) == pytest.approx(39.9)
    assert tm.prefill_ms(0) == 0.0 and tm.decode_ms(0) == 0.0


def test_packing_example():
    T = [7, 6, 5, 4, 3, 3, 2]
    assert lpt(T, 3).makespan == 11
    exact = pack_min_makespan(T, 3)
    assert exact.makespan == 10 and exact.optimal and exact.method == "milp"
    assert exact.lower_bound == pytest.approx(10)
    assert sorted(exact.loads) == [10, 10, 10]
    assert sorted(len(s) for s in exact.slot_lists()) == [2, 2, 3]
    assert makespan_lower_bound(T, 3) == 10


def test_packing_falls_back_to_lpt():
    T = [7, 6, 5, 4, 3, 3, 2]
    p = pack_min_makespan(T, 3, exact_max_vars=5)      # "too big" for the solver
    assert p.method == "lpt" and p.makespan == 11 and not p.optimal
    assert p.lower_bound == 10
    even = pack_min_makespan([5, 5, 5, 5], 2)           # LPT meets the bound: no solver needed
    assert even.method == "lpt" and even.optimal and even.makespan == 10
    assert pack_min_makespan([], 3).makespan == 0.0
    with pytest.raises(ValueError):
        pack_min_makespan([1, -1], 2)


def brute_makespan(T, J):
    return min(max(np.bincount(a, weights=T, minlength=J)) for a in
               (np.array(x) for x in itertools.product(range(J), repeat=len(T))))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=7), st.integers(1, 3))
def test_bounds_never_exceed_optimum(T, J):
    opt = brute_makespan(T, J)
    assert makespan_lower_bound(T, J) <= opt + 1e-9
    p = pack_min_makespan(T, J)
    assert p.makespan == pytest.approx(opt) and p.optimal
    assert p.lower_bound <= opt + 1e-9
    assert lpt(T, J).makespan >= opt - 1e-9
    assert lpt(T, J).lower_bound <= opt + 1e-9


def test_hybrid_lower_bound():
    tm = TimeModel()
    prompts = [5000] * 3 + [100]
    assert prefill_lower_bound(prompts, 5000, tm) == pytest.approx(3 * 675.0)
    total, tp, td = hybrid_lower_bound(prompts, 1234.0, 5000, tm)
    assert (tp, td) == (pytest.approx(2025.0), 1234.0) and total == pytest.approx(3259.0)


def test_stealing_case():
    d = SlotDispatcher([[], [("r100", 100), ("r50", 50)]])
    assert list(d.remaining) == [0, 150]
    got = d.next_for(0)
    assert (got.rid, got.size, got.donor) == ("r100", 100, 1)
    assert list(d.remaining) == [0, 50]
    assert d.next_for(1).rid == "r50" and d.next_for(1) is None and d.next_for(0) is None


def test_dispatcher_order_and_switches():
    d = SlotDispatcher([[("a", 3), ("b", 9), ("c", 5)], [("x", 1)]])
    assert [rid for rid, _ in d.queue(0)] == ["b", "c", "a"]            # longest first
    assert d.next_for(1).rid == "x"
    assert d.next_for(1).rid == "b"                                      # steals the head
    unsorted = SlotDispatcher([[("a", 3), ("b", 9)], []], sort=False, steal=False)
    assert unsorted.next_for(0).rid == "a" and unsorted.next_for(1) is None


def test_gate_sequence():
    g = PrefillDecodeGate()
    waiting = [68.4] * 10
    assert g.prefill_cost(waiting) == pytest.approx(113.92)
    seen = []
    for _ in range(3):
        g.note_decode(TimeModel().decode_marginal_ms(190))
        seen.append(g.decide(waiting, 190))
    assert seen == ["decode", "decode", "prefill"]
    assert g.c_d == pytest.approx(119.7)
    g.note_prefill()
    assert g.c_d == 0 and g.decide(waiting, 190) == "decode"


def test_gate_edges():
    g = PrefillDecodeGate()
    assert g.decide([], 190) == "decode"
    assert g.decide([68], 0) == "prefill"
    g.note_decode_round(190)
    assert g.c_d == pytest.approx(39.9)
    with pytest.raises(ValueError):
        g.note_decode(-1.0)


def test_gsm8k_like_moments():
    w = gsm8k_like(20000, seed=1)
    assert w.prompt_tokens.mean() == pytest.approx(68.43, abs=1.5)
    assert w.output_tokens.mean() == pytest.approx(344.83, abs=6)
    assert w.output_tokens.std() == pytest.approx(187.99, abs=6)
    assert w.output_tokens.max() <= 512 and w.output_tokens.min() >= 1
    noisy = gsm8k_like(1000, seed=1, prediction_sigma=0.5)
    assert not np.array_equal(noisy.predicted_output, noisy.output_tokens)


def test_batch_simulator_paper_ordering():
    w = gsm8k_like(1319, seed=0)
    tm = TimeModel()
    reps = {name: simulate_batch(w, 200, lists=lists, online=on, gate=gt)
            for name, lists, on, gt in PAPER_VARIANTS}
    lb = hybrid_lower_bound(w.prompt_tokens, makespan_lower_bound(w.output_tokens * tm.decode_ms(200), 200),
                            5000, tm)[0] / 1000
    for r in reps.values():
        assert 0 < r.utilization <= 1
        assert r.total_s >= lb
        assert r.decode_rounds >= w.output_tokens.max()
    base, hybrid = reps["baseline"], reps["hybrid"]
    assert hybrid.total_s < reps["offline only"].total_s < base.total_s
    assert hybrid.utilization > base.utilization
    # The baseline reproduces the paper's operating point (80.2%, 201 s) closely.
    assert base.utilization == pytest.approx(0.80, abs=0.02)
    assert base.total_s == pytest.approx(201, abs=6)


def test_batch_simulator_small_and_exact_packing():
    w = gsm8k_like(12, seed=3)
    r = simulate_batch(w, 3, lists="packed", online=True, gate=True, exact_max_vars=100)
    assert r.prefill_stages >= 1 and r.decode_rounds >= 1
    with pytest.raises(ValueError):
        simulate_batch(w, 3, lists="nope")
