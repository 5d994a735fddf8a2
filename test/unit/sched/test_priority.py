import math

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from timelyllm_ros.core.policies.priority import (get_slack_scaling, pud_priority,
                                                   pud_priority_scalar, slack_scaling_names)
from timelyllm_ros.core.sched.queue_view import QueueView, initial_row, suspended_row
from timelyllm_ros.core.tuf import TUF

G = 0.09
NOW = 10.0
NORMAL = TUF(1.0, 2.0, 1.0)
URGENT = TUF(0.2, 6.67, 2.0)


def prio(rows, now=NOW, scaling="max_slack_g", **kw):
    return pud_priority(QueueView.from_rows(rows), now, G, scaling, **kw)


def test_exact_values_hand_computed():
    fresh = initial_row(NORMAL, arrival_s=10.0)
    # s = 10 + 1 - 10.09 = 0.91; U = 1; PUD = 1 / 0.09; P = PUD / 0.91
    # Suspended, robot done in 50 ms: s = 10.05 - 10.09 = -0.04, w = 0.04, U = 1 - 2 * 0.04 = 0.92,
    # P = (0.92 / 0.09) / max(-0.04, 0.09) = 113.58...
    late_soon = suspended_row(NORMAL, arrival_s=8.0, previous_done_s=10.05, segment_index=1,
                              enqueued_s=9.5)
    p = prio([fresh, late_soon])
    assert p[0] == pytest.approx(12.210012210, rel=1e-9)
    assert p[1] == pytest.approx(113.5802469, rel=1e-9)


def test_urgent_fresh_outranks_suspended_with_busy_robot():
    urgent = initial_row(URGENT, arrival_s=NOW, is_urgent=True)
    # The robot is still busy for 3 s with the previous segment.
    busy = suspended_row(NORMAL, arrival_s=5.0, previous_done_s=NOW + 3.0, segment_index=2,
                         enqueued_s=9.0)
    p = prio([busy, urgent])
    # urgent: s = 0.11, U = 2 -> 2 / 0.09 / 0.11 = 202.0; busy: s = 2.91 -> 1 / 0.09 / 2.91 = 3.82
    assert p[1] == pytest.approx(2 / G / 0.11)
    assert p[0] == pytest.approx(1 / G / 2.91)
    assert p.argmax() == 1


def test_suspended_about_to_be_late_outranks_fresh_normal_with_slack():
    fresh = initial_row(NORMAL, arrival_s=NOW)
    due = suspended_row(NORMAL, arrival_s=7.0, previous_done_s=NOW + 0.05, segment_index=1,
                        enqueued_s=9.0)
    assert prio([fresh, due]).argmax() == 1
    # ... also under the other slack scalings
    assert prio([fresh, due], scaling="exp_decay").argmax() == 1


def test_more_slack_ranks_lower():
    rows = [suspended_row(NORMAL, 0.0, NOW + d, 1, enqueued_s=0.0) for d in (0.1, 0.5, 2.0, 5.0)]
    for scaling in ("max_slack_g", "exp_decay"):
        p = prio(rows, scaling=scaling)
        assert list(np.argsort(-p)) == [0, 1, 2, 3]


def test_negative_pud_never_helped_by_slack():
    # Rows far past their cut-off: U(w) < 0. Built by hand (U0 < 0 is not a valid TUF) to force
    # a negative PUD together with positive slack, the case where dividing by max(s, g) would
    # pull the row towards zero and rank it above a less late one.
    a = dict(arrival_s=0, reference_s=NOW + 5, ert_s=0.0, slope=2.0, initial_utility=-1.0)  # s>0
    b = dict(arrival_s=0, reference_s=NOW + G, ert_s=0.0, slope=2.0, initial_utility=-1.0)  # s=0
    p = prio([a, b])
    # Same U(w) = -1 for both; slack must not make a rank higher than b.
    assert p[0] <= p[1]
    # Literal Eq. 4 would give a: -1 / g / 5 (near zero, ranked first) - that is what we avoid.
    assert p[0] < (-1 / G) / (5 - G) - 1
    assert p[0] == pytest.approx(-1 / G / G)
    p = prio([a, b], scaling="exp_decay")
    assert p[0] <= p[1] and p[0] == pytest.approx(-1 / G)


def test_late_rows_rank_below_all_positive_rows_and_by_lateness():
    very_late = initial_row(NORMAL, arrival_s=NOW - 5.0)    # w = 5.09 -> U = -7.18
    a_bit_late = initial_row(NORMAL, arrival_s=NOW - 1.6)   # w = 1.69 -> U = -0.38
    ample = suspended_row(NORMAL, 0.0, NOW + 60.0, 1, enqueued_s=0.0)  # tiny positive P
    for scaling in slack_scaling_names():
        p = prio([very_late, a_bit_late, ample], scaling=scaling)
        assert p[0] < p[1] < 0 < p[2], scaling
    p = prio([very_late, a_bit_late])
    # Late rows are exactly Eq. 4: max(s, g) = g because s < 0.
    assert p[1] == pytest.approx((1 - 2 * (1.69 - 1.0)) / G / G)


