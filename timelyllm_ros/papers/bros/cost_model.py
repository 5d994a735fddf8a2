"""BROS's own iteration cost model (the paper's, not the project's).

An iteration costs `a0*Ln + a1*sum(Ln_i*La_i) + b`, fitted separately for prefill and decode,
plus a linear host-to-device swap time; it costs `max(exec, swap)` because swaps run on a
separate stream. The paper fits it on its own hardware (`BrosCostModel.fit`).

How it maps to the core's cost-model interface, `core.engine.cost_model.EngineProfile`:
`BrosCostModel.from_engine_profile` is the adapter. Prefill: a0 = prefill_per_token_s,
b = prefill_fixed_s, a1 = 0 (the profile charges no attention to a prefill). Decode: with
Ln_i = 1 per sequence, a0 = decode_per_seq_s, a1 = decode_per_ctx_token_s, b = decode_fixed_s,
so a decode iteration costs exactly `EngineProfile.decode_step_s`. The swap term has no
counterpart in the profile; it comes from the KV bytes per token and the host link.

Interpretation choice: `Ln*La` is summed per request, i.e. it counts the elements of the
attention-score matrices of the batch. For a single request this is the paper's term; for a
batch it is what attention actually costs, and it makes the decode model coincide with the
profile's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
from scipy.optimize import nnls

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.papers.bros.requests import BrosRequest


@dataclass(frozen=True)
class PhaseCost:
    """`a0*Ln + a1*sum(Ln_i*La_i) + b` for one phase; b is paid once if the phase is present."""

    a0: float = 0.0
    a1: float = 0.0
    b: float = 0.0

    def __post_init__(self) -> None:
        for name in ("a0", "a1", "b"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"PhaseCost.{name} must be finite and >= 0, got {v!r}")

    def __call__(self, ln: float, lnla: float) -> float:
        return self.a0 * ln + self.a1 * lnla + self.b


@dataclass(frozen=True)
class BrosCostModel:
    prefill: PhaseCost = PhaseCost()
    decode: PhaseCost = PhaseCost()
    swap_fixed_s: float = 0.0
    swap_per_slot_s: float = 0.0

    def swap_s(self, slots: int) -> float:
        return self.swap_fixed_s + self.swap_per_slot_s * slots if slots > 0 else 0.0

    def iteration_s(self, batch: Iterable[BrosRequest]) -> float:
        acc = ModelCostAccumulator(self)
        for r in batch:
            acc.push(r)
        return acc.value()

    def __call__(self, batch: Iterable[BrosRequest]) -> float:
        return self.iteration_s(batch)

    def accumulator(self) -> "ModelCostAccumulator":
        """An empty running price (see `ModelCostAccumulator`)."""
        return ModelCostAccumulator(self)

    def alone_s(self, prefill: np.ndarray, new_tokens: np.ndarray, context_tokens: np.ndarray,
                host_slots: np.ndarray) -> np.ndarray:
        """The iteration time of each request priced alone, for a column of requests: exactly
        `ModelCostAccumulator.alone` per request (the same float operations in the same order,
        elementwise, so bit for bit). Token columns are integer arrays."""
        la = np.maximum(context_tokens, new_tokens)
        lnla = new_tokens * la
        pre, dec = self.prefill, self.decode
        prefill_s = pre.a0 * new_tokens + pre.a1 * lnla + pre.b
        decode_s = dec.a0 * new_tokens + dec.a1 * lnla + dec.b
        exec_s = 0.0 + np.where(prefill, prefill_s, decode_s)
        swap_s = np.where(host_slots > 0, self.swap_fixed_s + self.swap_per_slot_s * host_slots,
                          0.0)
        return np.maximum(exec_s, swap_s)

    @classmethod
    def from_engine_profile(cls, profile: EngineProfile, *, kv_bytes_per_token: int = 131072,
                            host_link_bytes_per_s: float = 25e9) -> "BrosCostModel":
        """The project's step model (the core's EngineProfile) in BROS form. The project charges
        no attention term to a prefill, so its a1 is 0; decode's per-context-token cost is exactly
        a1 with the per-request product (Ln_i = 1). Swap time assumes a PCIe-4-class link
        (~25 GB/s)."""
        return cls(
            prefill=PhaseCost(profile.prefill_per_token_s, 0.0, profile.prefill_fixed_s),
            decode=PhaseCost(profile.decode_per_seq_s, profile.decode_per_ctx_token_s,
                             profile.decode_fixed_s),
            swap_fixed_s=0.0,
            swap_per_slot_s=kv_bytes_per_token / host_link_bytes_per_s,
        )

    @staticmethod
    def fit_phase(samples: Iterable[tuple[float, float, float]]) -> tuple[PhaseCost, float]:
        """Nonnegative least squares on (Ln, sum Ln_i*La_i, seconds) samples -> (cost, rms s)."""
        rows = np.asarray(list(samples), dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != 3 or len(rows) < 3:
            raise ValueError("fit_phase needs at least 3 samples of (Ln, Ln*La, seconds)")
        design = np.column_stack([rows[:, 0], rows[:, 1], np.ones(len(rows))])
        # Columns span ~1 to ~1e7; unscaled NNLS loses the small ones.
        scale = np.linalg.norm(design, axis=0)
        scale[scale == 0] = 1.0
        coef, _ = nnls(design / scale, rows[:, 2])
        coef = coef / scale
        rms = float(np.sqrt(np.mean((rows[:, 2] - design @ coef) ** 2)))
        return PhaseCost(*map(float, coef)), rms

    @classmethod
    def fit(cls, prefill_samples, decode_samples, *, swap_per_slot_s: float = 0.0,
            swap_fixed_s: float = 0.0) -> "BrosCostModel":
        pre, _ = cls.fit_phase(prefill_samples)
        dec, _ = cls.fit_phase(decode_samples)
        return cls(pre, dec, swap_fixed_s, swap_per_slot_s)


class ModelCostAccumulator:
    """Running sums so the selector prices each candidate in O(1) instead of re-pricing the batch."""

    __slots__ = ("m", "p_n", "p_ln", "p_lnla", "d_n", "d_ln", "d_lnla", "host")

    def __init__(self, model: BrosCostModel):
        self.m = model
        self.p_n = self.p_ln = self.p_lnla = 0
        self.d_n = self.d_ln = self.d_lnla = 0
        self.host = 0

    def add(self, prefill: bool, new_tokens: int, context_tokens: int, host_slots: int,
            sign: int) -> None:
        """Push (sign 1) or pop (sign -1) a request given by its fields: the column selector
        (`column_selection`) has no `BrosRequest` to push."""
        la = max(context_tokens, new_tokens)
        if prefill:
            self.p_n += sign
            self.p_ln += sign * new_tokens
            self.p_lnla += sign * new_tokens * la
        else:
            self.d_n += sign
            self.d_ln += sign * new_tokens
            self.d_lnla += sign * new_tokens * la
        self.host += sign * host_slots

    def push(self, r: BrosRequest) -> None:
        self.add(r.prefill, r.new_tokens, r.context_tokens, r.host_slots, 1)

    def pop(self, r: BrosRequest) -> None:
        self.add(r.prefill, r.new_tokens, r.context_tokens, r.host_slots, -1)

    def alone(self, r: BrosRequest) -> float:
        """`value()` of a batch of `r` alone (what push, value, pop on an empty accumulator
        give, with the same arithmetic), without touching the running sums."""
        la = max(r.context_tokens, r.new_tokens)
        phase = self.m.prefill if r.prefill else self.m.decode
        return max(0.0 + phase(r.new_tokens, r.new_tokens * la), self.m.swap_s(r.host_slots))

    def value(self) -> float:
        ex = 0.0
        if self.p_n > 0:
            ex += self.m.prefill(self.p_ln, self.p_lnla)
        if self.d_n > 0:
            ex += self.m.decode(self.d_ln, self.d_lnla)
        return max(ex, self.m.swap_s(self.host))


class _CallableCost:
    """Adapter for a plain `cost(batch) -> seconds` (the stub costs of the reproduction cases)."""

    __slots__ = ("fn", "items")

    def __init__(self, fn: Callable[[Sequence[BrosRequest]], float]):
        self.fn = fn
        self.items: list[BrosRequest] = []

    def push(self, r: BrosRequest) -> None:
        self.items.append(r)

    def pop(self, r: BrosRequest) -> None:
        for i in range(len(self.items) - 1, -1, -1):
            if self.items[i] is r:
                del self.items[i]
                return
        raise KeyError(r.req_id)

    def alone(self, r: BrosRequest) -> float:
        return float(self.fn([r]))

    def value(self) -> float:
        return float(self.fn(self.items))


def cost_accumulator(cost: BrosCostModel | Callable[[Sequence[BrosRequest]], float]):
    """A running price of a growing batch (`push`, `pop`, `value`) for the selector to probe
    candidates with."""
    if isinstance(cost, BrosCostModel):
        return ModelCostAccumulator(cost)
    if callable(cost):
        return _CallableCost(cost)
    raise TypeError(f"cost must be a BrosCostModel or a callable, got {type(cost).__name__}")

