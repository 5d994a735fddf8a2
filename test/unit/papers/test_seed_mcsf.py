"""Seed 001 (MC-SF): the digest's reproduction cases, the baselines, invariants, and the
scheduler adapter."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from timelyllm_ros.papers.mcsf.admission import McsfAdmission
from timelyllm_ros.papers.mcsf.round_policies import (McsfPolicy, UtilityMcsfPolicy,
                                                      alpha_beta_clearing, alpha_greedy)
from timelyllm_ros.papers.mcsf.round_sim import brute_force_optimum, simulate
from timelyllm_ros.papers.mcsf.unit_model import (Request, lookahead_fits, mcsf_admit, sf_key,
                                                  utility_key)


def reqs(outputs, s=1, arrivals=None):
    return [Request(i, 0 if arrivals is None else arrivals[i], s, o) for i, o in enumerate(outputs)]


CASES = {
    # name: (requests, M, MC-SF starts, MC-SF total, hindsight optimum)
    "T1": (reqs((2, 3, 5)), 8, (0, 0, 1), 11, 11),
    "T2": (reqs((1, 1, 2, 2)), 4, (0, 0, 2, 4), 12, 11),
    "T3": (reqs((3, 1, 1, 1), arrivals=(0, 1, 1, 1)), 4, (0, 4, 4, 6), 17, 11),
    "T4": (reqs((8, 8), s=2), 10, (0, 9), 25, 25),
}


def usage_from_starts(requests, starts, rounds):
    """Memory per round recomputed from the model's definition, independently of simulate."""
    u = np.zeros(rounds, np.int64)
    for r, p in zip(requests, starts):
        for t in range(p, min(p + r.o + 1, rounds)):
            u[t] += r.s + (t - p)
    return u


@pytest.mark.parametrize("name", sorted(CASES))
def test_reproduction_cases(name):
    requests, M, starts, total, opt = CASES[name]
    res = simulate(requests, M, McsfPolicy())
    assert res.starts == starts
    assert res.total_latency == total
    assert res.completions == tuple(p + r.o for p, r in zip(starts, requests))
    assert res.all_done and res.clears == 0 and res.stalled_rounds == 0
    assert (res.usage_per_round <= M).all()
    assert np.array_equal(res.usage_per_round, usage_from_starts(requests, starts, res.rounds))
    best, best_starts = brute_force_optimum(requests, M)
    assert best == opt
    assert np.array_equal(usage_from_starts(requests, best_starts, 64) <= M, np.ones(64, bool))


def test_t2_is_not_optimal():
    requests, M, *_ = CASES["T2"]
    assert simulate(requests, M, McsfPolicy()).total_latency == 12
    assert brute_force_optimum(requests, M)[0] == 11


def test_mcsf_admit_direct():
    # T1 at round 0: the 2 and the 3 fit, the 5 fails the check at tau = 2 (3 + 3 + 3 > 8).
    got = mcsf_admit([], reqs((5, 2, 3)), 8, 0)
    assert [r.o for r in got] == [2, 3]
    # One round later, with those two running (held 2 each, 1 and 2 rounds left), the 5 fits.
    assert [r.o for r in mcsf_admit([(2, 1), (2, 2)], reqs((5,)), 8, 1)] == [5]
    # Not-yet-arrived requests are skipped, and the first failure stops admission.
    late = [Request("late", 5, 1, 1)]
    assert mcsf_admit([], late, 8, 0) == []
    # Equal lengths and arrivals: the id breaks the tie; only one of the two fits (8 + 8 > 8).
    assert [r.rid for r in mcsf_admit([], [Request("b", 0, 1, 7), Request("a", 0, 1, 7)], 8, 0)] == ["a"]
    # A running request holding 7 in its completion round leaves room for exactly one more.
    assert len(mcsf_admit([(7, 0)], reqs((1, 1)), 8, 0)) == 1


