"""Latency cost model of an LLM engine step, and its least-squares calibration.

The simulated engine charges every continuous-batching iteration with this model, so scheduling
policies can be compared in virtual time on a profile measured once on the real hardware.

Model (all coefficients are seconds, nonnegative):

    prefill_s(n)          = prefill_fixed_s + prefill_per_token_s * n
    decode_step_s(b, ctx) = decode_fixed_s + decode_per_seq_s * b + decode_per_ctx_token_s * ctx

`n` counts prompt tokens that are not served from the prefix cache; `b` counts sequences that
sample a token in the step; `ctx` is the sum of their context lengths. A step that admits new
prompts pays both terms, as an engine with continuous batching does when it fuses the prefill of
new sequences with the decode of running ones. Attention over a cached prefix is not charged to
the prefill (at a few thousand tokens it is small next to the weight GEMMs).

A step also pays, for each sequence that samples under a grammar (structured outputs, on vLLM
sessions), `constrained_seq_s(its regex)`: the token bitmask, the matcher, the masked logits
and the session chunks that park at statement ends, none of which a plain request has
(measured apart from the step: constraint_cost.py). The cost depends on the grammar (a
drone's MiniSpec mask costs several times an arm's), so `constrained_grammar_s` lists
(substring of a grammar's regex, seconds) pairs, the first whose substring occurs in a
request's regex applies, and `constrained_per_seq_s` any other grammar. Zero unless a profile
measured it.

A request under a grammar is not schedulable until its grammar is ready: vLLM builds the
matcher on a thread pool, one request after another, and its scheduler passes over the request
meanwhile (constraint_cost.py, `measure_grammar_wait`). `grammar_init_s` is that wait per
request, counted from when the request was added or from when the previous request's grammar
was ready, whichever is later; the simulated engine admits the request no earlier (sim/
requests.py). Zero unless a profile measured it.

`max_num_batched_tokens` is the engine's token budget per step (vLLM's setting of that name):
decodes take one token each and prefills are chunked to fit what is left, so no step prefills
more than the budget. The default, 8192, is what vLLM uses for an offline engine on a GPU under
70 GiB (`EngineArgs.get_batch_defaults`) and what vLLM V0 used for an 8k-context model without
chunked prefill (`max(max_model_len, 2048)`): the budget of the engine this profile is
calibrated to.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import yaml
from scipy.optimize import nnls


class EngineProfileError(ValueError):
    """A profile that cannot be loaded or fitted; the message names the offending key or input."""


_DEFAULT_SOURCE = """\
Calibrated to TimelyLLM Table 1 (Llama3-8B fp16, one RTX 4090, vLLM): first token 328.45 ms for
a 2884-token prompt, then 21.93 / 21.56 / 21.77 ms per token at batch 1 (mean 21.75 ms).
first token = prefill_s(2884) + decode_step_s(1, 2884); decode_step_s(1, ~2885) = 21.75 ms.
Batch scaling (assumption, not in the paper): decode at small batch is memory-bound, dominated by
streaming ~16 GB of weights once per step, so it grows slowly with batch size. Per-sequence cost
0.25 ms (sampling, activations, per-sequence kernels). Per-context-token cost 0.16 us = 128 KiB
of fp16 KV per token (32 layers * 8 KV heads * 128 dims * K,V * 2 bytes) read at ~800 GB/s.
decode_fixed_s absorbs the rest of 21.75 ms.
Prefill: 2 ms fixed (launch, scheduling); per-token 0.10565 ms, consistent with 2 FLOP/param/token
on ~165 TFLOPS fp16 tensor cores at ~90% utilisation.
KV capacity (estimate): 0.9 * 24 GiB - 14.96 GiB weights - ~1.6 GiB activations = ~5 GiB of KV
= 40960 tokens = 2560 blocks of 16 tokens.
Refit with `fit_profile` on measurements from the target machine."""


@dataclass(frozen=True)
class EngineProfile:
    """Coefficients of the step cost model plus the KV-cache geometry of one model on one device."""

    name: str = "llama3-8b-rtx4090"
    prefill_fixed_s: float = 0.002
    prefill_per_token_s: float = 1.0565e-4
    decode_fixed_s: float = 0.02104
    decode_per_seq_s: float = 0.00025
    decode_per_ctx_token_s: float = 1.6e-7
    kv_block_size: int = 16
    kv_total_blocks: int = 2560
    max_model_len: int = 8192
    max_num_batched_tokens: int = 8192
    # Grammar and session work per constrained sequence per step (constraint_cost.py): for a
    # grammar whose regex contains a listed substring, its seconds; for any other, the default.
    constrained_per_seq_s: float = 0.0
    constrained_grammar_s: tuple[tuple[str, float], ...] = ()
    # Seconds from adding a request under a grammar until the engine may schedule it.
    grammar_init_s: float = 0.0
    source: str = _DEFAULT_SOURCE

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise EngineProfileError("name: must be a non-empty string")
        if not isinstance(self.source, str):
            raise EngineProfileError("source: must be a string")
        for key in _FLOAT_KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise EngineProfileError(f"{key}: must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise EngineProfileError(f"{key}: must be finite and >= 0, got {value!r}")
        for key in _INT_KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise EngineProfileError(f"{key}: must be an integer, got {value!r}")
            if value < 1:
                raise EngineProfileError(f"{key}: must be >= 1, got {value!r}")
        pairs = self.constrained_grammar_s
        if isinstance(pairs, Mapping):  # YAML writes the pairs as a mapping
            pairs = tuple(pairs.items())
        try:
            pairs = tuple((key, seconds) for key, seconds in pairs)
        except (TypeError, ValueError):
            raise EngineProfileError("constrained_grammar_s: must be (regex substring, seconds) "
                                     f"pairs, got {self.constrained_grammar_s!r}") from None
        for key, seconds in pairs:
            if not isinstance(key, str) or not key:
                raise EngineProfileError(f"constrained_grammar_s: {key!r}: a key must be a "
                                         "non-empty substring of a grammar's regex")
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                    or not math.isfinite(seconds) or seconds < 0:
                raise EngineProfileError(f"constrained_grammar_s: {key}: must be finite and "
                                         f">= 0, got {seconds!r}")
        object.__setattr__(self, "constrained_grammar_s", pairs)

    # ---- cost model ----

    def prefill_s(self, new_tokens: int) -> float:
        """Cost of prefilling `new_tokens` uncached prompt tokens; zero when there are none."""
        if new_tokens <= 0:
            return 0.0
        return self.prefill_fixed_s + self.prefill_per_token_s * new_tokens

    def decode_step_s(self, batch_size: int, context_tokens_total: int) -> float:
        """Cost of one decode iteration in which `batch_size` sequences each sample a token."""
        if batch_size <= 0:
            return 0.0
        return (
            self.decode_fixed_s
            + self.decode_per_seq_s * batch_size
            + self.decode_per_ctx_token_s * context_tokens_total
        )

    def step_s(self, prefill_tokens: int, batch_size: int, context_tokens_total: int) -> float:
        """Cost of one fused iteration: prefill of new prompts plus one token for the batch."""
        return self.prefill_s(prefill_tokens) + self.decode_step_s(batch_size, context_tokens_total)

    def constrained_seq_s(self, regex: str | None) -> float:
        """Grammar and session work in one step of one sequence sampling under `regex` (zero
        without one)."""
        if not regex:
            return 0.0
        for key, seconds in self.constrained_grammar_s:
            if key in regex:
                return seconds
        return self.constrained_per_seq_s

    @property
    def charges_constraints(self) -> bool:
        return bool(self.constrained_per_seq_s or any(s for _, s in self.constrained_grammar_s))

    def first_token_s(self, prompt_tokens: int) -> float:
        """Time to first token of a lone request with an uncached prompt."""
        return self.step_s(prompt_tokens, 1, prompt_tokens)

    def kv_capacity_tokens(self) -> int:
        return self.kv_block_size * self.kv_total_blocks

    # ---- persistence ----

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["constrained_grammar_s"] = dict(self.constrained_grammar_s)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, origin: str = "profile") -> "EngineProfile":
        """Build from a mapping; unknown keys or bad values raise EngineProfileError naming the key.

        Missing keys take the defaults, so a YAML file may override only what it measured.
        """
        if not isinstance(data, Mapping):
            raise EngineProfileError(
                f"{origin}: expected a mapping of profile keys, got {type(data).__name__}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise EngineProfileError(
                    f"{origin}: {key}: unknown key (known: {', '.join(sorted(known))})"
                )
        values = dict(data)
        for key in _INT_KEYS:
            # YAML writes 2560.0 when a float sneaks in; accept integral floats, reject others.
            if isinstance(values.get(key), float) and float(values[key]).is_integer():
                values[key] = int(values[key])
        try:
            return cls(**values)
        except EngineProfileError as exc:
            raise EngineProfileError(f"{origin}: {exc}") from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> "EngineProfile":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise EngineProfileError(f"{path}: cannot read: {exc}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise EngineProfileError(f"{path}: invalid YAML: {exc}") from None
        return cls.from_dict(data if data is not None else {}, origin=str(path))

    def to_yaml(self, path: str | Path | None = None) -> str:
        """Serialise (and write to `path` if given); floats are written exactly (repr)."""
        text = yaml.dump(self.to_dict(), Dumper=_BlockTextDumper, sort_keys=False,
                         allow_unicode=True, width=100)
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text


class _BlockTextDumper(yaml.SafeDumper):
    """Writes multi-line strings as `|` blocks so a saved `source` stays readable and editable."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockTextDumper.add_representer(str, _represent_str)

