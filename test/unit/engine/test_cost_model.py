import math

import numpy as np
import pytest

from timelyllm_ros.core.engine.cost_model import EngineProfile, EngineProfileError, fit_profile

REPO_PROFILE = "config/engine_profiles/llama3-8b-rtx4090.yaml"


def test_defaults_match_paper_table1():
    p = EngineProfile()
    # First token of a 2884-token prompt: 328.45 ms; then ~22 ms per token at batch 1.
    assert p.first_token_s(2884) == pytest.approx(0.32845, abs=1e-3)
    assert p.decode_step_s(1, 2885) == pytest.approx(0.02175, abs=5e-4)


def test_decode_grows_slowly_with_batch():
    p = EngineProfile()
    one = p.decode_step_s(1, 2900)
    sixteen = p.decode_step_s(16, 16 * 2900)
    assert one < sixteen < 2 * one  # memory-bound: 16x the tokens for well under 2x the time


def test_step_pays_prefill_and_decode():
    p = EngineProfile()
    assert p.step_s(100, 3, 5000) == pytest.approx(p.prefill_s(100) + p.decode_step_s(3, 5000))
    assert p.prefill_s(0) == 0.0 and p.decode_step_s(0, 0) == 0.0 and p.step_s(0, 0, 0) == 0.0


def test_shipped_yaml_is_the_default_profile():
    assert EngineProfile.from_yaml(REPO_PROFILE) == EngineProfile()


def test_yaml_round_trip(tmp_path):
    p = EngineProfile(name="x", prefill_fixed_s=0.001, decode_per_ctx_token_s=1.234567e-7,
                      kv_total_blocks=77, max_num_batched_tokens=512,
                      source="line one\nline two")
    path = tmp_path / "p.yaml"
    p.to_yaml(path)
    assert EngineProfile.from_yaml(path) == p


def test_yaml_partial_override_keeps_defaults(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: small\nkv_total_blocks: 100\n")
    p = EngineProfile.from_yaml(path)
    assert p.kv_total_blocks == 100 and p.decode_fixed_s == EngineProfile().decode_fixed_s


@pytest.mark.parametrize(
    "text, key",
    [
        ("decode_fixd_s: 0.1\n", "decode_fixd_s"),
        ("decode_fixed_s: -0.1\n", "decode_fixed_s"),
        ("prefill_per_token_s: fast\n", "prefill_per_token_s"),
        ("kv_block_size: 0\n", "kv_block_size"),
        ("kv_total_blocks: 12.5\n", "kv_total_blocks"),
        ("max_num_batched_tokens: 0\n", "max_num_batched_tokens"),
        ("name: ''\n", "name"),
    ],
)
def test_yaml_errors_name_the_key(tmp_path, text, key):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(EngineProfileError, match=key) as info:
        EngineProfile.from_yaml(path)
    assert str(path) in str(info.value)


def test_yaml_not_a_mapping(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(EngineProfileError, match="mapping"):
        EngineProfile.from_yaml(path)


def _samples(truth, rng, noise=0.0):
    pre = [(n, truth.prefill_s(n) + rng.normal(0, noise)) for n in range(100, 4001, 300)]
    dec = []
    for b in (1, 2, 4, 8, 16, 32):
        for ctx_per_seq in (500, 1500, 3000):
            ctx = b * ctx_per_seq + int(rng.integers(0, 200))
            dec.append((b, ctx, truth.decode_step_s(b, ctx) + rng.normal(0, noise)))
    return pre, dec


def test_fit_recovers_known_coefficients_exactly():
    truth = EngineProfile(prefill_fixed_s=0.004, prefill_per_token_s=9e-5, decode_fixed_s=0.015,
                          decode_per_seq_s=4e-4, decode_per_ctx_token_s=2e-7)
    pre, dec = _samples(truth, np.random.default_rng(0))
    fit = fit_profile(pre, dec, name="fit", kv_total_blocks=99)
    for key in ("prefill_fixed_s", "prefill_per_token_s", "decode_fixed_s", "decode_per_seq_s",
                "decode_per_ctx_token_s"):
        assert getattr(fit, key) == pytest.approx(getattr(truth, key), rel=1e-6), key
    assert fit.name == "fit" and fit.kv_total_blocks == 99
    assert "fit_profile" in fit.source


def test_fit_with_noise_is_close():
    truth = EngineProfile()
    pre, dec = _samples(truth, np.random.default_rng(1), noise=2e-4)
    fit = fit_profile(pre, dec)
    assert fit.prefill_per_token_s == pytest.approx(truth.prefill_per_token_s, rel=0.02)
    assert fit.decode_fixed_s == pytest.approx(truth.decode_fixed_s, rel=0.05)
    assert fit.first_token_s(2884) == pytest.approx(truth.first_token_s(2884), rel=0.01)


def test_fit_from_time_to_first_token():
    truth = EngineProfile()
    pre, dec = _samples(truth, np.random.default_rng(2))
    ttft = [(n, truth.first_token_s(int(n))) for n, _ in pre]
    fit = fit_profile(ttft, dec, prefill_includes_first_decode=True)
    assert fit.prefill_per_token_s == pytest.approx(truth.prefill_per_token_s, rel=1e-6)
    assert fit.prefill_fixed_s == pytest.approx(truth.prefill_fixed_s, rel=1e-4)


def test_fit_coefficients_are_nonnegative():
    # Timings that a free line would fit with a negative intercept.
    pre = [(100, 0.001), (200, 0.003), (300, 0.005)]
    dec = [(1, 100, 0.01), (2, 900, 0.012), (4, 300, 0.02), (8, 5000, 0.03)]
    fit = fit_profile(pre, dec)
    values = [fit.prefill_fixed_s, fit.prefill_per_token_s, fit.decode_fixed_s,
              fit.decode_per_seq_s, fit.decode_per_ctx_token_s]
    assert all(v >= 0 and math.isfinite(v) for v in values)


def test_fit_rejects_unidentifiable_or_bad_samples():
    good_pre = [(100, 0.01), (1000, 0.1)]
    with pytest.raises(EngineProfileError, match="decode_samples"):
        # context always proportional to batch: coefficients not separable
        fit_profile(good_pre, [(b, 1000 * b, 0.02 + 0.001 * b) for b in (1, 2, 4, 8)])
    with pytest.raises(EngineProfileError, match="prefill_samples"):
        fit_profile([(100, 0.01), (100, 0.011)], [(1, 10, 0.01), (2, 50, 0.02), (4, 20, 0.03)])
    with pytest.raises(EngineProfileError, match=r"decode_samples\[1\]"):
        fit_profile(good_pre, [(1, 10, 0.01), (2, 0.02), (4, 20, 0.03)])
    with pytest.raises(EngineProfileError, match="negative"):
        fit_profile([(100, -0.01), (1000, 0.1)], [(1, 10, 0.01), (2, 50, 0.02), (4, 20, 0.03)])