def test_exp_decay_and_none_values():
    fresh = initial_row(NORMAL, arrival_s=NOW)
    assert prio([fresh], scaling="exp_decay")[0] == pytest.approx(1 / G * math.exp(-0.91))
    assert prio([fresh], scaling="exp_decay", params={"tau": 0.5})[0] == pytest.approx(
        1 / G * math.exp(-0.91 / 0.5))
    assert prio([fresh], scaling="none")[0] == pytest.approx(1 / G)


def test_bad_arguments():
    v = QueueView.from_rows([initial_row(NORMAL, NOW)])
    with pytest.raises(KeyError, match="max_slack_g"):
        pud_priority(v, NOW, G, "nope")
    with pytest.raises(ValueError):
        pud_priority(v, NOW, 0.0)
    with pytest.raises(ValueError):
        pud_priority(v, NOW, float("nan"))
    with pytest.raises(TypeError):
        pud_priority(v, NOW, G, "max_slack_g", params={"tau": 1.0})
    with pytest.raises(ValueError):
        pud_priority(v, NOW, G, "exp_decay", params={"tau": 0.0})


def test_empty_view_and_out_buffer():
    empty = QueueView.from_rows([])
    assert pud_priority(empty, NOW, G).shape == (0,)
    v = QueueView.from_rows([initial_row(NORMAL, NOW), initial_row(URGENT, NOW)])
    out = np.empty(2)
    res = pud_priority(v, NOW, G, out=out)
    assert res is out
    # Inputs are left untouched (scalings work on scratch copies).
    assert v.reference_s.tolist() == [NOW, NOW] and v.ert_s.tolist() == [1.0, 0.2]


def test_registry_lists_scalings():
    assert {"max_slack_g", "exp_decay", "none"} <= set(slack_scaling_names())
    assert get_slack_scaling("exp_decay").defaults == {"tau": 1.0}


# --- properties -------------------------------------------------------------------------------

_tuf = st.builds(TUF, st.floats(0, 5), st.floats(0.05, 20), st.floats(0, 5))
_row = st.builds(
    lambda tuf, arr, ref_off, seg: (
        initial_row(tuf, arr) if seg == 0 else suspended_row(tuf, arr, arr + ref_off, seg,
                                                               enqueued_s=arr)),
    _tuf, st.floats(0, 20), st.floats(0, 10), st.integers(0, 3))


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(_row, min_size=1, max_size=20), now=st.floats(0, 40),
       g=st.floats(0.01, 1.0), scaling=st.sampled_from(["max_slack_g", "exp_decay", "none"]))
def test_vectorised_matches_reference(rows, now, g, scaling):
    p = pud_priority(QueueView.from_rows(rows), now, g, scaling)
    ref = [pud_priority_scalar(r["reference_s"], r["ert_s"], r["slope"], r["initial_utility"],
                               now, g, scaling) for r in rows]
    assert p == pytest.approx(ref, rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(_row, min_size=1, max_size=20), now=st.floats(0, 40),
       scaling=st.sampled_from(["max_slack_g", "exp_decay", "none"]))
def test_sign_follows_utility(rows, now, scaling):
    v = QueueView.from_rows(rows)
    p = pud_priority(v, now, G, scaling)
    w = np.maximum(0.0, now + G - v.reference_s)
    u = np.where(w <= v.ert_s, v.initial_utility, v.initial_utility - v.slope * (w - v.ert_s))
    clear = np.abs(u) > 1e-9
    assert np.array_equal(np.sign(p[clear]), np.sign(u[clear]))


@settings(max_examples=200, deadline=None)
@given(tuf=_tuf, ref_off=st.floats(-10, 10), more_u0=st.floats(0.01, 5),
       scaling=st.sampled_from(["max_slack_g", "exp_decay", "none"]))
def test_more_valuable_ranks_higher(tuf, ref_off, more_u0, scaling):
    base = initial_row(tuf, NOW + ref_off)
    richer = dict(base, initial_utility=tuf.initial_utility + more_u0)
    p = prio([base, richer], scaling=scaling)
    assert p[1] > p[0]


@settings(max_examples=200, deadline=None)
@given(u0=st.floats(0.01, 5), k=st.floats(0.05, 20), ref_off=st.floats(-5, 5),
       ert=st.floats(0, 5), more_ert=st.floats(0.01, 5),
       scaling=st.sampled_from(["max_slack_g", "exp_decay"]))
def test_more_slack_never_ranks_higher(u0, k, ref_off, ert, more_ert, scaling):
    # Same task, but one has a later deadline: the one with less slack must not rank lower.
    a = initial_row(TUF(ert, k, u0), NOW + ref_off)
    b = initial_row(TUF(ert + more_ert, k, u0), NOW + ref_off)
    # Only while a is not yet late: once it is, it has lost value that b has not, and PUD
    # rightly prefers the more valuable b.
    assume(max(0.0, NOW + G - a["reference_s"]) <= ert)
    p = prio([a, b], scaling=scaling)
    assert p[0] >= p[1] - 1e-9 * abs(p[1])