_FLOAT_KEYS = (
    "prefill_fixed_s",
    "prefill_per_token_s",
    "decode_fixed_s",
    "decode_per_seq_s",
    "decode_per_ctx_token_s",
    "constrained_per_seq_s",
    "grammar_init_s",
)
_INT_KEYS = ("kv_block_size", "kv_total_blocks", "max_model_len", "max_num_batched_tokens")


def _nnls_scaled(design: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, float]:
    """Nonnegative least squares with column scaling.

    Columns differ by orders of magnitude (a constant 1 next to context sums of 10^4), so the
    columns are normalised before solving to keep NNLS well conditioned.
    """
    scale = np.linalg.norm(design, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(design / scale, target)
    coef = coef / scale
    residual = target - design @ coef
    rms = float(np.sqrt(np.mean(residual**2))) if len(target) else 0.0
    return coef, rms


def _as_array(samples: Iterable[Sequence[float]], width: int, what: str) -> np.ndarray:
    rows = [tuple(s) for s in samples]
    for i, row in enumerate(rows):
        if len(row) != width:
            raise EngineProfileError(f"{what}[{i}]: expected {width} values, got {len(row)}")
    arr = np.asarray(rows, dtype=float).reshape(len(rows), width)
    if not np.all(np.isfinite(arr)):
        raise EngineProfileError(f"{what}: contains non-finite values")
    if np.any(arr < 0):
        raise EngineProfileError(f"{what}: contains negative values")
    return arr


def fit_profile(
    prefill_samples: Iterable[Sequence[float]],
    decode_samples: Iterable[Sequence[float]],
    *,
    name: str = "fitted",
    source: str = "",
    kv_block_size: int = 16,
    kv_total_blocks: int = 2560,
    max_model_len: int = 8192,
    max_num_batched_tokens: int = 8192,
    prefill_includes_first_decode: bool = False,
) -> EngineProfile:
    """Fit the cost model to measurements by nonnegative least squares.

    prefill_samples: (new_tokens, seconds) pairs. decode_samples: (batch_size,
    context_tokens_total, seconds) triples. If the prefill timings are times to first token (what
    a client sees), set `prefill_includes_first_decode` and the fitted decode step of a lone
    sequence is subtracted from each before the prefill fit.

    The decode fit needs samples that vary both batch size and context, otherwise those two
    coefficients are not identifiable and NNLS picks one of many equally good answers.
    """
    pre = _as_array(prefill_samples, 2, "prefill_samples")
    dec = _as_array(decode_samples, 3, "decode_samples")
    if len(pre) < 2 or len(np.unique(pre[:, 0])) < 2:
        raise EngineProfileError("prefill_samples: need at least 2 distinct token counts")
    if len(dec) < 3:
        raise EngineProfileError("decode_samples: need at least 3 samples")

    dec_design = np.column_stack([np.ones(len(dec)), dec[:, 0], dec[:, 1]])
    if np.linalg.matrix_rank(dec_design) < 3:
        raise EngineProfileError(
            "decode_samples: batch_size and context_tokens_total must vary independently"
        )
    (d_fixed, d_seq, d_ctx), dec_rms = _nnls_scaled(dec_design, dec[:, 2])

    pre_target = pre[:, 1].copy()
    if prefill_includes_first_decode:
        pre_target -= d_fixed + d_seq + d_ctx * pre[:, 0]
    pre_design = np.column_stack([np.ones(len(pre)), pre[:, 0]])
    (p_fixed, p_tok), pre_rms = _nnls_scaled(pre_design, pre_target)

    note = (
        f"fit_profile: {len(pre)} prefill samples (rms residual {pre_rms * 1e3:.3f} ms), "
        f"{len(dec)} decode samples (rms residual {dec_rms * 1e3:.3f} ms)"
    )
    return EngineProfile(
        name=name,
        prefill_fixed_s=float(p_fixed),
        prefill_per_token_s=float(p_tok),
        decode_fixed_s=float(d_fixed),
        decode_per_seq_s=float(d_seq),
        decode_per_ctx_token_s=float(d_ctx),
        kv_block_size=kv_block_size,
        kv_total_blocks=kv_total_blocks,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        source=f"{source}\n{note}" if source else note,
    )

