import pytest

from timelyllm_ros.core.sched.admission import (BatchSpeedModel, BlocksOnlyAdmission, FixedBatchCap,
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


def test_speed_model_constant_batch_is_current_step_time():
    m = BatchSpeedModel(window=4)
    assert m.step_time_s(3) is None and m.slope_s() is None
    for d in (0.02, 0.03):
        m.record(2, d)
    # One batch size seen: nothing to extrapolate from, the mean step time is the prediction.
    assert m.slope_s() is None
    assert m.step_time_s(3) == pytest.approx(0.025)
    m.record(0, 0.5)  # idle / empty steps say nothing about decode speed
    m.record(2, 0.0)
    assert len(m) == 2


def test_speed_model_least_squares_line():
    m = BatchSpeedModel(window=8)
    for b in (1, 2, 3, 4):
        m.record(b, 0.020 + 0.002 * b)
    assert m.slope_s() == pytest.approx(0.002)
    assert m.step_time_s(5) == pytest.approx(0.030)
    # A slope measured negative (noise, a prefill step at a small batch) is clamped at zero.
    n = BatchSpeedModel(window=8)
    n.record(1, 0.05)
    n.record(2, 0.02)
    assert n.slope_s() == 0.0 and n.step_time_s(3) == pytest.approx(0.035)
    # The window forgets old steps.
    w = BatchSpeedModel(window=2)
    w.record(1, 1.0)
    w.record(4, 0.02)
    w.record(4, 0.04)
    assert len(w) == 2 and w.step_time_s(5) == pytest.approx(0.03)
    w.reset()
    assert len(w) == 0


def test_speed_model_bad_input():
    m = BatchSpeedModel()
    with pytest.raises(ValueError):
        m.record(1, -0.1)
    with pytest.raises(ValueError):
        m.record(1, float("inf"))
    with pytest.raises(ValueError):
        m.record(-1, 0.1)
    with pytest.raises(ValueError):
        m.record(True, 0.1)
    with pytest.raises(ValueError):
        BatchSpeedModel(window=1)


def test_admit_when_protected_generation_still_fits():
    a = LatencyGuidedAdmission(max_segment_tokens=10)
    # 4 tokens done, 6 left at 50 tok/s -> 0.12 s worst case, budget 0.2 s (and at the same
    # speed with one more sequence: no measurement says otherwise)
    ok, why = a.may_admit([(4, 0.2), (0, 3.0)], rate=50.0, free_kv_blocks=10, blocks_needed=2)
    assert ok and "protected" in why, why


def test_reject_when_newcomer_would_push_protected_generation_over_budget():
    # The paper's rule: the most urgent running generation must still fit with the newcomer.
    a = LatencyGuidedAdmission(max_segment_tokens=10)
    running = [(0, 3.0), (4, 0.125)]  # 6 tokens at 50 tok/s = 0.12 s: fits now
    assert a.may_admit(running, rate=50.0, free_kv_blocks=10, blocks_needed=2)[0]
    ok, why = a.may_admit(running, rate=50.0, free_kv_blocks=10, blocks_needed=2,
                          predicted_rate=45.0)  # 6 / 45 = 0.133 s > 0.125 s
    assert not ok and "budget" in why and "one more sequence" in why
    # A predicted speed above the measured one is taken as the measured one.
    assert a.may_admit([(4, 0.121)], 50.0, 10, 1, predicted_rate=1000.0)[0]


def test_reject_by_measured_batch_speed():
    a = LatencyGuidedAdmission(max_segment_tokens=10, lag_steps=0)
    # Steps measured at batch 1 and 2: 10 ms per extra sequence.
    a.note_step(0.020, 1)
    a.note_step(0.030, 2)
    # Two running; the current speed is 40 tok/s (25 ms steps). With a third sequence the line
    # predicts 25 + 10 * 1.5 = 40 ms steps = 25 tok/s.
    running = [(5, 0.15), (0, 5.0)]  # 5 tokens left: 0.125 s now (fits), 0.2 s with a third
    ok, why = a.may_admit(running, rate=40.0, free_kv_blocks=10, blocks_needed=1)
    assert not ok and "25.0 tok/s" in why
    assert a.rate_with(3, 40.0) == pytest.approx(25.0)
    # A looser budget survives the same slowdown.
    assert a.may_admit([(5, 0.25), (0, 5.0)], 40.0, 10, 1)[0]


def test_steps_without_measurements_assume_current_speed():
    a = LatencyGuidedAdmission(max_segment_tokens=10, lag_steps=0)
    for _ in range(5):
        a.note_step()  # a caller that does not pass step timings
    assert len(a.speed_model) == 0
    assert a.rate_with(7, 40.0) == pytest.approx(40.0)
    assert a.may_admit([(5, 0.126)], 40.0, 10, 1)[0]


def test_generation_that_cannot_fit_does_not_block_admission():
    # The old rule starved the queue here: a fresh urgent segment needs up to 10 / 45 = 0.22 s,
    # more than its whole 0.2 s ERT. Refusing newcomers cannot save it, so they are admitted.
    a = LatencyGuidedAdmission(max_segment_tokens=10)
    ok, why = a.may_admit([(0, 0.2), (3, 0.05)], rate=45.0, free_kv_blocks=10, blocks_needed=1)
    assert ok and "nothing to protect" in why
    # Late generations (negative budget) are never protected.
    assert a.may_admit([(2, -0.3), (9, -0.01)], 50.0, 10, 1, predicted_rate=1.0)[0]


def test_per_generation_segment_bound():
    a = LatencyGuidedAdmission(max_segment_tokens=10)
    # With its own bound of 24 tokens (an arm plan) 20 are left: 0.4 s at 50 tok/s > 0.3 s budget.
    assert a.may_admit([(4, 0.3, 24)], 50.0, 10, 1, predicted_rate=1.0)[0]
    # With the default bound it is protected, and a slow predicted speed refuses the newcomer.
    assert not a.may_admit([(4, 0.3)], 50.0, 10, 1, predicted_rate=1.0)[0]


def test_reject_without_blocks():
    a = LatencyGuidedAdmission()
    ok, why = a.may_admit([], rate=None, free_kv_blocks=1, blocks_needed=2)
    assert not ok and "blocks" in why
    assert a.may_admit([], rate=None, free_kv_blocks=2, blocks_needed=2)[0]


def test_unknown_rate_admits():
    a = LatencyGuidedAdmission()
    assert a.may_admit([(0, 0.01)], rate=None, free_kv_blocks=5, blocks_needed=1)[0]
    assert a.may_admit([(0, 0.01)], rate=0.0, free_kv_blocks=5, blocks_needed=1)[0]


def test_lag_only_after_protected_admission():
    a = LatencyGuidedAdmission(max_segment_tokens=10, lag_steps=1)
    protected = [(0, 5.0)]
    ok, why = a.may_admit(protected, 50.0, 10, 1)
    assert ok and "protected" in why
    a.note_admission()
    ok, why = a.may_admit(protected + [(0, 5.0)], 50.0, 10, 1)
    assert not ok and "lag" in why
    # Nothing to protect: nothing to wait for.
    assert a.may_admit([(0, 0.1)], 50.0, 10, 1)[0]
    a.note_step()
    assert a.may_admit(protected + [(0, 5.0)], 50.0, 10, 1)[0]
    # An admission with nothing protected starts no lag.
    b = LatencyGuidedAdmission(lag_steps=1)
    assert b.may_admit([(0, 0.1)], 50.0, 10, 1)[0]
    b.note_admission()
    assert b.may_admit(protected, 50.0, 10, 1)[0]
    # Neither does an admission into an empty engine.
    c = LatencyGuidedAdmission(lag_steps=1)
    assert c.may_admit([], 50.0, 10, 1)[0]
    c.note_admission()
    assert c.may_admit(protected, 50.0, 10, 1)[0]
    lag2 = LatencyGuidedAdmission(lag_steps=2)
    assert lag2.may_admit(protected, 50.0, 10, 1)[0]
    lag2.note_admission()
    lag2.note_step()
    assert not lag2.may_admit(protected, 50.0, 10, 1)[0]
    lag2.note_step()
    assert lag2.may_admit(protected, 50.0, 10, 1)[0]
    with pytest.raises(ValueError):
        LatencyGuidedAdmission(lag_steps=-1)


def test_segment_longer_than_bound_counts_as_zero_remaining():
    a = LatencyGuidedAdmission(max_segment_tokens=10)
    assert a.may_admit([(15, 0.0)], 50.0, 10, 1)[0]
    # Zero tokens left fits any non-negative budget, at any speed.
    assert a.may_admit([(15, 0.0)], 50.0, 10, 1, predicted_rate=0.001)[0]


def test_fixed_batch_cap():
    c = FixedBatchCap(2)
    assert c.may_admit([(0, 1.0)], None, 10, 1)[0]
    ok, why = c.may_admit([(0, 1.0), (0, 1.0)], None, 10, 1)
    assert not ok and "cap" in why
    assert not c.may_admit([], None, 0, 1)[0]
    c.note_admission()
    c.note_step()
    c.note_step(0.02, 2)
    with pytest.raises(ValueError):
        FixedBatchCap(0)


def test_blocks_only():
    b = BlocksOnlyAdmission()
    assert b.may_admit([(0, -5.0)] * 100, 1.0, 1, 1)[0]
    assert not b.may_admit([], None, 0, 1)[0]
    b.note_step(0.02, 100)
