"""Engine profiling (core/engine/profiling.py) and `timelyllm profile` (cli/profile.py):
measurement -> fit -> YAML, on engines whose true costs are known."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from timelyllm_ros.cli import profile as profile_cmd
from timelyllm_ros.core.engine.base import EngineOutput, KvUsage, StepTiming
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.engine.profiling import (DEFAULT_OUTPUT, FULL, QUICK, Measurements,
                                                 ProfilePlan, Profiler, fit_measurements, summary)

TRUE = EngineProfile(name="truth", prefill_fixed_s=0.03, prefill_per_token_s=0.004,
                     decode_fixed_s=0.05, decode_per_seq_s=0.002, decode_per_ctx_token_s=3e-6,
                     kv_block_size=32, kv_total_blocks=600, max_model_len=2048,
                     max_num_batched_tokens=4096)
SMALL = ProfilePlan(prefill_lengths=(16, 64, 200), prefill_repeats=2, decode_batches=(1, 3, 6),
                    decode_contexts=(64, 256), decode_steps=3)


def test_simulated_engine_profile_is_recovered():
    engine = SimulatedEngine(TRUE)
    logs = []
    m = Profiler(engine, log=logs.append).run(SMALL)
    assert [n for n, _ in m.prefill] == [16, 64, 200]
    assert len(m.decode) == 6 and not m.skipped
    # Prompts never hit the prefix cache: each time to first token is the uncached cost.
    for n, t in m.prefill:
        assert t == pytest.approx(TRUE.first_token_s(n))
    # Decode samples are pure decode steps with the right context.
    for b, ctx, t in m.decode:
        assert t == pytest.approx(TRUE.decode_step_s(b, ctx))
        assert ctx >= b * 64
    fitted = fit_measurements(m, name="fitted", source="test")
    for key in ("prefill_fixed_s", "prefill_per_token_s", "decode_fixed_s", "decode_per_seq_s",
                "decode_per_ctx_token_s"):
        assert getattr(fitted, key) == pytest.approx(getattr(TRUE, key), rel=1e-6, abs=1e-12), key
    assert (fitted.kv_block_size, fitted.kv_total_blocks, fitted.max_model_len) == (32, 600, 2048)
    # The engine's token budget per step is read from it, not assumed.
    assert fitted.max_num_batched_tokens == 4096
    assert "test" in fitted.source and "fit_profile" in fitted.source
    # The engine is left idle and clean.
    assert not engine.has_unfinished_requests()
    assert engine.kv_usage().free_blocks == engine.kv_usage().total_blocks
    assert any("prefill" in line for line in logs) and any("decode" in line for line in logs)
    table = summary(m, fitted)
    assert "prefill" in table and "decode" in table and "+0%" in table


class NoisyEngine:
    """A minimal EngineAdapter with known linear costs, plus interference: 30% of the steps take
    an extra 50 ms (another process on a shared machine), and some requests stop early (EOS)."""

    name = "noisy"

    def __init__(self, profile: EngineProfile, eos_every: int = 0):
        self.p = profile
        self.eos_every = eos_every
        self.reqs: dict[str, dict] = {}
        self.steps = 0
        self.timing = StepTiming()
        self.added = 0
        self.rng = random.Random(1)

    def max_model_len(self):
        return self.p.max_model_len

    def max_num_batched_tokens(self):
        return self.p.max_num_batched_tokens

    def kv_usage(self):
        return KvUsage(self.p.kv_total_blocks, self.p.kv_total_blocks, self.p.kv_block_size)

    def add_request(self, request):
        self.added += 1
        eos = self.eos_every and self.added % self.eos_every == 0
        self.reqs[request.request_id] = dict(prompt=len(request.prompt_token_ids), gen=0,
                                             max=1 if eos else request.max_tokens, new=True)

    def abort_request(self, rid):
        self.reqs.pop(rid, None)

    def has_unfinished_requests(self):
        return bool(self.reqs)

    def last_step_timing(self):
        return self.timing

    def step(self):
        self.steps += 1
        prefill = sum(r["prompt"] for r in self.reqs.values() if r["new"])
        ctx = sum(r["prompt"] + r["gen"] for r in self.reqs.values())
        busy = self.rng.random() < 0.3
        duration = self.p.step_s(prefill, len(self.reqs), ctx) + (0.05 if busy else 0.0)
        self.timing = StepTiming(duration_s=duration, batch_size=len(self.reqs))
        outs = []
        for rid, r in list(self.reqs.items()):
            r["new"] = False
            r["gen"] += 1
            done = r["gen"] >= r["max"]
            outs.append(EngineOutput(rid, [7], "x", finished=done))
            if done:
                del self.reqs[rid]
        return outs


def test_minimum_over_repeats_removes_interference():
    engine = NoisyEngine(TRUE)
    plan = ProfilePlan(prefill_lengths=(16, 64, 200), prefill_repeats=3, decode_batches=(1, 3, 6),
                       decode_contexts=(64, 256), decode_steps=4, warmup=False)
    m = Profiler(engine).run(plan)
    fitted = fit_measurements(m, name="noisy", source="")
    assert fitted.decode_fixed_s == pytest.approx(TRUE.decode_fixed_s, rel=1e-6)
    assert fitted.prefill_per_token_s == pytest.approx(TRUE.prefill_per_token_s, rel=1e-6)
    # The raw samples did see the interference.
    assert max(max(v) for v in m.prefill_raw.values()) > TRUE.first_token_s(200) + 0.04


def test_requests_ending_early_do_not_pollute_decode_samples():
    engine = NoisyEngine(TRUE, eos_every=4)
    plan = ProfilePlan(prefill_lengths=(16, 64), prefill_repeats=1, decode_batches=(2, 5),
                       decode_contexts=(64, 128), decode_steps=4, warmup=False)
    m = Profiler(engine).run(plan)
    # A batch that lost a member is not measured as that batch size.
    for (b, ctx, t) in m.decode:
        assert t == pytest.approx(TRUE.decode_step_s(b, ctx))
    assert not engine.has_unfinished_requests()


def test_configurations_that_do_not_fit_are_skipped():
    tiny = EngineProfile(kv_block_size=16, kv_total_blocks=40, max_model_len=300)
    engine = SimulatedEngine(tiny)
    plan = ProfilePlan(prefill_lengths=(16, 64, 512), prefill_repeats=1, decode_batches=(1, 2, 16),
                       decode_contexts=(32, 128, 512), decode_steps=3)
    m = Profiler(engine, max_num_seqs=8).run(plan)
    assert [n for n, _ in m.prefill] == [16, 64]
    assert any("512 tokens" in s for s in m.skipped)
    assert any("batch 16" in s for s in m.skipped)
    assert {b for b, _, _ in m.decode} <= {1, 2}


def test_robust_fit_drops_slow_outliers_only():
    m = Measurements(kv_block_size=32, kv_total_blocks=600, max_model_len=2048)
    m.prefill = [(n, TRUE.first_token_s(n)) for n in (16, 32, 64, 128, 256)]
    m.decode = [(b, b * c, TRUE.decode_step_s(b, b * c)) for b in (1, 2, 4, 8) for c in (128, 512)]
    clean = fit_measurements(m, name="clean", source="")
    assert m.outliers == []
    # Another process stole the CPU during two decode samples and one prefill sample.
    m.decode[2] = (m.decode[2][0], m.decode[2][1], m.decode[2][2] * 4)
    m.decode[5] = (m.decode[5][0], m.decode[5][1], m.decode[5][2] * 3)
    m.prefill[1] = (m.prefill[1][0], m.prefill[1][1] * 5)
    naive = fit_measurements(m, name="naive", source="", trim=False)
    assert naive.decode_fixed_s != pytest.approx(TRUE.decode_fixed_s, rel=0.05)
    robust = fit_measurements(m, name="robust", source="measured")
    assert len(m.outliers) == 3
    for key in ("prefill_per_token_s", "decode_fixed_s", "decode_per_seq_s",
                "decode_per_ctx_token_s"):
        assert getattr(robust, key) == pytest.approx(getattr(clean, key), rel=1e-6), key
    assert "Dropped as interference" in robust.source and robust.source.startswith("measured")
    assert "dropped from the fit" in summary(m, robust)


def test_plans_are_sane():
    for plan in (QUICK, FULL):
        assert len(set(plan.prefill_lengths)) >= 2
        assert len(plan.decode_batches) >= 2 and len(plan.decode_contexts) >= 2
        assert max(plan.prefill_lengths) <= 2048
    # quick really is smaller
    assert sum(QUICK.prefill_lengths) * QUICK.prefill_repeats < \
        sum(FULL.prefill_lengths) * FULL.prefill_repeats


def test_main_writes_a_profile_the_simulated_engine_loads(tmp_path, monkeypatch, capsys):
    class Config:
        dtype = "float32"
        enforce_eager = True
        max_num_seqs = 32

    engines = []

    kv_sizes = []

    def fake_build(model, dtype, max_model_len, kv_cache_bytes=None):
        engine = SimulatedEngine(TRUE)
        engines.append(engine)
        kv_sizes.append(kv_cache_bytes)
        return engine, Config()

    monkeypatch.setattr(profile_cmd, "build_profiling_engine", fake_build)
    out = tmp_path / "profiles" / "mine.yaml"
    assert profile_cmd.main(["--model", str(tmp_path), "--output", str(out), "--quick",
                             "--kv-cache-bytes", str(256 << 20)]) == 0
    assert kv_sizes == [256 << 20]  # the profiled engine's KV cache, in bytes
    text = out.read_text()
    assert text.startswith("# Engine step cost profile `mine`")
    loaded = EngineProfile.from_yaml(out)
    assert loaded.name == "mine"
    assert loaded.decode_fixed_s == pytest.approx(TRUE.decode_fixed_s, rel=1e-6)
    assert "dtype float32" in loaded.source
    SimulatedEngine(loaded)  # usable as is
    printed = capsys.readouterr().out
    assert "fitted profile" in printed and "wrote" in printed


def test_main_rejects_a_missing_model_dir(tmp_path, capsys):
    assert profile_cmd.main(["--model", str(tmp_path / "nope"), "--output",
                             str(tmp_path / "x.yaml")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_shipped_cpu_profile_loads():
    path = Path(DEFAULT_OUTPUT)
    if not path.exists():
        pytest.skip("no measured profile shipped yet")
    profile = EngineProfile.from_yaml(path)
    assert profile.name == "vllm-cpu-smollm2-135m"
    assert profile.decode_step_s(1, 500) > 0 and profile.first_token_s(400) > 0
    SimulatedEngine(profile)


def test_main_repeats_option(tmp_path, monkeypatch):
    plans = []

    class Config:
        dtype, enforce_eager, max_num_seqs = "bfloat16", True, 32

    real_run = Profiler.run

    def spy(self, plan):
        plans.append(plan)
        return real_run(self, plan)

    monkeypatch.setattr(profile_cmd, "build_profiling_engine",
                        lambda *a: (SimulatedEngine(TRUE), Config()))
    monkeypatch.setattr(Profiler, "run", spy)
    out = tmp_path / "p.yaml"
    assert profile_cmd.main(["--model", str(tmp_path), "--output", str(out), "--quick",
                             "--repeats", "4"]) == 0
    assert plans[0].prefill_repeats == 4 and plans[0].decode_rounds == 4
    assert plans[0].decode_steps >= 4
    assert "minimum of 4 rounds" in EngineProfile.from_yaml(out).source
