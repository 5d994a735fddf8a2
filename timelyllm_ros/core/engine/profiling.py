"""Engine profiling: measure an engine's step latency and fit the simulated engine's cost model.
`timelyllm profile` (timelyllm_ros/cli/profile.py) runs it on the real engine; no ROS here, and
vLLM is imported only when the real engine is built or described.

What is measured (see timelyllm_ros/core/engine/cost_model.py for the model that is fitted):

- prefill: time to first token of one request alone, for several prompt lengths. Prompts are
  random token ids, fresh for every request, so nothing comes from the prefix cache. Each sample
  includes the first decode step, which the fit subtracts (`prefill_includes_first_decode`).
- decode: for every (batch size, context length) pair, that many requests decode together and
  the duration of each step in which all of them sample one token is recorded. The requests of
  one context length share a random prefix of whole KV blocks, cached by one priming request, so
  only a few unique tokens per request are prefilled: the decode steps still attend over the
  full context, but the set-up costs seconds instead of minutes on a CPU.

Timing comes from the engine's `last_step_timing()` (wall time of `step()` for vLLM, modelled
time for the simulated engine), so any EngineAdapter can be profiled; the tests profile a
simulated engine whose coefficients are known.

Other processes on a shared machine add delays, never remove them. So each configuration keeps
the *minimum* of its samples, the samples of one configuration are spread over rounds (each
round visits every configuration once, so a burst of load spoils one sample of many
configurations instead of all samples of one), and the fit drops, one by one, samples still far
slower than the fit of the rest (`fit_measurements`, listed in the profile's source).

Real vLLM requests are sent with `ignore_eos`, so a random prompt cannot end a sample early.
"""

from __future__ import annotations

import os
import platform
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from timelyllm_ros.core.engine.base import EngineAdapter, EngineRequest
from timelyllm_ros.core.engine.cost_model import EngineProfile, EngineProfileError, fit_profile
from timelyllm_ros.core.engine.factory import EngineSpec, build_engine
from timelyllm_ros.core.engine.vllm_engine_config import VllmEngineConfig

# timelyllm_ros/core/engine/profiling.py -> the repository root
REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_OUTPUT = REPO_ROOT / "config" / "engine_profiles" / "vllm-cpu-smollm2-135m.yaml"
# Token ids for random prompts come from this range (inside any real vocabulary of interest,
# clear of the special tokens at the start of most vocabularies).
TOKEN_ID_RANGE = (1000, 30000)
# Unique tokens after the shared prefix of a decode request.
SUFFIX_TOKENS = 4


@dataclass(frozen=True)
class ProfilePlan:
    prefill_lengths: tuple[int, ...]
    prefill_repeats: int
    decode_batches: tuple[int, ...]
    # Context lengths are rounded down to whole KV blocks (plus SUFFIX_TOKENS).
    decode_contexts: tuple[int, ...]
    # Decode steps per configuration, spread over `decode_rounds` visits.
    decode_steps: int
    decode_rounds: int = 2
    warmup: bool = True


# Prefill lengths cover what a planner really prefills: with the skill set's prompt in the prefix
# cache, a task pays for its instruction and the partial last KV block (< 128 tokens on CPU), and
# a resumed generation for even less. The cost grows faster than linearly beyond that on CPU, so
# longer prompts would only pull the linear fit away from the range that matters.
# About 3 minutes with bf16 weights on a 2-core AVX2 machine.
FULL = ProfilePlan(prefill_lengths=(16, 32, 64, 128, 192, 256), prefill_repeats=3,
                   decode_batches=(1, 2, 4, 8, 16), decode_contexts=(128, 384, 768),
                   decode_steps=8)
# Under 2 minutes on the same machine, engine start included.
QUICK = ProfilePlan(prefill_lengths=(32, 128, 256), prefill_repeats=2,
                    decode_batches=(1, 4, 8), decode_contexts=(128, 384), decode_steps=5)


