"""Engine step time learned online, with the engine's cost profile as the prior.

The cost model (core/engine/cost_model.py) prices one fused step as

    step_s = decode_fixed + per_seq * b + per_ctx_token * ctx + [p > 0] * prefill_fixed
             + prefill_per_token * p

for `b` sequences sampling a token, `ctx` context tokens over them and `p` prefill tokens. That
is linear in the features (1, b, ctx, [p > 0], p), so the coefficients are learned by Bayesian
linear regression on the engine's measured steps (`StepInfo`: duration, batch size, prefill
tokens, context tokens): each step adds to the regression's information (the recursive least
squares update in information form), and the coefficients are solved when next asked for:

- **prior**: the profile's coefficients (`EngineProfile`), with the weight of `prior_steps`
  measured steps: Zellner's g-prior, whose precision is `prior_steps / steps` times the
  steps' own information, so the estimate is the least-squares fit shrunk towards the profile
  by `prior_steps / (steps + prior_steps)` in every direction the steps have moved, whatever
  the features' units, and exactly the profile in a direction no step has moved (the prefill
  terms before the first prefill; the fixed cost of a prefill step apart from the decode's
  when every step prefills). A profile that describes this engine (the simulated engine's
  own, or the planner's `engine.profile`) gets `prior_steps`; without one the default profile
  is a stand-in worth a single step, so the first measured steps override it;
- **forgetting**: each update discounts the past by `forgetting = 1 - 1 / memory_steps`, so the
  estimate follows an engine whose step cost drifts (another tenant, thermal throttling, the
  grammar work that depends on which skill sets run) with an effective memory of
  `memory_steps` steps.

Features are scaled by the profile's operating range (a full KV cache of context, a full token
budget of prefill) for the conditioning of the solve only: the g-prior makes the estimate
independent of that scale. Coefficients are clamped at zero when predicting: no component of
a step can take negative time.
"""

from __future__ import annotations

import math

import numpy as np

from timelyllm_ros.core.engine.cost_model import EngineProfile

# Feature order: constant, sequences, context tokens, prefill indicator, prefill tokens.
FEATURES = ("decode_fixed_s", "decode_per_seq_s", "decode_per_ctx_token_s", "prefill_fixed_s",
            "prefill_per_token_s")


