import pytest

from timelyllm_ros.core.admission import (BlocksOnlyAdmission, FixedBatchCap,
                                          LatencyGuidedAdmission, TokenRateMeter)


def test_rate_meter_window():
    m = TokenRateMeter(window=3)
    assert m.rate is None
    m.record(0.1, 1)
    assert m.rate == pytest.approx(10.0)
    m.record(0.1, 1)
    m.record(0.2, 1)
    assert m.rate == pytest.approx(3 / 0.4)
    m.record(0.2, 1)  # first step falls out of the window
    assert len(m) == 3 and m.rate == pytest.approx(3 / 0.5)
    m.reset()
    assert m.rate is None


def test_rate_meter_default_window_and_bad_input():
    m = TokenRateMeter()
    for _ in range(20):
        m.record(0.05)
    assert len(m) == 8 and m.rate == pytest.approx(20.0)
    with pytest.raises(ValueError):
        m.record(-1.0)
    with pytest.raises(ValueError):
        m.record(float("nan"))
    z = TokenRateMeter()
    z.record(0.0, 1)
    assert z.rate is None  # no elapsed time yet: unknown, not infinite


def test_admit_when_worst_case_fits():
    a = LatencyGuidedAdmission(max_segment_tokens=10)
    # most urgent: 4 tokens done, 6 left at 50 tok/s -> 0.12 s worst case, budget 0.2 s
    ok, why = a.may_admit([(4, 0.2), (0, 3.0)], rate=50.0, free_kv_blocks=10, blocks_needed=2)
    assert ok, why


def test_reject_when_most_urgent_would_miss():
    a = LatencyGuidedAdmission(max_segment_tokens=10)
    # the generation with 3 s of budget would fit; the one with 0.1 s would not (0.12 s needed)
    ok, why = a.may_admit([(0, 3.0), (4, 0.1)], rate=50.0, free_kv_blocks=10, blocks_needed=2)
    assert not ok and "budget" in why


def test_reject_without_blocks():
    a = LatencyGuidedAdmission()
    ok, why = a.may_admit([], rate=None, free_kv_blocks=1, blocks_needed=2)
    assert not ok and "blocks" in why
    assert a.may_admit([], rate=None, free_kv_blocks=2, blocks_needed=2)[0]


def test_unknown_rate_admits():
    a = LatencyGuidedAdmission()
    assert a.may_admit([(0, 0.01)], rate=None, free_kv_blocks=5, blocks_needed=1)[0]
    assert a.may_admit([(0, 0.01)], rate=0.0, free_kv_blocks=5, blocks_needed=1)[0]


def test_lag_after_admission():
    a = LatencyGuidedAdmission(max_segment_tokens=10, lag_steps=1)
    running = [(0, 5.0)]
    assert a.may_admit(running, 50.0, 10, 1)[0]
    a.note_admission()
    ok, why = a.may_admit(running + [(0, 5.0)], 50.0, 10, 1)
    assert not ok and "lag" in why
    a.note_step()
    assert a.may_admit(running + [(0, 5.0)], 50.0, 10, 1)[0]
    lag2 = LatencyGuidedAdmission(lag_steps=2)
    lag2.note_admission()
    lag2.note_step()
    assert not lag2.may_admit(running, 50.0, 10, 1)[0]
    lag2.note_step()
    assert lag2.may_admit(running, 50.0, 10, 1)[0]


def test_segment_longer_than_bound_counts_as_zero_remaining():
    a = LatencyGuidedAdmission(max_segment_tokens=10)
    assert a.may_admit([(15, 0.0)], 50.0, 10, 1)[0]


def test_late_generations_skipped_by_default_and_strict_mode():
    running = [(2, -0.3), (2, 1.0)]
    assert LatencyGuidedAdmission().may_admit(running, 50.0, 10, 1)[0]
    ok, why = LatencyGuidedAdmission(skip_late=False).may_admit(running, 50.0, 10, 1)
    assert not ok
    assert LatencyGuidedAdmission().may_admit([(0, -1.0)], 50.0, 10, 1)[0]


def test_fixed_batch_cap():
    c = FixedBatchCap(2)
    assert c.may_admit([(0, 1.0)], None, 10, 1)[0]
    ok, why = c.may_admit([(0, 1.0), (0, 1.0)], None, 10, 1)
    assert not ok and "cap" in why
    assert not c.may_admit([], None, 0, 1)[0]
    c.note_admission()
    c.note_step()
    with pytest.raises(ValueError):
        FixedBatchCap(0)


def test_blocks_only():
    b = BlocksOnlyAdmission()
    assert b.may_admit([(0, -5.0)] * 100, 1.0, 1, 1)[0]
    assert not b.may_admit([], None, 0, 1)[0]
