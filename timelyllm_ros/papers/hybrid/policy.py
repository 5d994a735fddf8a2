"""003 (hybrid offline-online): Algorithm 1's order and the Lagrangian prefill/decode gate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.policies.registry import PolicyDefinition
from timelyllm_ros.core.sched.interface import Policy, SchedulerContext
from timelyllm_ros.core.sched.queue_view import QueueView
from timelyllm_ros.papers.common import engine_profile
from timelyllm_ros.papers.hybrid.time_model import TimeModel


def time_model_of(profile: EngineProfile) -> TimeModel:
    """The paper's stage model (`TimeModel`, ms) fitted to our engine's cost model (its
    per-context decode term is left out, as the paper's model has none)."""
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
        from timelyllm_ros.papers.hybrid.gate import PrefillDecodeGate
        self._gate = PrefillDecodeGate(time_model_of(engine_profile(ctx, self.profile)))
        return self._gate


# The policies this paper adds, by name (entry points in setup.py, group timelyllm_ros.policies).
HYBRID = PolicyDefinition(HybridPolicy, name="hybrid", gate=True)
HYBRID_NOGATE = PolicyDefinition(HybridPolicy, name="hybrid-nogate", gate=False)
