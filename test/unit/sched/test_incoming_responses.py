"""Pricing a resume by the responses that arrive while it runs (core/sched/decision.py,
`IncomingResponses`; core/sched/arrival_rates.py; `timelyllm-pred`'s adapter)."""

from __future__ import annotations

import numpy as np
import pytest

from timelyllm_ros.core.policies.predictive import FirstSegmentMeans
from timelyllm_ros.core.sched import decision_yields
from timelyllm_ros.core.sched.arrival_rates import ArrivalRates
from timelyllm_ros.core.sched.decision_batch import PredictedBatch
from timelyllm_ros.core.sched.decision import (HOLD_COST, YIELD_INCOMING, DecisionSnapshot,
                                               IncomingResponses, decide)
from timelyllm_ros.core.sched.interface import RunningGen

from test_decision import COEF, NOW, PROFILE, URGENT, queue, running

RESUME = dict(u0=1.0, k=0.0)  # a resume priced at weight 0: its own lateness counts nothing


def urgent_drones(rate_per_s, ert_s=0.2, lengths=(4.0,) * 8, prefill=20.0, context=420.0):
    return IncomingResponses.build([rate_per_s], [prefill], [context], [list(lengths)],
                                   [ert_s], [URGENT["k"]])


def snap(run, cands, incoming, free_blocks=2560, free_slots=256):
    return DecisionSnapshot(NOW, run, cands, free_blocks, free_slots, 8192, COEF,
                            PROFILE.kv_block_size, incoming)


def busy_batch(n, context=1500):
    """n running responses with seconds of slack: they are not at risk themselves."""
    return [(f"b{i}", 20, context, 30.0, 0, URGENT) for i in range(n)]


def step_s(size, context):
    return COEF.decode_fixed_s + COEF.decode_per_seq_s * size + COEF.decode_per_ctx_token_s * context


def largest_on_time_batch():
    """The most busy_batch members beside which one more 3,000-token sequence still lets an
    urgent drone (20-token prefill, 4 tokens, 200 ms) respond on time."""
    n = 1
    prefill = COEF.prefill_fixed_s + COEF.prefill_per_token_s * 20
    while prefill + 4 * step_s(n + 2, 1500 * (n + 1) + 420 + 3000) < 0.2:
        n += 1
    return n - 1


def test_a_resume_waits_while_it_would_make_arriving_urgent_responses_late():
    resume = ("r", 0, 20, 3000, 200, 30.0, 1, RESUME)
    n = largest_on_time_batch()
    on_time, tight = busy_batch(n), busy_batch(n + 8)
    assert decide(snap(running(*on_time), queue(resume), urgent_drones(30.0))).admit == ("r",)
    d = decide(snap(running(*tight), queue(resume), urgent_drones(30.0)))
    assert d.admit == () and d.hold == {"r": HOLD_COST}
    # Nobody arriving: the same resume costs nobody anything.
    assert decide(snap(running(*tight), queue(resume), IncomingResponses.empty())).admit == ("r",)
    # Arrivals with a 1 s ERT stay on time in that batch: nobody to protect either.
    relaxed = urgent_drones(30.0, ert_s=1.0)
    assert decide(snap(running(*tight), queue(resume), relaxed)).admit == ("r",)


def test_a_response_is_not_held_for_the_responses_behind_it():
    first = ("f", 20, 4, 420, 30, 1.0, 0, URGENT)
    d = decide(snap(running(*busy_batch(120)), queue(first), urgent_drones(30.0)))
    assert d.admit == ("f",)


def test_a_late_resume_waits_only_as_long_again_as_it_is_late():
    """Rent or buy: a resume with a TUF slope is admitted once the lateness it has paid matches
    what its admission costs the arrivals, however long they keep coming."""
    batch = running(*busy_batch(largest_on_time_batch() + 8))
    incoming = urgent_drones(30.0)
    costs = []
    for late_s in (0.01, 0.1, 1.0, 10.0):
        resume = ("r", 0, 20, 3000, 200, -late_s, 1, dict(u0=1.0, k=1.0))
        costs.append(decide(snap(batch, queue(resume), incoming)).admit == ("r",))
    assert costs[0] is False and costs[-1] is True
    assert costs == sorted(costs)  # once admitted, admitted for every longer wait


def test_running_resumes_yield_when_their_next_segment_would_slow_arriving_responses():
    resumes = [(f"y{i}", 10, 2000, 30.0, 2, RESUME) for i in range(60)]
    d = decide(snap(running(*resumes), queue(), urgent_drones(30.0)))
    assert d.yields and set(d.yields.values()) == {YIELD_INCOMING}
    # They yield only until arrivals are on time again: a few are left running.
    assert len(d.yields) < len(resumes)
    assert not decide(snap(running(*resumes), queue(), IncomingResponses.empty())).yields
    assert not decide(snap(running(*resumes[:3]), queue(), urgent_drones(30.0))).yields