def test_lookahead_fits_peaks_at_completions():
    # Holding 2 with 8 rounds left peaks at 10 in its completion round.
    assert lookahead_fits(np.array([2]), np.array([8]), 10)
    assert not lookahead_fits(np.array([2]), np.array([8]), 9)
    assert lookahead_fits(np.array([], np.int64), np.array([], np.int64), 1)


def test_alpha_greedy_small_alpha_loops_on_t4():
    requests, M, *_ = CASES["T4"]
    res = simulate(requests, M, alpha_greedy(0.1), max_rounds=200)
    assert not res.all_done
    assert res.completions == (None, None)
    assert res.clears >= 40 and min(res.n_starts) >= 20   # cleared and readmitted over and over
    assert (res.demand_per_round > M).any()


def test_alpha_greedy_large_alpha_on_t4():
    requests, M, *_ = CASES["T4"]
    res = simulate(requests, M, alpha_greedy(0.65))
    assert res.starts == (0, 9) and res.total_latency == 25 and res.clears == 0


def test_beta_clearing_is_seeded_and_finishes():
    requests, M, *_ = CASES["T4"]
    a = simulate(requests, M, alpha_beta_clearing(0.1, 0.5), seed=3)
    b = simulate(requests, M, alpha_beta_clearing(0.1, 0.5), seed=3)
    assert a.starts == b.starts and a.total_latency == b.total_latency
    assert a.all_done and a.clears > 0
    with pytest.raises(ValueError):
        alpha_beta_clearing(0.1, 0.0)
    with pytest.raises(ValueError):
        alpha_greedy(1.0)


def test_validation():
    with pytest.raises(ValueError):
        Request(0, 0, 1, 0)
    with pytest.raises(ValueError):
        simulate(reqs((9,)), 8, McsfPolicy())   # s + o > M can never run
    with pytest.raises(ValueError):
        simulate([Request(0, 0, 1, 1), Request(0, 0, 1, 1)], 8, McsfPolicy())


def test_utility_order():
    a, b = Request("a", 0, 1, 4, weight=1.0), Request("b", 0, 1, 8, weight=4.0)
    assert sorted([a, b], key=sf_key)[0] is a
    assert sorted([a, b], key=utility_key)[0] is b          # 4/8 > 1/4
    same = reqs((5, 2, 3, 2))
    assert sorted(same, key=utility_key) == sorted(same, key=sf_key)
    # With equal weights the variant reproduces MC-SF exactly.
    requests, M, starts, total, _ = CASES["T3"]
    assert simulate(requests, M, UtilityMcsfPolicy()).starts == starts


class Recorder:
    """Wraps a policy and records what it saw and chose each round."""

    def __init__(self, inner):
        self.inner, self.name, self.key, self.log = inner, inner.name, inner.key, []

    def admit(self, now, running, waiting, M):
        got = self.inner.admit(now, running, waiting, M)
        self.log.append((now, [r for r in waiting if r.arrival <= now], got))
        return got

    def on_overflow(self, running, M, rng):
        return self.inner.on_overflow(running, M, rng)


instances = st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 6), min_size=n, max_size=n),     # arrivals
    st.lists(st.integers(1, 4), min_size=n, max_size=n),     # s
    st.lists(st.integers(1, 6), min_size=n, max_size=n),     # o
    st.integers(0, 12)))                                     # M slack


@settings(max_examples=150, deadline=None)
@given(instances)
def test_mcsf_invariants(inst):
    arrivals, s, o, slack = inst
    requests = [Request(i, a, x, y) for i, (a, x, y) in enumerate(zip(arrivals, s, o))]
    M = max(x + y for x, y in zip(s, o)) + slack
    rec = Recorder(McsfPolicy())
    res = simulate(requests, M, rec)
    assert res.all_done
    assert (res.usage_per_round <= M).all() and (res.demand_per_round <= M).all()
    assert res.clears == 0 and res.stalled_rounds == 0
    assert res.n_starts == (1,) * len(requests)           # nothing running is ever dropped
    starts = res.starts
    assert np.array_equal(res.usage_per_round, usage_from_starts(requests, starts, res.rounds))
    for r, p, c in zip(requests, starts, res.completions):
        assert p >= r.arrival and c == p + r.o
    for now, waiting, got in rec.log:
        ordered = sorted(waiting, key=sf_key)
        assert got == ordered[:len(got)]                  # ascending, stopping at first failure
    if len(requests) <= 4:
        assert res.total_latency >= brute_force_optimum(requests, M)[0]