class StepTimeModel:
    """Step time as a function of (batch size, context tokens, prefill tokens) (module
    docstring). `profile`: the prior; `informed`: whether it describes this engine (strong
    prior) or is a stand-in (weak prior, one step's weight); `prior_steps` and `memory_steps`
    are the two knobs (docs/batch-control.md has their sweep)."""

    def __init__(self, profile: EngineProfile | None = None, *, informed: bool = True,
                 prior_steps: float = 50.0, memory_steps: float = 2000.0):
        if not (prior_steps > 0 and math.isfinite(prior_steps)):
            raise ValueError(f"prior_steps: must be a finite number > 0, got {prior_steps!r}")
        if not (memory_steps >= 1 and math.isfinite(memory_steps)):
            raise ValueError(f"memory_steps: must be a finite number >= 1, got {memory_steps!r}")
        if profile is None:
            profile, informed = EngineProfile(), False
        self.profile = profile
        self.forgetting = 1.0 - 1.0 / float(memory_steps)
        # Full-scale features: a step can hold at most max_num_batched_tokens tokens (each
        # decode takes one), and its context at most the KV cache.
        max_seqs = float(profile.max_num_batched_tokens)
        self._scale = np.array([1.0, max_seqs, float(profile.kv_capacity_tokens()), 1.0,
                                float(profile.max_num_batched_tokens)])
        self._prior_mean = np.array([getattr(profile, f) for f in FEATURES]) * self._scale
        self.prior_steps = float(prior_steps) if informed else 1.0
        # Information form, decayed by `forgetting`: sum of x x^T, of x * duration, and the
        # effective number of steps behind them.
        self._evidence = np.zeros((len(FEATURES), len(FEATURES)))
        self._evidence_rhs = np.zeros(len(FEATURES))
        self._evidence_steps = 0.0
        self._theta = self._prior_mean.copy()
        self.steps_seen = 0

    def features(self, batch_size: float, context_tokens: float,
                 prefill_tokens: float) -> np.ndarray:
        return np.array([1.0, batch_size, context_tokens, 1.0 if prefill_tokens > 0 else 0.0,
                         prefill_tokens]) / self._scale

    def observe(self, duration_s: float, batch_size: int, context_tokens: int,
                prefill_tokens: int) -> None:
        """One measured step. Idle steps (no sequence, no prefill) carry nothing."""
        if not (math.isfinite(duration_s) and duration_s >= 0):
            raise ValueError(f"duration_s: must be finite and >= 0, got {duration_s!r}")
        for name, value in (("batch_size", batch_size), ("context_tokens", context_tokens),
                            ("prefill_tokens", prefill_tokens)):
            if value < 0:
                raise ValueError(f"{name}: must be >= 0, got {value!r}")
        if batch_size == 0 and prefill_tokens == 0:
            return
        x = self.features(batch_size, context_tokens, prefill_tokens)
        lam = self.forgetting
        self._evidence *= lam
        self._evidence_rhs *= lam
        self._evidence_steps = self._evidence_steps * lam + 1.0
        self._evidence += np.outer(x, x)
        self._evidence_rhs += x * duration_s
        self.steps_seen += 1
        self._theta = None  # solved when next asked for

    def _solve(self) -> np.ndarray:
        if self._theta is not None:
            return self._theta
        # Zellner's g-prior, prior precision (prior_steps / steps) * sum x x^T: the posterior
        # mean is the least-squares fit shrunk towards the profile by prior_steps / (steps +
        # prior_steps) in every direction the steps have moved, and the profile itself in the
        # directions they have not (pinv: the least-squares correction is zero there).
        theta = self._prior_mean.copy()
        if self._evidence_steps > 0:
            shrink = self._evidence_steps / (self._evidence_steps + self.prior_steps)
            residual = self._evidence_rhs - self._evidence @ self._prior_mean
            theta += shrink * (_pseudo_inverse(self._evidence) @ residual)
        self._theta = theta
        return theta

    def coefficients(self) -> dict[str, float]:
        """The cost model's coefficients as now estimated (seconds, >= 0), by profile name."""
        theta = np.maximum(self._solve(), 0.0) / self._scale
        return {name: float(v) for name, v in zip(FEATURES, theta)}

    def coefficient_array(self) -> np.ndarray:
        """`coefficients()` in FEATURES order, unscaled, as one array (the decision's input)."""
        return np.maximum(self._solve(), 0.0) / self._scale

    def step_s(self, batch_size: float, context_tokens: float, prefill_tokens: float) -> float:
        """Predicted duration of one step."""
        return float(self.coefficient_array() @ (
            self.features(batch_size, context_tokens, prefill_tokens) * self._scale))


# Singular values below this share of the largest are treated as zero (directions no step has
# moved).
PINV_RCOND = 1e-8


def _pseudo_inverse(evidence: np.ndarray) -> np.ndarray:
    """`np.linalg.pinv(evidence, rcond=PINV_RCOND, hermitian=True)`, bit for bit: the same
    eigendecomposition and the same operations in the same order, without the general
    function's checks and wrappers (asked at every admission pass, where they were most of a
    5x5 solve's time; test_step_model.py compares the two)."""
    values, vectors = np.linalg.eigh(evidence)
    sign = np.sign(values)
    values = np.abs(values)
    order = np.argsort(values)[::-1]  # singular values descending, as an SVD gives them
    sign, values, vectors = sign[order], values[order], vectors[:, order]
    large = values > PINV_RCOND * values.max()
    inverse = np.divide(1, values, where=large, out=values)
    inverse[~large] = 0
    return np.matmul(vectors * sign, np.multiply(inverse[:, None], vectors.T))
