"""003 (hybrid offline-online): Algorithm 1's order and the Lagrangian prefill/decode gate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base import Policy, SchedulerContext
from ..queue_view import QueueView
from .common import engine_profile


def time_model_of(profile):
    """seeds.hybrid.TimeModel (ms) from an EngineProfile: the paper's stage model on our engine
    (its per-context decode term is left out, as the paper's model has none)."""
    from timelyllm_ros.core.seeds.hybrid import TimeModel
    return TimeModel(prefill_fixed_ms=profile.prefill_fixed_s * 1e3,
                     prefill_per_token_ms=profile.prefill_per_token_s * 1e3,
                     decode_fixed_ms=profile.decode_fixed_s * 1e3,
                     decode_per_seq_ms=profile.decode_per_seq_s * 1e3)


@dataclass
class HybridPolicy(Policy):
    """003's online part: Algorithm 1's order (N_p + estimated N_d, longest first; N_p = the
    generation's context, N_d = its bound) and, with `gate`, the Lagrangian prefill/decode gate
    in front of every admission pass (prefill = admitting; C_d charged per decode round at the
    paper's marginal per-sequence cost). The offline packing needs the whole request set in
    advance and has no counterpart for arrivals over time; slot stealing is what a shared queue
    with continuous batching does anyway."""

    name: str = "hybrid"
    dispatch: str = "segment"
    gate: bool = True
    profile: Any = None

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        return np.add(view.context_tokens, view.bound_tokens).astype(np.float64)

    def make_gate(self, ctx: SchedulerContext):
        if not self.gate:
            return None
        from timelyllm_ros.core.seeds.hybrid import PrefillDecodeGate
        self._gate = PrefillDecodeGate(time_model_of(engine_profile(ctx, self.profile)))
        return self._gate


def register(register, fixed) -> None:
    register("hybrid", fixed(HybridPolicy, name="hybrid", gate=True))
    register("hybrid-nogate", fixed(HybridPolicy, name="hybrid-nogate", gate=False))
