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
