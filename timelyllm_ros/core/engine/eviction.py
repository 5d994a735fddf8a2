"""Which parked sessions to evict when their KV blocks or slots are needed (seed 004, LAMPS).

A suspended generation whose KV is preserved (a parked vLLM session, a preserved pause of the
simulated engine) holds blocks and a slot while its robot executes. When a more valuable
admission needs them, some parked generations are evicted to the prefix cache (abort now,
resubmit the token ids on resume: the discard path). Which ones is INFERCEPT's waste comparison
as LAMPS uses it, per parked generation i with context C_i (tokens):

    keep:  waste_preserve = T_i * C_i                 (memory held idle for the rest of the pause)
    evict: waste_discard  = t_fwd(C_i) * (C_i + C_other)
                                                       (its recompute on resume, which also holds
                                                        the memory of the C_other tokens batched
                                                        with it)

with T_i the time until it is expected to resume. Evicting i saves `waste_preserve - waste_discard`;
victims are taken by that saving per block freed, largest first, until the blocks (and slots)
needed are free. A generation about to resume (T_i small) is kept; one whose robot is far from
done, or whose context is cheap to recompute, goes first.

This is the core-level cost model (papers/lamps/waste.py holds the paper's full handling choice,
swap included); the engines use it for their own revocations and the scheduler can call
`choose_evictions` when an admission is refused for want of blocks or slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class ParkedGeneration:
    """One parked generation as the eviction choice sees it.

    key: the engine request id it is paused under.
    context_tokens: C_i, prompt + generated tokens whose KV it holds.
    blocks: KV blocks it holds (freed by its eviction).
    resume_in_s: expected seconds until it resumes (the robot's estimated finish minus now).
    """

    key: str
    context_tokens: int
    blocks: int
    resume_in_s: float


def recompute_seconds(profile, tokens: int) -> float:
    """t_fwd: seconds to compute `tokens` again, from the engine's cost model (its prefill), or
    ~10k tokens/s without one (only the order of the evictions matters then)."""
    if profile is not None:
        return float(profile.prefill_s(int(tokens)))
    return 1e-4 * tokens


def waste_keep(p: ParkedGeneration) -> float:
    return max(0.0, p.resume_in_s) * p.context_tokens


def waste_evict(p: ParkedGeneration, t_fwd: Callable[[int], float], other_tokens: int) -> float:
    return t_fwd(p.context_tokens) * (p.context_tokens + other_tokens)


def eviction_order(parked: Sequence[ParkedGeneration], t_fwd: Callable[[int], float],
                   other_tokens: int = 0) -> list[ParkedGeneration]:
    """All parked generations, cheapest to evict first (largest waste saved per block)."""
    def saving(p: ParkedGeneration) -> float:
        return (waste_keep(p) - waste_evict(p, t_fwd, other_tokens)) / max(1, p.blocks)
    return sorted(parked, key=lambda p: (-saving(p), -p.resume_in_s, p.key))


def choose_evictions(parked: Sequence[ParkedGeneration], *, blocks_needed: int,
                     slots_needed: int = 0, t_fwd: Callable[[int], float],
                     other_tokens: int = 0) -> list[str]:
    """Keys of the parked generations to evict so that `blocks_needed` more blocks and
    `slots_needed` more slots are free (fewest by the order above); [] if nothing is needed.
    All of them if even that is not enough (the caller then still cannot admit)."""
    if blocks_needed <= 0 and slots_needed <= 0:
        return []
    chosen: list[str] = []
    blocks = slots = 0
    for p in eviction_order(parked, t_fwd, other_tokens):
        if blocks >= blocks_needed and slots >= slots_needed:
            break
        chosen.append(p.key)
        blocks += p.blocks
        slots += 1
    return chosen


@dataclass
class EvictionStats:
    """Evictions an engine carried out and what they cost on resume."""

    evictions: int = 0
    evicted_tokens: int = 0        # context tokens whose KV left the engine's hold
    recomputed_tokens: int = 0     # tokens the evicted generations computed again on resume
    by_reason: dict[str, int] | None = None

    def note(self, context_tokens: int, reason: str) -> None:
        self.evictions += 1
        self.evicted_tokens += int(context_tokens)
        if self.by_reason is None:
            self.by_reason = {}
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1

    def as_dict(self) -> dict[str, object]:
        return {"evictions": self.evictions, "evicted_tokens": self.evicted_tokens,
                "recomputed_tokens": self.recomputed_tokens,
                "by_reason": dict(self.by_reason or {})}