# ----------------------------------------------------------------------------- adapter

def test_adapter_block_rounding():
    adm = McsfAdmission(kv_capacity_tokens=64, block_size=16)
    assert adm.capacity_blocks == 4
    # 35 tokens would fit in 64, but three sequences need 2 + 2 + 1 = 5 whole blocks.
    ok, why = adm.may_admit_lookahead([(17, 0), (17, 0)], (1, 0))
    assert not ok and "5 blocks" in why
    ok, _ = adm.may_admit_lookahead([(16, 0), (16, 0)], (1, 0))
    assert ok
    # Growing by one token crosses a block boundary: 16 -> 17 tokens is 2 blocks.
    assert adm.peak_blocks([(16, 1)]) == (2, 1)
    assert adm.peak_blocks([]) == (0, 0)


def test_adapter_looks_ahead():
    adm = McsfAdmission(kv_capacity_tokens=10, block_size=1)    # the unit model, M = 10
    # T4: both fit now (2 + 2 <= 10) - a blocks-only check admits - but they would need 20 at
    # the end, so the look-ahead refuses.
    assert adm.may_admit(running=[], rate=None, free_kv_blocks=8, blocks_needed=2)[0]
    ok, why = adm.may_admit_lookahead([(2, 8)], (2, 8))
    assert not ok and "8 tokens ahead" in why
    assert not adm.may_admit_lookahead([(10, 0)], (2, 8))[0]    # the running one still holds 10
    assert adm.may_admit_lookahead([], (2, 8))[0]
    ok, why = adm.may_admit_lookahead([], (5, 6))
    assert not ok and "alone" in why


def test_adapter_several_admissions_in_one_step():
    adm = McsfAdmission(kv_capacity_tokens=8, block_size=1)      # T1 at round 0
    batch = []
    admitted = []
    for cand in [(1, 2), (1, 3), (1, 5)]:
        ok, _ = adm.may_admit_lookahead(batch, cand)
        if not ok:
            break
        batch.append(cand)
        admitted.append(cand)
    assert admitted == [(1, 2), (1, 3)]


def test_adapter_interface():
    adm = McsfAdmission(kv_capacity_tokens=1024, block_size=16)
    assert adm.lookahead is True
    assert not adm.may_admit([], None, free_kv_blocks=1, blocks_needed=2)[0]
    adm.note_admission()
    adm.note_step()
    with pytest.raises(ValueError):
        McsfAdmission(kv_capacity_tokens=8, block_size=16)
    with pytest.raises(ValueError):
        adm.peak_blocks([(-1, 3)])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 20)), min_size=0, max_size=8),
       st.tuples(st.integers(1, 30), st.integers(0, 20)), st.integers(1, 200))
def test_adapter_matches_unit_model_with_unit_blocks(running, cand, M):
    adm = McsfAdmission(kv_capacity_tokens=M, block_size=1)
    rows = np.array(running + [cand], np.int64)
    expect = lookahead_fits(rows[:, 0], rows[:, 1], M) and cand[0] + cand[1] <= M
    assert adm.may_admit_lookahead(running, cand)[0] == expect
    # Whole blocks can only cost more: anything admitted with 8-token blocks also fits in tokens.
    adm8 = McsfAdmission(kv_capacity_tokens=8 * max(1, M // 8), block_size=8)
    if adm8.may_admit_lookahead(running, cand)[0]:
        assert lookahead_fits(rows[:, 0], rows[:, 1], adm8.capacity_blocks * 8)
