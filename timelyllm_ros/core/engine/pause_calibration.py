"""Calibrate the simulated engine's pause models against the real engine's two paths.

The simulated engine's `preserve` pause is the model of a parked vLLM session, its `discard`
pause the model of abort + resubmit through the prefix cache (sim/pauses.py). What a resume
costs in each is a prefill of the tokens it computes again: the simulated engine charges
`profile.step_s(computed, 1, context)`. This measures, on the real engine (`timelyllm profile
--pauses`), for plans of a few context sizes:
- the tokens each path computes on resume (vLLM's own accounting, `VllmEngine.request_stats`)
  and the simulated engine's figure for the same resume (it must agree: 1 for preserve, the
  partial last block for discard);
- the measured time of the resume step against the profile's prediction, and a straight-line
  fit of the measured times (`fit_resume_cost`): what one resume costs as a function of the
  tokens it computes, to set beside the profile's prefill model, which the simulated engine
  charges for those tokens.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from dataclasses import dataclass

import numpy as np

from timelyllm_ros.core.engine.base import DISCARD, PRESERVE, EngineRequest
from timelyllm_ros.core.engine.cost_model import EngineProfile


@dataclass(frozen=True)
class PauseSample:
    handling: str
    context_tokens: int
    computed_tokens: int
    simulated_computed: int
    resume_s: float
    predicted_s: float | None


def simulated_computed(handling: str, context: int, block_size: int) -> int:
    """Tokens the simulated engine computes on resume (sim/pauses.py and its prefix cache)."""
    if handling == PRESERVE:
        return 1
    cached = ((context - 1) // block_size) * block_size
    return context - cached


def _first_output_s(engine, rid: str) -> float:
    start = time.perf_counter()
    for _ in range(10_000):
        if any(o.request_id == rid and o.new_token_ids for o in engine.step()):
            return time.perf_counter() - start
    raise RuntimeError(f"{rid}: no output")


def measure_pause_paths(engine, contexts=(200, 500, 900), repeats: int = 3,
                        profile: EngineProfile | None = None, seed: int = 0
                        ) -> list[PauseSample]:
    """Resume a plan of each context size through both paths, `repeats` times."""
    rng = random.Random(seed)
    block = engine.kv_usage().block_size
    out = []
    for n, context in enumerate(contexts):
        for r in range(repeats):
            for handling in (PRESERVE, DISCARD):
                rid = f"calib-{n}-{r}-{handling}"
                prompt = [rng.randrange(1000, 30000) for _ in range(context - 2)]
                # With a grammar a session's first chunk is one token: it parks after it.
                engine.add_request(EngineRequest(f"{rid}#0", prompt, max_tokens=64,
                                                 output_regex="[a-z]{1,40};"))
                generated: list[int] = []
                while not generated:
                    for o in engine.step():
                        if o.request_id == f"{rid}#0":
                            generated += o.new_token_ids
                ctx = prompt + generated
                if handling == PRESERVE:
                    engine.suspend_request(f"{rid}#0", PRESERVE)
                    engine.resume_request(f"{rid}#0", EngineRequest(f"{rid}#1", ctx, 4))
                else:
                    engine.abort_request(f"{rid}#0")
                    engine.add_request(EngineRequest(f"{rid}#1", ctx, 4))
                seconds = _first_output_s(engine, f"{rid}#1")
                stats = engine.request_stats(f"{rid}#1")
                engine.abort_request(f"{rid}#1")
                predicted = None
                if profile is not None:
                    predicted = profile.step_s(stats.computed_tokens, 1, len(ctx))
                path = PRESERVE if stats.path == "session" else DISCARD
                out.append(PauseSample(
                    path, len(ctx), stats.computed_tokens,
                    simulated_computed(handling, len(ctx), block), seconds, predicted))
    return out


@dataclass(frozen=True)
class ResumeCostFit:
    """resume step seconds ~= fixed_s + per_token_s * tokens computed (least squares over the
    fastest sample of each case: the minimum is the machine's cost, the rest is noise)."""

    fixed_s: float
    per_token_s: float
    rms_s: float


def fit_resume_cost(samples: list[PauseSample]) -> ResumeCostFit:
    cases: dict[tuple[str, int], list[PauseSample]] = {}
    for s in samples:
        cases.setdefault((s.handling, s.context_tokens), []).append(s)
    xs = [float(min(g, key=lambda s: s.resume_s).computed_tokens) for g in cases.values()]
    ys = [min(s.resume_s for s in g) for g in cases.values()]
    if len(set(xs)) < 2:
        raise ValueError("fit_resume_cost: needs resumes of at least two sizes")
    slope, fixed = np.polyfit(xs, ys, 1)
    residual = np.polyval((slope, fixed), xs) - np.asarray(ys)
    return ResumeCostFit(float(fixed), float(slope), float(np.sqrt(np.mean(residual ** 2))))


def format_pause_samples(samples: list[PauseSample], profile: EngineProfile | None = None) -> str:
    lines = ["| path | context | computed (vLLM) | computed (sim model) | resume step ms | "
             "profile predicts ms |", "|---|---|---|---|---|---|"]
    keys = sorted({(s.handling, s.context_tokens // 100) for s in samples})
    for handling, bucket in keys:
        group = [s for s in samples if s.handling == handling and s.context_tokens // 100 == bucket]
        pred = [s.predicted_s for s in group if s.predicted_s is not None]
        lines.append(
            f"| {handling} | {group[0].context_tokens} | "
            f"{statistics.median(s.computed_tokens for s in group):.0f} | "
            f"{statistics.median(s.simulated_computed for s in group):.0f} | "
            f"{1e3 * min(s.resume_s for s in group):.1f} | "
            f"{(1e3 * statistics.median(pred)) if pred else float('nan'):.1f} |")
    try:
        fit = fit_resume_cost(samples)
    except ValueError:
        return "\n".join(lines)
    lines.append("")
    lines.append(f"Measured resume step: {1e3 * fit.fixed_s:.1f} ms + {1e3 * fit.per_token_s:.3f} "
                 f"ms per token computed (rms {1e3 * fit.rms_s:.1f} ms).")
    if profile is not None:
        fixed = profile.prefill_fixed_s + profile.decode_step_s(1, 0)
        lines.append(f"Profile `{profile.name}`: {1e3 * fixed:.1f} ms + "
                     f"{1e3 * profile.prefill_per_token_s:.3f} ms per token (prefill fixed + one "
                     "decode step, prefill per token).")
    return "\n".join(lines)


def run_pause_calibration(model: str, profile_path, log=None, repeats: int = 3,
                          dtype: str | None = None) -> str:
    """`timelyllm profile --pauses`: the real engine with sessions, the table of both paths."""
    from pathlib import Path

    from timelyllm_ros.core.engine.vllm_engine import VllmEngine
    from timelyllm_ros.core.engine.vllm_engine_config import VllmEngineConfig

    profile = EngineProfile.from_yaml(profile_path) if Path(profile_path).is_file() else None
    config = VllmEngineConfig(model=model, ignore_eos=True)
    if dtype:
        config = dataclasses.replace(config, dtype=dtype)
    engine = VllmEngine(config)
    try:
        if log:
            log("engine ready; resuming plans through both paths ...")
        samples = measure_pause_paths(engine, profile=profile, repeats=repeats)
    finally:
        engine.shutdown()
    return format_pause_samples(samples, profile)
