"""The Llama-3-8B / H100 profile (issue 21, part 2): derived from datasheets, the model card and
vLLM's own defaults, never fitted to runs of the TypeFly workload it is meant to predict.

test_engine_profiles.py already redoes every calibrated profile's arithmetic from the constants in
its `source`; here the constants themselves are pinned to the cited figures, the engine settings
to what the installed vLLM actually defaults to, and the profile is driven through the simulated
engine (chunked prefill at its 2048-token budget, the authors' shared prompt prefix cached)."""

from __future__ import annotations

import math
from pathlib import Path
from unittest import mock

import pytest

from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from test_engine_profiles import _constants, derive

PROFILE = Path(__file__).resolve().parents[3] / "config" / "engine_profiles" / "llama3-8b-h100.yaml"
MiB, GiB = 2 ** 20, 2 ** 30

# The cited figures, restated so that a change to the profile's constants has to change them too.
DATASHEET = {
    # Meta Llama 3 model card / config.json (Meta-Llama-3-8B-Instruct)
    "vocab": 128256, "hidden": 4096, "layers": 32, "q_heads": 32, "kv_heads": 8,
    "head_dim": 128, "intermediate": 14336,
    # bf16 weights and KV cache
    "linear_weight_bytes": 2, "other_weight_bytes": 2, "kv_cache_bytes": 2,
    # NVIDIA H100 datasheet, SXM: 3.35 TB/s HBM3, 1,979 TFLOPS BF16 with sparsity = 989.4 dense
    "gpus": 1, "bandwidth_gb_s": 3350, "peak_tflops": 989.4, "gpu_memory_mib": 81559,
    # vLLM 0.32 default
    "gpu_memory_utilization": 0.92,
    # named assumptions shared with the other datasheet profiles
    "non_kv_gib_per_gpu": 1.6, "decode_efficiency": 0.7573, "prefill_utilization": 0.6,
    "allreduce_s": 0, "per_seq_s": 0.00025, "prefill_fixed_s": 0.002,
}

# The authors' prompt on the Llama 3 tokenizer, as the profile's source states it: the shortest
# and longest of the 8 drone traces, and the prefix all of them share.
SHORTEST, LONGEST, SHARED = 2884, 2925, 2843


@pytest.fixture(scope="module")
def profile() -> EngineProfile:
    return EngineProfile.from_yaml(PROFILE)


def test_constants_are_the_cited_figures(profile):
    c = _constants(profile.source)
    assert c == DATASHEET
    assert profile.name == "llama3-8b-h100"
    assert (profile.kv_block_size, profile.max_model_len, profile.max_num_batched_tokens) == \
        (16, 8192, 2048)


def test_fields_recomputed_from_datasheets(profile):
    """The same arithmetic as the other datasheet profiles, written out once more by hand."""
    linear = 32 * (2 * 4096 * (32 + 8) * 128 + 3 * 4096 * 14336)
    rest = 2 * 128256 * 4096 + 32 * 2 * 4096 + 4096
    assert linear + rest == 8_030_261_248  # the model card's 8.03B
    weights = 2 * (linear + rest)
    kv_per_token = 32 * 8 * 128 * 2 * 2
    assert kv_per_token == 128 * 1024
    kv_bytes = 0.92 * 81559 * MiB - 1.6 * GiB - weights
    assert profile.kv_total_blocks == math.floor(kv_bytes / kv_per_token / 16) == 29039
    read = 3350e9 * 0.7573  # bytes per second a decode step streams
    assert profile.decode_fixed_s == pytest.approx(weights / read, rel=1e-4)
    assert profile.decode_per_ctx_token_s == pytest.approx(kv_per_token / read, rel=1e-4)
    assert profile.prefill_per_token_s == pytest.approx(2 * (linear + rest) / (989.4e12 * 0.6),
                                                        rel=1e-4)
    assert (profile.decode_per_seq_s, profile.prefill_fixed_s) == (0.00025, 0.002)
    # ...and test_engine_profiles.derive agrees with the hand arithmetic.
    d = derive(DATASHEET, 16)
    assert d["kv_total_blocks"] == profile.kv_total_blocks
    assert d["decode_fixed_s"] == pytest.approx(weights / read)


