"""The paper's own stage time model (seed 003), in milliseconds.

Under "PD competition" the engine runs either a prefill stage (all the prompts it chose, at
once) or one decode iteration (one token for every decoding slot), never both. The paper fitted
it on LLaMA-65B, 8 NPUs: prefill 25 ms + 0.13 ms/token, decode 29 ms + 0.21 ms per decoding
sequence - the defaults.

It is the paper's own model, not the core's cost-model interface. It maps onto
`core.engine.cost_model.EngineProfile` field by field, each x 1000 (seconds to milliseconds):
prefill_fixed_ms = prefill_fixed_s, prefill_per_token_ms = prefill_per_token_s,
decode_fixed_ms = decode_fixed_s, decode_per_seq_ms = decode_per_seq_s. The profile's
per-context-token decode term has no counterpart (the paper's model has none), and the profile
fuses prefill and decode in one step where this model runs them apart. The policy builds it that
way from the engine's profile (`hybrid.policy.time_model_of`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimeModel:
    """Stage durations in milliseconds."""

    prefill_fixed_ms: float = 25.0
    prefill_per_token_ms: float = 0.13
    decode_fixed_ms: float = 29.0
    decode_per_seq_ms: float = 0.21

    def prefill_ms(self, tokens: float) -> float:
        """One prefill stage over `tokens` prompt tokens (0 tokens: no stage, 0 ms)."""
        return 0.0 if tokens <= 0 else self.prefill_fixed_ms + self.prefill_per_token_ms * tokens

    def decode_ms(self, sequences: int) -> float:
        """One decode iteration producing a token for each of `sequences` sequences."""
        return 0.0 if sequences <= 0 else self.decode_fixed_ms + self.decode_per_seq_ms * sequences

    def decode_marginal_ms(self, sequences: int) -> float:
        """The per-sequence part of a decode iteration: what the gate charges to C_d, after the
        paper's derivative of the makespan w.r.t. decode work (T^d times tokens decoded)."""
        return self.decode_per_seq_ms * max(0, sequences)
