"""LAMPS's ranking: the memory-over-time score, and the queue that caches scores and prevents
starvation.

`memory_time_score` ranks by the area under the request's memory-over-time curve under its
predicted handling (formula rebuilt in the digest, [R]). `LampsQueue` keeps scores (refreshed
every k iterations) and a per-request starvation counter that promotes a request to the head for
good.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable

from timelyllm_ros.core.engine.base import DISCARD, PRESERVE, SWAP
from timelyllm_ros.papers.lamps.waste import LEAST_WASTE_TIE_ORDER, TimeFn, time_at


def memory_time_score(*, prompt_tokens: float, pre_tokens: float, post_tokens: float,
                      iter_s: float, handling: str | None = None, t_int: float = 0.0,
                      response_tokens: float = 0.0, t_fwd: TimeFn = 0.0, t_swap: TimeFn = 0.0,
                      m: float = 1.0) -> float:
    """Area under the request's memory-over-time curve (lower is served first).

    P prompt tokens, a pre-pause tokens, b post-pause tokens, R tokens returned by the pause,
    C = P + a. Generation holds P+k tokens for one iteration per token k; the pause adds
    Preserve: C held for T_INT; Discard: C+R held while recomputed; Swap: C during both copies.
    `handling=None` is a request without a pause (b and R are then ignored).
    """
    P, a, b, R = float(prompt_tokens), float(pre_tokens), float(post_tokens), float(response_tokens)
    if min(P, a, b, R, iter_s) < 0:
        raise ValueError("token counts and iter_s must be >= 0")
    c = P + a
    pre = a * P + a * (a + 1) / 2                    # sum_{k=1..a} (P + k)
    if handling is None:
        return m * iter_s * pre
    post = b * (c + R) + b * (b + 1) / 2             # sum_{k=1..b} (C + R + k)
    base = m * iter_s * (pre + post)
    if handling == PRESERVE:
        return base + m * c * t_int
    if handling == DISCARD:
        return base + m * (c + R) * time_at(t_fwd, c + R)
    if handling == SWAP:
        return base + 2.0 * m * c * time_at(t_swap, c)
    raise ValueError(f"handling must be one of {LEAST_WASTE_TIE_ORDER} or None,"
                     f" got {handling!r}")


# --------------------------------------------------------------------------------------------
# Queue with cached scores and starvation prevention
# --------------------------------------------------------------------------------------------

@dataclass
class _Entry:
    req_id: Hashable
    seq: int
    score: float = math.inf
    starve: int = 0
    promoted_at: int = -1      # iteration of promotion; -1 = not promoted

    @property
    def promoted(self) -> bool:
        return self.promoted_at >= 0


class LampsQueue:
    """Waiting requests ranked by a cached score, with starvation promotion.

    `score_fn(req_id) -> float` is called when a request enters (it needs a rank at once) and
    for all waiting requests every `refresh_every` iterations; in between the cached value is
    used. A request left out of the batch `starvation_threshold` iterations in a row is promoted:
    it sorts ahead of every unpromoted request from then on (promoted ones among themselves by
    score) until it completes, so it is never preempted again. The counter resets when the
    request is scheduled or pauses.
    """

    def __init__(self, score_fn: Callable[[Hashable], float], *, refresh_every: int = 10,
                 starvation_threshold: int = 100):
        if refresh_every < 1:
            raise ValueError("refresh_every must be >= 1")
        if starvation_threshold < 1:
            raise ValueError("starvation_threshold must be >= 1")
        self.score_fn = score_fn
        self.refresh_every = int(refresh_every)
        self.threshold = int(starvation_threshold)
        self._waiting: dict[Hashable, _Entry] = {}
        self._paused: dict[Hashable, _Entry] = {}
        self._seq = 0
        self.iteration = 0
        self.score_calls = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, req_id: Hashable) -> bool:
        return req_id in self._waiting

    def _score(self, e: _Entry) -> None:
        e.score = float(self.score_fn(e.req_id))
        self.score_calls += 1

    def add(self, req_id: Hashable) -> None:
        if req_id in self._waiting or req_id in self._paused:
            raise KeyError(f"request {req_id!r} is already queued")
        e = _Entry(req_id, self._seq)
        self._seq += 1
        self._score(e)
        self._waiting[req_id] = e

    def pause(self, req_id: Hashable) -> None:
        """The request stopped for a pause: it leaves the queue, keeping any promotion."""
        e = self._waiting.pop(req_id)
        e.starve = 0
        self._paused[req_id] = e

    def resume(self, req_id: Hashable) -> None:
        """Back from its pause: re-scored (its next segment is a new job to rank)."""
        e = self._paused.pop(req_id)
        self._score(e)
        self._waiting[req_id] = e

    def finish(self, req_id: Hashable) -> None:
        self._waiting.pop(req_id, None)
        self._paused.pop(req_id, None)

    def is_promoted(self, req_id: Hashable) -> bool:
        e = self._waiting.get(req_id) or self._paused.get(req_id)
        return e is not None and e.promoted

    def starvation(self, req_id: Hashable) -> int:
        return self._waiting[req_id].starve

    def order(self) -> list[Hashable]:
        """Waiting requests, first to serve first (no refresh, no counting)."""
        es = sorted(self._waiting.values(),
                    key=lambda e: (not e.promoted, e.score, e.seq))
        return [e.req_id for e in es]

    def is_paused(self, req_id: Hashable) -> bool:
        return req_id in self._paused

    def begin_iteration(self) -> list[Hashable]:
        """Refresh the scores if due; return the order to walk this iteration."""
        if self.iteration % self.refresh_every == 0:
            for e in self._waiting.values():
                self._score(e)
        return self.order()

    def end_iteration(self, chosen: Iterable[Hashable]) -> None:
        """Count the iteration: scheduled requests reset, the others wait one more; a request
        reaching the threshold is promoted (effective from the next order)."""
        picked = set(chosen)
        for rid, e in self._waiting.items():
            if rid in picked:
                e.starve = 0
            else:
                e.starve += 1
                if not e.promoted and e.starve >= self.threshold:
                    e.promoted_at = self.iteration
                    e.starve = 0
        self.iteration += 1

    def step(self, capacity: int | None = None,
             fits: Callable[[Hashable, list[Hashable]], bool] | None = None) -> list[Hashable]:
        """One iteration: take requests in order while `capacity` (batch slots) lasts and
        `fits(req_id, chosen)` agrees. Returns the chosen requests in order."""
        chosen: list[Hashable] = []
        for rid in self.begin_iteration():
            if capacity is not None and len(chosen) >= capacity:
                continue
            if fits is None or fits(rid, chosen):
                chosen.append(rid)
        self.end_iteration(chosen)
        return chosen