def test_timings_against_other_profiles(profile):
    """Sanity: faster than the RTX 4090 (3.3x its bandwidth, 6x its fp16 tensor peak) by about
    the datasheet ratios, and its KV cache far larger."""
    rtx4090 = EngineProfile.from_yaml(PROFILE.with_name("llama3-8b-rtx4090.yaml"))
    assert profile.first_token_s(SHORTEST) * 1e3 == pytest.approx(86.75, abs=0.01)
    assert profile.decode_step_s(1, SHORTEST + 1) * 1e3 == pytest.approx(6.73, abs=0.01)
    assert rtx4090.decode_fixed_s / profile.decode_fixed_s == pytest.approx(3350 / 1008, rel=1e-3)
    assert profile.first_token_s(SHORTEST) < rtx4090.first_token_s(SHORTEST) / 3
    assert profile.kv_capacity_tokens() > 10 * rtx4090.kv_capacity_tokens()


def test_engine_settings_are_vllm_defaults(profile):
    """gpu_memory_utilization, block size and the step's token budget are what the installed
    vLLM gives an LLMEngine on an 80 GB H100 when nothing is set."""
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    from vllm.config.cache import CacheConfig
    from vllm.config.scheduler import SchedulerConfig
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.llm_engine import LLMEngine
    import inspect

    c = _constants(profile.source)
    assert c["gpu_memory_utilization"] == arg_utils.EngineArgs.gpu_memory_utilization
    assert profile.kv_block_size == CacheConfig.DEFAULT_BLOCK_SIZE
    platform = arg_utils.current_platform
    with mock.patch.object(platform, "get_device_total_memory", return_value=81559 * MiB), \
            mock.patch.object(platform, "get_device_name", return_value="NVIDIA H100 80GB HBM3"), \
            mock.patch.object(platform, "is_tpu", return_value=False), \
            mock.patch.object(platform, "is_cpu", return_value=False):
        batched, seqs = arg_utils.EngineArgs.get_batch_defaults(1)
    assert batched[UsageContext.LLM_CLASS] == 16384  # the H100 entry the source names
    context = inspect.signature(LLMEngine.from_engine_args).parameters["usage_context"].default
    assert context == UsageContext.ENGINE_CONTEXT and context not in batched and context not in seqs
    assert profile.max_num_batched_tokens == SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS
    assert SchedulerConfig.DEFAULT_MAX_NUM_SEQS == 128 <= profile.max_num_batched_tokens


def test_prompt_counts_stated_in_source(profile):
    text = " ".join(profile.source.split())
    blocks = SHARED // profile.kv_block_size
    assert f"{SHORTEST:,} to {LONGEST:,} tokens" in text
    assert f"first {SHARED:,} tokens" in text
    assert f"{blocks} blocks = {blocks * 16:,} tokens" in text
    assert f"computes {SHORTEST - blocks * 16} to {LONGEST - blocks * 16}" in text
    assert f"first token {profile.first_token_s(SHORTEST) * 1e3:.2f} ms for a {SHORTEST}-token" \
        in text


def test_simulated_engine_runs_the_profile(profile):
    """vLLM's default max_num_seqs (128) fits the 2048-token budget; a cold prompt of the authors'
    shortest length is prefilled in two chunks; a second task with the shared prefix cached
    computes only its own tail."""
    engine = SimulatedEngine(profile, max_num_seqs=128)
    shared = list(range(SHARED))
    first = shared + [50_000 + i for i in range(SHORTEST - SHARED)]
    second = shared + [60_000 + i for i in range(LONGEST - SHARED)]

    engine.add_request(EngineRequest("a", first, 2, scripted_text="mf,50;"))
    assert engine.step() == []  # first chunk: no token yet
    assert engine.last_step_timing().prefill_tokens == 2048
    out = engine.step()
    assert [o.request_id for o in out] == ["a"] and out[0].num_cached_tokens == 0
    chunked = profile.step_s(2048, 1, 2048) + profile.step_s(SHORTEST - 2048, 1, SHORTEST)
    assert engine.now() == pytest.approx(chunked)
    assert chunked * 1e3 == pytest.approx(95.44, abs=0.01)
    t = engine.now()
    engine.step()
    assert engine.now() - t == pytest.approx(profile.decode_step_s(1, SHORTEST + 1))
    while engine.has_unfinished_requests():
        engine.step()

    engine.add_request(EngineRequest("b", second, 2, scripted_text="tc,90;"))
    t = engine.now()
    out = engine.step()
    cached = SHARED // 16 * 16
    assert out[0].num_cached_tokens == cached == 2832
    assert engine.now() - t == pytest.approx(profile.step_s(LONGEST - cached, 1, LONGEST))
    assert (engine.now() - t) * 1e3 == pytest.approx(11.25, abs=0.01)
