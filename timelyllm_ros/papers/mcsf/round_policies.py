"""The round-based reproduction's batching rules: MC-SF (and our weighted variant) and the
paper's vLLM-like alpha-protection baselines, behind the `RoundPolicy` interface `round_sim`
drives. The simulated engine variant (`mcsf.engine`) reuses `AlphaProtection`'s clearing draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from timelyllm_ros.papers.mcsf.unit_model import (Request, arrival_key, as_pairs, mcsf_admit,
                                                  sf_key, utility_key)


class RoundPolicy(Protocol):
    """What `simulate` needs from a batching rule.

    key: the order the simulator keeps the waiting list in (admit sees it sorted).
    admit: requests to start this round, given (tokens held, rounds left) of the running ones.
    on_overflow: called when the running batch needs more than M this round; returns a boolean
        mask over the running requests of those to send back to the queue (progress lost).
    """

    name: str
    key: Callable[[Request], tuple]

    def admit(self, now: int, running: np.ndarray, waiting: Sequence[Request],
              M: int) -> list[Request]: ...

    def on_overflow(self, running: np.ndarray, M: int, rng: np.random.Generator) -> np.ndarray: ...


@dataclass
class McsfPolicy:
    name: str = "mc-sf"
    key: Callable[[Request], tuple] = sf_key

    def admit(self, now, running, waiting, M):
        return mcsf_admit(running, waiting, M, now, key=self.key, presorted=True)

    def on_overflow(self, running, M, rng):
        # The look-ahead makes this unreachable when output lengths are exact; reaching it means
        # the check is wrong, which must not be papered over by clearing.
        raise RuntimeError(f"{self.name}: batch exceeded M={M}; the look-ahead admitted too much")


def UtilityMcsfPolicy(name: str = "mc-wsf") -> McsfPolicy:
    """MC-SF's look-ahead with the weighted order of `utility_key` (our extension)."""
    return McsfPolicy(name=name, key=utility_key)


@dataclass
class AlphaProtection:
    """vLLM-like baselines of the paper.

    Admission: arrival order while (tokens held by the batch) + s <= (1 - alpha) * M, stopping at
    the first prompt that does not fit. Running requests keep growing regardless, so the batch
    can outgrow M; then each running request is cleared back to the queue with probability
    `beta` (beta = 1: all of them, the "alpha-protection greedy" rule), losing its progress.
    If the survivors still do not fit, the round is lost and clearing is retried next round -
    with a small beta that takes several rounds, which is the slowness the paper observes.
    """

    alpha: float
    beta: float = 1.0
    name: str = ""
    key: Callable[[Request], tuple] = arrival_key

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha < 1.0:
            raise ValueError("alpha must be in [0, 1)")
        if not 0.0 < self.beta <= 1.0:
            raise ValueError("beta must be in (0, 1]")
        if not self.name:
            self.name = (f"alpha={self.alpha:g}" if self.beta == 1.0
                         else f"alpha={self.alpha:g},beta={self.beta:g}")

    def admit(self, now, running, waiting, M):
        budget = (1.0 - self.alpha) * M
        used = int(as_pairs(running)[:, 0].sum())
        out = []
        for r in waiting:
            if r.arrival > now:
                continue
            if used + r.s > budget:
                break
            used += r.s
            out.append(r)
        return out

    def on_overflow(self, running, M, rng):
        n = as_pairs(running).shape[0]
        if self.beta >= 1.0:
            return np.ones(n, dtype=bool)
        return rng.random(n) < self.beta


def alpha_greedy(alpha: float) -> AlphaProtection:
    return AlphaProtection(alpha=alpha, beta=1.0)


def alpha_beta_clearing(alpha: float, beta: float) -> AlphaProtection:
    return AlphaProtection(alpha=alpha, beta=beta)
