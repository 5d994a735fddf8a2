"""MC-SF: memory-constrained shortest-first batching under a KV-cache budget (seed 001).

The paper's abstract model, which everything below the adapter works in:

* one worker, KV budget `M` tokens, time in unit rounds (one batch per round);
* request i arrives at round `arrival`, has prompt size `s` and output length `o` (known on
  arrival - in a robot fleet the segment's `max_tokens` is such a bound);
* started at round p it is processed in rounds p, p+1, ..., p+o, holds `s + (t - p)` KV
  tokens in round t, and completes at round p + o, so its latency is p + o - arrival. Its memory
  is released only after its completion round, i.e. a slot it frees is usable from p + o + 1;
* the objective is total latency.

MC-SF keeps every running request and adds waiting ones in ascending output length for as long
as the batch, projected forward, never exceeds M. Projected usage only drops when a request
completes and grows linearly in between, so checking the completion rounds of the running
requests and the candidates is enough.

The small cases T1-T4 of docs/seeds-001-003.md (and test/unit/papers/test_seed_mcsf.py) pin these
conventions: a different off-by-one in the memory or completion rule changes their numbers.

This module holds the model's request, MC-SF's order (and ours), and its look-ahead admission.
The round-based reproduction runs them (`round_policies`, `round_sim`); `admission.McsfAdmission`
carries the look-ahead into the real scheduler, in KV blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable

import numpy as np


@dataclass(frozen=True)
class Request:
    """A prompt in the unit-round model. `weight` is only read by the utility variant
    (e.g. a TUF slope k or U0*k); MC-SF itself ignores it."""

    rid: Hashable
    arrival: int
    s: int
    o: int
    weight: float = 1.0

    def __post_init__(self) -> None:
        if int(self.arrival) != self.arrival or self.arrival < 0:
            raise ValueError(f"request {self.rid!r}: arrival must be an integer round >= 0")
        if int(self.s) != self.s or self.s < 1:
            raise ValueError(f"request {self.rid!r}: prompt size s must be an integer >= 1")
        if int(self.o) != self.o or self.o < 1:
            raise ValueError(f"request {self.rid!r}: output length o must be an integer >= 1")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"request {self.rid!r}: weight must be finite and > 0")


# ----------------------------------------------------------------------------- orders

def sf_key(r: Request) -> tuple:
    """MC-SF order: shortest predicted output first, then earliest arrival, then id."""
    return (r.o, r.arrival, r.rid)


def utility_key(r: Request) -> tuple:
    """Our extension (not in the paper): weighted shortest first, i.e. Smith's rule - largest
    weight per output token first. Smith's rule minimises weighted completion time on one
    machine; here `o` stands in for processing time and `weight` for the loss of utility per
    unit of delay (the TUF slope k, or U0*k when utilities differ in scale). With equal weights
    this is exactly sf_key's order."""
    return (-r.weight / r.o, r.arrival, r.rid)


def arrival_key(r: Request) -> tuple:
    """First come, first served (the vLLM-like baselines)."""
    return (r.arrival, r.rid)


# ----------------------------------------------------------------------------- look-ahead

def as_pairs(running) -> np.ndarray:
    """Per-request (tokens held, rounds or tokens left) pairs, given as a list of pairs or an
    (n, 2) array, as an int64 (n, 2) array (an empty batch gives shape (0, 2))."""
    arr = np.asarray(running, dtype=np.int64)
    return arr.reshape(-1, 2)


def lookahead_fits(mem_now: np.ndarray, left: np.ndarray, M: int) -> bool:
    """Does a batch stay within M for the rest of its life?

    mem_now[j]: tokens request j holds this round; left[j]: rounds until its completion round
    (0 = completes this round). At offset k it holds mem_now[j] + k while k <= left[j].
    Usage at a completion offset d is sum over {left >= d} of (mem_now + d); walking the
    requests by descending `left`, a running sum gives every such value at once (inside a tie
    group the partial sums are smaller than the group's full sum, so checking them is harmless).
    """
    n = mem_now.shape[0]
    if n == 0:
        return True
    order = np.argsort(-left, kind="stable")
    d = left[order]
    usage = np.cumsum(mem_now[order]) + d * np.arange(1, n + 1, dtype=np.int64)
    return bool(usage.max() <= M)


def mcsf_admit(running, waiting: Iterable[Request], M: int, now: int, *,
               key: Callable[[Request], tuple] = sf_key, presorted: bool = False) -> list[Request]:
    """Requests to start at round `now`, in admission order.

    running: (tokens held now, rounds left until completion) per running request, as pairs or
        an (n, 2) array. Running requests always continue; they are not part of the answer.
    waiting: requests not yet started; those with arrival > now are skipped.
    key: candidate order (sf_key is MC-SF; utility_key is our weighted variant).
    presorted: `waiting` is already in `key` order (the simulator keeps it so).

    Stops at the first candidate that fails the look-ahead, as the paper does: skipping it to
    try a longer one would hand memory to a longer job ahead of a shorter one.
    """
    pairs = as_pairs(running)
    mem = pairs[:, 0].tolist()
    left = pairs[:, 1].tolist()
    candidates = waiting if presorted else sorted(waiting, key=key)
    admitted: list[Request] = []
    for r in candidates:
        if r.arrival > now:
            continue
        mem.append(r.s)
        left.append(r.o)
        if not lookahead_fits(np.array(mem, np.int64), np.array(left, np.int64), M):
            break
        admitted.append(r)
    return admitted