@dataclass
class Measurements:
    # (prompt tokens, seconds to first token), minimum over repeats
    prefill: list[tuple[int, float]] = field(default_factory=list)
    # (batch size, total context tokens, seconds), the fastest step of each configuration
    decode: list[tuple[int, int, float]] = field(default_factory=list)
    # every raw sample, for the summary: per prefill length, and aligned with `decode`
    prefill_raw: dict[int, list[float]] = field(default_factory=dict)
    decode_raw: list[list[float]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    # Engine geometry, read while the engine runs (the profile needs it after shutdown).
    kv_block_size: int = 16
    kv_total_blocks: int = 1
    max_model_len: int = 1
    max_num_batched_tokens: int = 8192
    # Samples the robust fit dropped (filled by fit_measurements).
    outliers: list[str] = field(default_factory=list)


class Profiler:
    """Runs a ProfilePlan against any EngineAdapter that is otherwise idle."""

    def __init__(self, engine: Any, *, seed: int = 0, log: Callable[[str], None] | None = None,
                 max_num_seqs: int | None = None):
        self.engine = engine
        self.rng = random.Random(seed)
        self.log = log or (lambda msg: None)
        self.max_num_seqs = max_num_seqs
        self._ids = 0

    # -- helpers ---------------------------------------------------------------------------
    def _random_ids(self, n: int) -> list[int]:
        lo, hi = TOKEN_ID_RANGE
        return [self.rng.randrange(lo, hi) for _ in range(n)]

    def _request_id(self, kind: str) -> str:
        self._ids += 1
        return f"__profile__{kind}{self._ids}"

    def _add(self, prompt: list[int], max_tokens: int, kind: str) -> str:
        rid = self._request_id(kind)
        # The simulated engine generates its script; real engines ignore it.
        self.engine.add_request(EngineRequest(rid, prompt, max_tokens,
                                              scripted_text=" x" * max_tokens))
        return rid

    def _step(self) -> tuple[list, float]:
        outputs = self.engine.step()
        return outputs, float(self.engine.last_step_timing().duration_s)

    def _drain(self) -> None:
        while self.engine.has_unfinished_requests():
            self.engine.step()

    # -- measurements ----------------------------------------------------------------------
    def warmup(self) -> None:
        """One small prefill and a few batched decode steps: first steps pay one-time costs."""
        rids = [self._add(self._random_ids(32), 4, "warm") for _ in range(2)]
        self._drain()
        for rid in rids:
            self.engine.abort_request(rid)

    def time_to_first_token(self, prompt: list[int]) -> float:
        """Seconds of engine steps from adding a lone request until its first token."""
        rid = self._add(prompt, 1, "prefill")
        total = 0.0
        while True:
            outputs, duration = self._step()
            total += duration
            if any(o.request_id == rid and o.new_token_ids for o in outputs):
                break
            if not self.engine.has_unfinished_requests():
                raise RuntimeError(f"prefill request of {len(prompt)} tokens ended without a token")
        self.engine.abort_request(rid)
        self._drain()
        return total

    def decode_steps(self, batch: int, prefix: list[int], steps: int) -> list[tuple[int, float]]:
        """(total context, seconds) of each step in which all `batch` requests decoded."""
        prompts = [prefix + self._random_ids(SUFFIX_TOKENS) for _ in range(batch)]
        rids = [self._add(p, steps + 1, "decode") for p in prompts]
        generated = dict.fromkeys(rids, 0)
        prompt_len = len(prompts[0])
        samples = []
        for _ in range(steps + 8):  # a few spare steps in case the engine splits the prefill
            before = dict(generated)
            outputs, duration = self._step()
            got = {o.request_id: len(o.new_token_ids) for o in outputs if o.request_id in generated}
            for rid, n in got.items():
                generated[rid] += n
            # A pure decode step: everyone had sampled before and gains exactly one token.
            if all(before[r] >= 1 for r in rids) and all(got.get(r) == 1 for r in rids):
                context = sum(prompt_len + before[r] for r in rids)
                samples.append((context, duration))
            if len(samples) >= steps or not self.engine.has_unfinished_requests():
                break
        for rid in rids:
            self.engine.abort_request(rid)
        self._drain()
        return samples

    def run(self, plan: ProfilePlan) -> Measurements:
        """Measure everything in `plan`. Repeats are spread over rounds, each round visiting
        every configuration once, so that a burst of load from another process spoils one
        sample of several configurations rather than every sample of one."""
        started = time.monotonic()
        m = Measurements()
        max_len = int(self.engine.max_model_len())
        kv = self.engine.kv_usage()
        m.kv_block_size, m.kv_total_blocks, m.max_model_len = \
            int(kv.block_size), int(kv.total_blocks), max_len
        m.max_num_batched_tokens = int(self.engine.max_num_batched_tokens())
        if plan.warmup:
            self.log("warm-up ...")
            self.warmup()

        lengths = [n for n in plan.prefill_lengths if n + 2 <= max_len]
        m.skipped += [f"prefill {n} tokens: longer than max_model_len {max_len}"
                      for n in plan.prefill_lengths if n not in lengths]
        raw: dict[int, list[float]] = {n: [] for n in lengths}
        for r in range(plan.prefill_repeats):
            for n in lengths:
                raw[n].append(self.time_to_first_token(self._random_ids(n)))
                self.log(f"[prefill round {r + 1}/{plan.prefill_repeats}] {n:5d} tokens: "
                         f"{raw[n][-1] * 1e3:9.1f} ms")
        m.prefill_raw = raw
        m.prefill = [(n, min(raw[n])) for n in lengths]

        block = max(1, int(kv.block_size))
        rounds = max(1, plan.decode_rounds)
        steps = max(1, -(-plan.decode_steps // rounds))
        configs: list[tuple[int, int]] = []
        for ctx in plan.decode_contexts:
            prefix_len = max(block, ctx // block * block)
            for b in plan.decode_batches:
                tokens = b * (prefix_len + SUFFIX_TOKENS + steps + 1)
                why = None
                if prefix_len + SUFFIX_TOKENS + steps + 2 > max_len:
                    why = f"context {prefix_len} does not fit max_model_len {max_len}"
                elif -(-tokens // block) + prefix_len // block > kv.total_blocks:
                    why = f"{tokens} tokens do not fit {kv.total_blocks} KV blocks"
                elif self.max_num_seqs is not None and b > self.max_num_seqs:
                    why = f"batch {b} exceeds max_num_seqs {self.max_num_seqs}"
                if why:
                    m.skipped.append(f"decode batch {b} x context {ctx}: {why}")
                elif (prefix_len, b) not in configs:
                    configs.append((prefix_len, b))
        prefixes = {p: self._random_ids(p) for p, _ in configs}
        samples: dict[tuple[int, int], list[tuple[int, float]]] = {c: [] for c in configs}
        for r in range(rounds):
            for prefix_len, prefix in prefixes.items():
                # Prime the prefix cache: this request computes (and leaves cached) every full
                # block of the prefix, so the decode requests prefill only their own few tokens.
                # (Cheap after the first round: the blocks are still cached.)
                t = self.time_to_first_token(prefix + self._random_ids(1))
                self.log(f"[decode round {r + 1}/{rounds}] {prefix_len}-token prefix cached "
                         f"({t * 1e3:.0f} ms)")
                for p, b in configs:
                    if p != prefix_len:
                        continue
                    got = self.decode_steps(b, prefix, steps)
                    samples[(p, b)] += got
                    if got:
                        self.log(f"[decode round {r + 1}/{rounds}] batch {b:3d} x context "
                                 f"{p + SUFFIX_TOKENS:5d}: {len(got)} steps, fastest "
                                 f"{min(d for _, d in got) * 1e3:8.2f} ms")
        for (p, b), got in samples.items():
            if not got:
                m.skipped.append(f"decode batch {b} x context {p}: no clean decode step")
                continue
            context, best = min(got, key=lambda s: s[1])
            m.decode.append((b, context, best))
            m.decode_raw.append([d for _, d in got])
        m.wall_s = time.monotonic() - started
        return m


# A sample this much slower than the fit of the others is taken as interference (another
# process had the CPU); interference only ever adds time, so only slow samples are dropped.
OUTLIER_RATIO = 1.5


def fit_measurements(m: Measurements, *, name: str, source: str,
                     trim: bool = True) -> EngineProfile:
    """Fit the cost model; with `trim`, drop the worst slow outlier and refit, while any sample
    is OUTLIER_RATIO times slower than the fit, dropping at most a third of each kind.
    Dropped samples are listed in `m.outliers` and in the profile's source."""
    prefill, decode = list(m.prefill), list(m.decode)
    m.outliers = []

    def fit(pre, dec, note=""):
        return fit_profile(
            pre, dec, name=name, source=source + note, kv_block_size=m.kv_block_size,
            kv_total_blocks=m.kv_total_blocks, max_model_len=m.max_model_len,
            max_num_batched_tokens=m.max_num_batched_tokens, prefill_includes_first_decode=True)

    profile = fit(prefill, decode)
    budget_p, budget_d = len(prefill) // 3, len(decode) // 3
    while trim:
        ratios = [(t / profile.first_token_s(n), "prefill", (n, t)) for n, t in prefill
                  if budget_p > 0] + \
                 [(t / profile.decode_step_s(b, c), "decode", (b, c, t)) for b, c, t in decode
                  if budget_d > 0]
        ratios = [r for r in ratios if r[0] > OUTLIER_RATIO]
        if not ratios:
            break
        ratio, kind, sample = max(ratios)
        pre = [x for x in prefill if x != sample] if kind == "prefill" else prefill
        dec = [x for x in decode if x != sample] if kind == "decode" else decode
        try:
            candidate = fit(pre, dec)
        except EngineProfileError:
            break  # dropping it would leave the fit undetermined
        prefill, decode, profile = pre, dec, candidate
        if kind == "prefill":
            budget_p -= 1
            m.outliers.append(f"prefill {sample[0]} tokens {sample[1] * 1e3:.1f} ms "
                              f"(x{ratio:.1f} the fit)")
        else:
            budget_d -= 1
            m.outliers.append(f"decode batch {sample[0]} context {sample[1]} "
                              f"{sample[2] * 1e3:.1f} ms (x{ratio:.1f} the fit)")
    if m.outliers:
        profile = fit(prefill, decode, "\nDropped as interference (slower than "
                      f"{OUTLIER_RATIO}x the fit of the rest): " + "; ".join(m.outliers) + ".")
    return profile


def summary(m: Measurements, profile: EngineProfile) -> str:
    lines = ["prefill (time to first token, one request, uncached prompt)",
             f"  {'tokens':>7} {'measured ms':>12} {'fitted ms':>10} {'error':>7}  repeats (ms)"]
    for n, t in m.prefill:
        fit = profile.first_token_s(n)
        raw = ", ".join(f"{x * 1e3:.1f}" for x in m.prefill_raw.get(n, []))
        lines.append(f"  {n:7d} {t * 1e3:12.1f} {fit * 1e3:10.1f} {_err(t, fit):>7}  {raw}")
    lines += ["decode (one step, every request samples one token)",
              f"  {'batch':>7} {'context':>8} {'measured ms':>12} {'fitted ms':>10} {'error':>7}"
              "  median of steps (ms)"]
    for (b, ctx, t), raw in zip(m.decode, m.decode_raw or [[]] * len(m.decode)):
        fit = profile.decode_step_s(b, ctx)
        raw = sorted(raw)
        med = f"{raw[len(raw) // 2] * 1e3:.2f}" if raw else "-"
        lines.append(f"  {b:7d} {ctx:8d} {t * 1e3:12.2f} {fit * 1e3:10.2f} {_err(t, fit):>7}  {med}")
    lines += ["fitted profile",
              f"  prefill_s(n)          = {profile.prefill_fixed_s * 1e3:.3f} ms + "
              f"{profile.prefill_per_token_s * 1e3:.4f} ms * n",
              f"  decode_step_s(b, ctx) = {profile.decode_fixed_s * 1e3:.3f} ms + "
              f"{profile.decode_per_seq_s * 1e3:.4f} ms * b + "
              f"{profile.decode_per_ctx_token_s * 1e6:.4f} us * ctx",
              f"  KV cache: {profile.kv_total_blocks} blocks of {profile.kv_block_size} tokens; "
              f"max_model_len {profile.max_model_len}"]
    if m.outliers:
        lines.append("dropped from the fit as interference: " + "; ".join(m.outliers))
    if m.skipped:
        lines.append("skipped: " + "; ".join(m.skipped))
    return "\n".join(lines)


def _err(measured: float, fitted: float) -> str:
    if measured <= 0:
        return "-"
    return f"{(fitted - measured) / measured * 100:+.0f}%"


def write_profile(profile: EngineProfile, path: Path, header: Sequence[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"# {line}\n" if line else "#\n" for line in header) + profile.to_yaml()
    path.write_text(text, encoding="utf-8")
    # Fail here, not in a later bench, if the file does not load back to the same profile.
    if EngineProfile.from_yaml(path) != profile:
        raise RuntimeError(f"{path}: written profile does not load back identically")


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def cpu_pressure() -> str | None:
    """Linux PSI: share of the last 5 minutes in which runnable tasks waited for a CPU."""
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = dict(kv.split("=") for kv in first.split()[1:])
    return fields.get("avg300")


def vllm_version() -> str:
    """For the profile's source note only: "?" when vLLM cannot be imported."""
    try:
        import vllm
        return vllm.__version__
    except Exception:  # noqa: BLE001 - only for the description
        return "?"


def build_profiling_engine(model: str, dtype: str | None, max_model_len: int | None,
                           kv_cache_bytes: int | None = None) -> tuple[EngineAdapter, VllmEngineConfig]:
    """The real engine to profile (built by the engine factory, with EOS ignored), and the
    configuration it was built with; its KV cache is `kv_cache_bytes` (None: the default)."""
    kwargs: dict[str, Any] = {"model": model}
    if kv_cache_bytes:
        kwargs["kv_cache_memory_bytes"] = kv_cache_bytes
    if dtype:
        kwargs["dtype"] = dtype
    if max_model_len:
        kwargs["max_model_len"] = max_model_len
    # Plain requests (no sessions): a decode sample must not be cut by session chunk ends.
    config = VllmEngineConfig(ignore_eos=True, sessions=False, **kwargs)
    return build_engine(EngineSpec(kind="vllm", vllm=asdict(config))), config
