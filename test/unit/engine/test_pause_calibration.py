"""The simulated engine's pauses are the model of the real engine's two resume paths
(core/engine/pause_calibration.py): a preserved pause recomputes one token (a parked vLLM
session), a discarded one the partial last KV block (abort + resubmit through the prefix
cache). `timelyllm profile --pauses` checks vLLM against `simulated_computed`; this checks the
simulated engine against it."""

from __future__ import annotations

import pytest

from timelyllm_ros.core.engine.base import DISCARD, PRESERVE, EngineRequest
from timelyllm_ros.core.engine.pause_calibration import simulated_computed
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine


@pytest.mark.parametrize("handling", [PRESERVE, DISCARD])
@pytest.mark.parametrize("context", [200, 500, 900])
def test_the_simulated_resume_computes_what_the_calibration_model_says(handling, context):
    engine = SimulatedEngine()
    block = engine.kv_usage().block_size
    prompt = list(range(1000, 1000 + context - 2))
    engine.add_request(EngineRequest("r#0", prompt, max_tokens=8,
                                     scripted_text="tk;mf,100;tc,90;ld;"))
    generated: list[int] = []
    for _ in range(100):
        for out in engine.step():
            generated += out.new_token_ids
        if len(generated) >= 2:
            break
    assert len(generated) >= 2
    engine.suspend_request("r#0", handling)
    ctx = prompt + generated
    engine.resume_request("r#0", EngineRequest("r#1", ctx, max_tokens=4,
                                               scripted_text="mf,10;mf,20;"))
    first = None
    for _ in range(100):
        first = next((o for o in engine.step() if o.request_id == "r#1"), None)
        if first is not None:
            break
    assert first is not None
    computed = len(ctx) - first.num_cached_tokens
    assert computed == simulated_computed(handling, len(ctx), block)
    if handling == PRESERVE:
        assert computed == 1
    else:
        assert 1 <= computed <= block


def _sample(handling, context, computed, seconds):
    from timelyllm_ros.core.engine.pause_calibration import PauseSample
    return PauseSample(handling, context, computed, computed, seconds, None)


def test_the_resume_cost_fit_takes_each_case_at_its_fastest():
    from timelyllm_ros.core.engine.pause_calibration import fit_resume_cost

    # 40 ms + 0.5 ms per token, each case measured twice, once slowed down by other work.
    samples = []
    for handling, context, computed in [(PRESERVE, 200, 1), (DISCARD, 200, 71),
                                        (DISCARD, 500, 115)]:
        exact = 0.040 + 0.0005 * computed
        samples += [_sample(handling, context, computed, exact * 3),
                    _sample(handling, context, computed, exact)]
    fit = fit_resume_cost(samples)
    assert fit.fixed_s == pytest.approx(0.040) and fit.per_token_s == pytest.approx(0.0005)
    assert fit.rms_s == pytest.approx(0.0, abs=1e-9)


def test_the_resume_cost_fit_needs_two_sizes():
    from timelyllm_ros.core.engine.pause_calibration import fit_resume_cost

    with pytest.raises(ValueError, match="two sizes"):
        fit_resume_cost([_sample(PRESERVE, 200, 1, 0.04), _sample(PRESERVE, 500, 1, 0.05)])


def test_the_calibration_table_reports_both_models():
    from timelyllm_ros.core.engine.cost_model import EngineProfile
    from timelyllm_ros.core.engine.pause_calibration import format_pause_samples

    samples = [_sample(PRESERVE, 200, 1, 0.041), _sample(DISCARD, 200, 71, 0.076)]
    table = format_pause_samples(samples, EngineProfile())
    assert "| discard | 200 | 71 | 71 | 76.0 |" in table
    assert "Measured resume step: 40.5 ms + 0.500 ms per token" in table
    assert "Profile `" in table
