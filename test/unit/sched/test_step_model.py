"""The step-time model learned online (core/sched/step_model.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.sched.step_model import (FEATURES, PINV_RCOND, StepTimeModel,
                                                   _pseudo_inverse)

PROFILE = EngineProfile()
# A different engine: slower per sequence and per context token, dearer prefill.
TRUTH = dataclasses.replace(PROFILE, decode_fixed_s=0.015, decode_per_seq_s=0.0009,
                            decode_per_ctx_token_s=4e-7, prefill_fixed_s=0.004,
                            prefill_per_token_s=2e-4)


def _steps(n, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        b = int(rng.integers(1, 200))
        ctx = int(b * rng.integers(200, 3000))
        p = int(rng.integers(0, 4000)) if rng.random() < 0.3 else 0
        yield b, ctx, p


def _feed(model, truth, n, seed=0):
    for b, ctx, p in _steps(n, seed):
        model.observe(truth.step_s(p, b, ctx), b, ctx, p)


def test_before_any_step_the_model_is_the_profile():
    model = StepTimeModel(PROFILE)
    for name, value in model.coefficients().items():
        assert value == pytest.approx(getattr(PROFILE, name))
    assert model.step_s(8, 8000, 500) == pytest.approx(PROFILE.step_s(500, 8, 8000))


def test_it_converges_to_a_linear_truth_from_the_profile_prior():
    model = StepTimeModel(PROFILE, prior_steps=50, memory_steps=1e9)
    _feed(model, TRUTH, 5000)
    coef = model.coefficients()
    for name in FEATURES:
        assert coef[name] == pytest.approx(getattr(TRUTH, name), rel=0.03), name
    for b, ctx, p in [(1, 300, 0), (64, 64 * 1500, 0), (16, 20000, 2048)]:
        assert model.step_s(b, ctx, p) == pytest.approx(TRUTH.step_s(p, b, ctx), rel=0.01)


def test_a_stand_in_prior_gives_way_faster_than_an_informed_one():
    informed = StepTimeModel(PROFILE, prior_steps=50)
    stand_in = StepTimeModel(None)  # the default profile at one step's weight
    _feed(informed, TRUTH, 20)
    _feed(stand_in, TRUTH, 20)
    b, ctx = 128, 128 * 1500
    truth = TRUTH.step_s(0, b, ctx)
    assert abs(stand_in.step_s(b, ctx, 0) - truth) < abs(informed.step_s(b, ctx, 0) - truth)


def test_a_direction_no_step_has_moved_stays_at_the_prior():
    model = StepTimeModel(PROFILE)
    for b, ctx, _ in _steps(500):
        model.observe(TRUTH.step_s(0, b, ctx), b, ctx, 0)  # decode only
    coef = model.coefficients()
    assert coef["prefill_per_token_s"] == pytest.approx(PROFILE.prefill_per_token_s)
    assert coef["prefill_fixed_s"] == pytest.approx(PROFILE.prefill_fixed_s)


def test_forgetting_follows_an_engine_that_changes():
    short = StepTimeModel(PROFILE, memory_steps=200)
    long = StepTimeModel(PROFILE, memory_steps=1e9)
    for model in (short, long):
        _feed(model, PROFILE, 3000, seed=1)
        _feed(model, TRUTH, 1500, seed=2)
    b, ctx = 100, 100 * 1000
    truth = TRUTH.step_s(0, b, ctx)
    # About 200 steps of memory against the prior's 50: the new engine's fit, shrunk towards
    # the profile by 50 / 250.
    shrink = 200 / 250
    expected = shrink * truth + (1 - shrink) * PROFILE.step_s(0, b, ctx)
    assert short.step_s(b, ctx, 0) == pytest.approx(expected, rel=0.01)
    assert abs(short.step_s(b, ctx, 0) - truth) < abs(long.step_s(b, ctx, 0) - truth)


def test_idle_steps_teach_nothing_and_bad_input_is_named():
    model = StepTimeModel(PROFILE)
    model.observe(0.5, 0, 0, 0)
    assert model.steps_seen == 0
    with pytest.raises(ValueError, match="duration_s"):
        model.observe(float("nan"), 1, 1, 0)
    with pytest.raises(ValueError, match="batch_size"):
        model.observe(0.1, -1, 1, 0)
    with pytest.raises(ValueError, match="prior_steps"):
        StepTimeModel(PROFILE, prior_steps=0)
    with pytest.raises(ValueError, match="memory_steps"):
        StepTimeModel(PROFILE, memory_steps=0.5)


def test_the_solve_is_numpys_hermitian_pinv_bit_for_bit():
    # The decision must not move when the solve is made cheaper: the same numbers, not close.
    rng = np.random.default_rng(7)
    for trial in range(300):
        x = rng.normal(size=(int(rng.integers(1, 12)), 5)) * 10.0 ** rng.uniform(-4, 4, size=5)
        if trial % 3 == 0:
            x[:, int(rng.integers(5))] = 0.0  # a direction no step has moved
        evidence = x.T @ x
        expected = np.linalg.pinv(evidence, rcond=PINV_RCOND, hermitian=True)
        assert np.array_equal(_pseudo_inverse(evidence), expected)
