"""Every shipped engine profile loads, and the ones calibrated by arithmetic agree with it.

A profile derived from published figures (datasheets, model cards) writes its constants in
`source` ("Constants:" then `key = value` lines) and the arithmetic that turns them into the cost
model; this test redoes that arithmetic from the constants and compares it with the profile's
fields: the KV capacity exactly, the coefficients and the stated first-token time to 0.1 %.
The RTX 4090 profile (calibrated to the paper's Table 1) states its first token and its KV
tokens / blocks in prose; those are checked too. Measured profiles (`timelyllm profile`) only
need to load."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from timelyllm_ros.core.engine.cost_model import EngineProfile

PROFILES = Path(__file__).resolve().parents[3] / "config" / "engine_profiles"
MiB, GiB = 2 ** 20, 2 ** 30
CONSTANT = re.compile(r"^\s+([a-z][a-z0-9_]*) = (-?[0-9][0-9.]*(?:e-?[0-9]+)?)(?:\s|$)")
FIRST_TOKEN = re.compile(r"first token ([0-9.]+) ms for a (\d+)-token prompt")
KV_PROSE = re.compile(r"= (\d+) tokens = (\d+) blocks of (\d+) tokens")
RTX4090_BANDWIDTH = 1008e9  # NVIDIA Ada whitepaper: RTX 4090 memory bandwidth


def _profiles() -> list[Path]:
    return sorted(PROFILES.glob("*.yaml"))


def _constants(source: str) -> dict[str, float]:
    """The `key = value` lines between "Constants" and "Arithmetic:" in a profile's source."""
    if "Constants" not in source:
        return {}
    block = source.split("Constants", 1)[1].split("Arithmetic:", 1)[0]
    out = {}
    for line in block.splitlines()[1:]:
        m = CONSTANT.match(line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def derive(c: dict[str, float], kv_block_size: int) -> dict[str, float]:
    """The arithmetic written in the calibrated profiles (see their `source`)."""
    linear = c["layers"] * (2 * c["hidden"] * (c["q_heads"] + c["kv_heads"]) * c["head_dim"]
                            + 3 * c["hidden"] * c["intermediate"])
    other = 2 * c["vocab"] * c["hidden"] + c["layers"] * 2 * c["hidden"] + c["hidden"]
    params = linear + other
    weights = linear * c["linear_weight_bytes"] + other * c["other_weight_bytes"]
    kv_per_token = c["layers"] * c["kv_heads"] * c["head_dim"] * 2 * c["kv_cache_bytes"]
    kv_bytes = c["gpus"] * (c["gpu_memory_utilization"] * c["gpu_memory_mib"] * MiB
                            - c["non_kv_gib_per_gpu"] * GiB) - weights
    bandwidth = c["gpus"] * c["bandwidth_gb_s"] * 1e9 * c["decode_efficiency"]
    return {
        "params": params,
        "weights": weights,
        "kv_total_blocks": math.floor(kv_bytes / kv_per_token / kv_block_size),
        "decode_fixed_s": weights / bandwidth + 2 * c["layers"] * c["allreduce_s"],
        "decode_per_ctx_token_s": kv_per_token / bandwidth,
        "decode_per_seq_s": c["per_seq_s"],
        "prefill_per_token_s": 2 * params / (c["gpus"] * c["peak_tflops"] * 1e12
                                             * c["prefill_utilization"]),
        "prefill_fixed_s": c["prefill_fixed_s"],
    }


def _calibrated() -> list[Path]:
    return [p for p in _profiles() if _constants(EngineProfile.from_yaml(p).source)]


def test_profiles_are_shipped():
    names = {p.stem for p in _profiles()}
    assert {"llama3-8b-rtx4090", "llama3-8b-fp8-rtx4080", "llama3-8b-a10",
            "llama3-70b-tp2-h100", "llama3-70b-tp4-h100"} <= names
    assert len(_calibrated()) >= 4


@pytest.mark.parametrize("path", _profiles(), ids=lambda p: p.stem)
def test_profile_loads_and_names_itself(path):
    profile = EngineProfile.from_yaml(path)
    assert profile.name == path.stem
    assert profile.source.strip()
    assert profile.first_token_s(profile.max_model_len // 2) > 0
    assert profile.kv_capacity_tokens() >= profile.max_model_len, \
        "vLLM refuses to start when one full-length sequence does not fit the KV cache"


@pytest.mark.parametrize("path", _calibrated(), ids=lambda p: p.stem)
def test_calibrated_profile_matches_its_arithmetic(path):
    profile = EngineProfile.from_yaml(path)
    c = _constants(profile.source)
    d = derive(c, profile.kv_block_size)
    assert profile.kv_total_blocks == d["kv_total_blocks"]
    for key in ("decode_fixed_s", "decode_per_ctx_token_s", "decode_per_seq_s",
                "prefill_per_token_s", "prefill_fixed_s"):
        assert getattr(profile, key) == pytest.approx(d[key], rel=1e-3), key
    text = " ".join(profile.source.split())
    # The stated parameter count and weight bytes are the ones the constants give.
    assert f"{round(d['params']):,}" in text and f"{round(d['weights']):,} B" in text
    # Llama 3: 8B / 70B parameters, 128 KiB / 320 KiB of 16-bit KV per token.
    assert round(d["params"] / 1e9) in (8, 71)


@pytest.mark.parametrize("path", _calibrated(), ids=lambda p: p.stem)
def test_decode_efficiency_is_the_rtx4090_calibration(path):
    """The transferred decode efficiency is what the paper-calibrated RTX 4090 profile implies:
    Llama-3-8B's fp16 weights read once per decode step at 1008 GB/s."""
    c = _constants(EngineProfile.from_yaml(path).source)
    rtx4090 = EngineProfile.from_yaml(PROFILES / "llama3-8b-rtx4090.yaml")
    llama8 = dict(c, vocab=128256, hidden=4096, layers=32, q_heads=32, kv_heads=8,
                  head_dim=128, intermediate=14336, linear_weight_bytes=2, other_weight_bytes=2)
    weights = derive(llama8, 16)["weights"]
    assert weights == 16_060_522_496
    assert c["decode_efficiency"] == pytest.approx(
        weights / (RTX4090_BANDWIDTH * rtx4090.decode_fixed_s), abs=1e-4)


@pytest.mark.parametrize("path", [p for p in _profiles()
                                  if FIRST_TOKEN.search(" ".join(
                                      EngineProfile.from_yaml(p).source.split()))],
                         ids=lambda p: p.stem)
def test_stated_first_token_time(path):
    profile = EngineProfile.from_yaml(path)
    ms, tokens = FIRST_TOKEN.search(" ".join(profile.source.split())).groups()
    assert profile.first_token_s(int(tokens)) * 1e3 == pytest.approx(float(ms), rel=1e-3)


def test_rtx4090_profile_states_its_kv_arithmetic():
    profile = EngineProfile.from_yaml(PROFILES / "llama3-8b-rtx4090.yaml")
    tokens, blocks, size = map(int, KV_PROSE.search(" ".join(profile.source.split())).groups())
    assert (blocks, size) == (profile.kv_total_blocks, profile.kv_block_size)
    assert tokens == blocks * size == profile.kv_capacity_tokens()
    # 0.9 * 24 GiB - 14.96 GiB weights - 1.6 GiB = ~5 GiB of 128 KiB tokens (rounded down).
    kv = 0.9 * 24 * GiB - 16_060_522_496 - 1.6 * GiB
    assert tokens <= kv / (32 * 8 * 128 * 2 * 2) < tokens * 1.01


def test_kv_limited_profiles_are_kv_limited():
    """The point of these profiles: a few long prompts fill the KV cache (issue 11, point 5)."""
    for name in ("llama3-8b-fp8-rtx4080", "llama3-8b-a10", "llama3-70b-tp2-h100"):
        profile = EngineProfile.from_yaml(PROFILES / f"{name}.yaml")
        assert profile.kv_capacity_tokens() < 6 * profile.max_model_len, name
    tp4 = EngineProfile.from_yaml(PROFILES / "llama3-70b-tp4-h100.yaml")
    tp2 = EngineProfile.from_yaml(PROFILES / "llama3-70b-tp2-h100.yaml")
    assert tp4.kv_total_blocks > 10 * tp2.kv_total_blocks
    assert tp4.first_token_s(2884) < tp2.first_token_s(2884)