def _sequential_incoming_yields(s):
    """The rule of `_incoming_yields`, one resume at a time (the reference for the blocks)."""
    batch = PredictedBatch(s)
    finish = batch.finish(batch.steps, batch.size, batch.context, batch.prefill)
    step = batch.step_s(batch.size, batch.context)
    r, c = s.running, s.incoming
    pool = [int(y) for y in np.flatnonzero(r.segment_index > 0)]
    pool.sort(key=lambda y: (-(r.deadline_s[y] - NOW - finish[y]), y))
    size, context, out = batch.size, batch.context, {}

    def late(size, context):
        return batch.incoming_lateness(np.array([size]), np.array([context]))[:, 0]

    weight = c.rate_per_s * c.slope
    for y in pool:
        seg = r.remaining_tokens[y] * step
        on = finish[y] + seg
        lose = r.slope[y] * (max(on + seg + NOW - r.deadline_s[y], 0)
                             - max(on + NOW - r.deadline_s[y], 0))
        cost = float(weight @ (late(size, context) - late(size - 1, context - r.context_tokens[y])))
        if cost * seg > lose:
            out[r.keys[y]] = YIELD_INCOMING
            size, context = size - 1, context - r.context_tokens[y]
    return out


@pytest.mark.parametrize("seed", range(8))
def test_the_blocked_yield_walk_equals_one_resume_at_a_time(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    gens = [(f"g{i}", int(rng.integers(1, 30)), int(rng.integers(100, 4000)),
             float(rng.uniform(-0.5, 3)), int(rng.integers(1, 3)),
             dict(u0=1.0, k=float(rng.choice([0.0, 0.5, 2.0]))))
            for i in range(int(rng.integers(5, 90)))]
    incoming = IncomingResponses.build(
        rng.uniform(1, 60, 2), [20.0, 200.0], [420.0, 900.0],
        [np.sort(rng.integers(1, 12, 8)).astype(float) for _ in range(2)], [0.2, 1.0],
        [10.0, 2.0])
    s = snap(running(*gens), queue(), incoming)
    reference = _sequential_incoming_yields(s)
    for block in (1, 3, 128):
        monkeypatch.setattr(decision_yields, "RESUME_BLOCK", block)
        assert decide(s).yields == reference


def test_arrival_rates_count_each_arrival_once_per_class_and_forget_old_ones():
    rates = ArrivalRates(window_s=2.0)

    def seen(now, arrivals):  # arrivals: (arrival_s, ert) queued at this pass
        a = np.array([t for t, _ in arrivals], float)
        ert = np.array([e for _, e in arrivals], float)
        n = len(a)
        rates.observe(now, a, ert, np.where(ert < 0.5, 10.0, 2.0), np.full(n, 10),
                      np.full(n, 20.0), np.full(n, 400.0))

    seen(0.0, [])
    seen(0.5, [(0.1, 0.2), (0.2, 1.0), (0.4, 1.0)])
    seen(1.0, [(0.1, 0.2), (0.2, 1.0), (0.4, 1.0), (0.9, 1.0)])  # the same three still queued
    by_ert = {key[0]: rate for key, rate, _, _ in rates.classes(1.0)}
    assert by_ert == {0.2: pytest.approx(1 / 1.0), 1.0: pytest.approx(3 / 1.0)}
    seen(3.0, [])  # the window is 2 s: only the arrival at 0.9 s... and that is gone too at 3.0
    assert rates.classes(3.0) == []
    with pytest.raises(ValueError, match="window_s"):
        ArrivalRates(0.0)


def test_first_segment_lengths_are_passed_as_their_measured_distribution():
    means = FirstSegmentMeans()
    assert (means.length_quantiles(12) == 12).all()  # nothing measured: the bound

    def gen(key, tokens):
        return RunningGen(key, 500, tokens, 12, 1.0, True, "drone", 0, 0, 1.0, 10.0)

    for i, tokens in enumerate([2] * 6 + [9] * 2):  # 3 in 4 first segments are short
        means.observe([gen(f"t{i}", tokens)])
        means.observe([])
    q = means.length_quantiles(12)
    assert len(q) == 8 and list(q) == [2.0] * 6 + [9.0] * 2


def test_length_quantiles_follow_each_new_measurement_of_their_bound():
    # The quantiles are kept between passes: a segment measured since must show in them, and
    # one of another bound must not disturb them.
    means = FirstSegmentMeans(quantiles=4)

    def measure(key, bound, tokens):
        means.observe([RunningGen(key, 500, tokens, bound, 1.0, True, "drone", 0, 0, 1.0, 10.0)])
        means.observe([])

    measure("a", 12, 3)
    assert list(means.length_quantiles(12)) == [3.0] * 4
    before = means.length_quantiles(12)
    measure("b", 60, 40)
    assert means.length_quantiles(12) is before  # another bound: kept as it was
    for key in ("c", "d", "e"):
        measure(key, 12, 7)
    assert list(means.length_quantiles(12)) == [3.0, 7.0, 7.0, 7.0]
    assert list(means.length_quantiles(60)) == [40.0] * 4
    with pytest.raises(ValueError):
        before[0] = 1.0  # handed out read-only: a caller cannot change the kept values
