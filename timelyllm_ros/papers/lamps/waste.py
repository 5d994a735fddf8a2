"""How LAMPS (via INFERCEPT) treats a paused request's KV cache: the waste of each handling.

A request that calls an API stops generating until the API answers; a robot executing a segment
is exactly that, with the execution-time model predicting the pause. `choose_handling` picks the
handling with least memory waste by INFERCEPT's equations (Preserve: keep it; Discard: drop and
recompute on resume; Swap: copy to host and back). `handling_for_pause` is the robot-facing
entry point, and `engine_time_fns` prices recompute and swap on the core's EngineProfile.

The handlings themselves are the core's (`core.engine.base`): one definition for the engines,
the scheduler and every policy.
"""

from __future__ import annotations

import math
from typing import Callable, Union

from timelyllm_ros.core.engine.base import DISCARD, PRESERVE, SWAP
from timelyllm_ros.core.engine.cost_model import EngineProfile

# The order `choose_handling` breaks ties in: on equal waste keep the KV where it is (no copy,
# no compute), then prefer a copy (bandwidth) over a recompute (it also delays every request
# batched with the resume). It differs from the core's PAUSE_HANDLINGS order on purpose.
LEAST_WASTE_TIE_ORDER = (PRESERVE, SWAP, DISCARD)

TimeFn = Union[Callable[[float], float], float]


def time_at(f: TimeFn, c: float) -> float:
    """A duration given as seconds or as a function of the context size, at context `c`."""
    return float(f(c)) if callable(f) else float(f)


def waste_preserve(t_int: float, c_i: float, m: float = 1.0) -> float:
    """Memory held idle while the pause lasts."""
    return t_int * c_i * m


def waste_discard(t_fwd_ci: float, c_i: float, c_other: float, m: float = 1.0) -> float:
    """Recomputing C_i tokens on resume: its own memory during the recompute, plus every other
    batched request's memory that waits for it."""
    return t_fwd_ci * c_i * m + t_fwd_ci * c_other * m


def waste_swap(t_swap_ci: float, c_batch: float, m: float = 1.0) -> float:
    """Copy out and back in, each stalling the whole batch's memory."""
    return 2.0 * t_swap_ci * c_batch * m


def handling_wastes(*, t_int: float, c_i: float, c_other: float, c_batch: float,
                    t_fwd: TimeFn, t_swap: TimeFn, m: float = 1.0) -> dict[str, float]:
    """Waste of each handling; `t_fwd`/`t_swap` are seconds or functions of C_i."""
    for name, v in (("t_int", t_int), ("c_i", c_i), ("c_other", c_other), ("c_batch", c_batch),
                    ("m", m)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
    fwd = time_at(t_fwd, c_i)
    swp = time_at(t_swap, c_i)
    return {PRESERVE: waste_preserve(t_int, c_i, m),
            SWAP: waste_swap(swp, c_batch, m),
            DISCARD: waste_discard(fwd, c_i, c_other, m)}


def choose_handling(*, t_int: float, c_i: float, c_other: float, c_batch: float,
                    t_fwd: TimeFn, t_swap: TimeFn, m: float = 1.0) -> str:
    """"preserve", "discard" or "swap", whichever wastes least (ties in LEAST_WASTE_TIE_ORDER)."""
    w = handling_wastes(t_int=t_int, c_i=c_i, c_other=c_other, c_batch=c_batch, t_fwd=t_fwd,
                        t_swap=t_swap, m=m)
    best = min(w.values())
    # Relative tolerance: the switch points are products of decimal inputs (0.1*100 vs
    # 2*0.005*1000) that float arithmetic does not make exactly equal.
    tol = 1e-9 * max(best, 1e-300)
    return next(h for h in LEAST_WASTE_TIE_ORDER if w[h] <= best + tol)


def preserve_limit_s(*, c_i: float, c_other: float, c_batch: float, t_fwd: TimeFn,
                     t_swap: TimeFn) -> float:
    """Longest pause for which Preserve still wins (its waste is linear in T_INT, the others
    do not depend on it)."""
    if c_i <= 0:
        return math.inf
    other = min(waste_swap(time_at(t_swap, c_i), c_batch),
                waste_discard(time_at(t_fwd, c_i), c_i, c_other))
    return other / c_i


def handling_for_pause(context_tokens: int, other_tokens: int, batch_tokens: int, pause_s: float,
                       t_fwd_fn: TimeFn, t_swap_fn: TimeFn, kv_bytes_per_token: float) -> str:
    """What to do with a suspended generation's KV while its robot executes the segment.

    pause_s: the execution-time model's estimate for the segment just dispatched (the scheduler
        resumes the generation when that time is up, so it is the pause the KV must survive).
    context_tokens: C_i, the generation's context (prompt + everything generated so far).
    other_tokens / batch_tokens: context of the other running generations / of the whole batch
        the resume will join (C_other, C_batch).
    t_fwd_fn(C): seconds to re-prefill C tokens; t_swap_fn(C): seconds to copy C tokens' KV one
        way. Either may be a constant.
    Returns "preserve" (keep the request alive with its blocks), "discard" (abort; resubmit with
    the token ids, re-prefilling them) or "swap" (offload to host, reload on resume).
    """
    return choose_handling(t_int=float(pause_s), c_i=float(context_tokens),
                           c_other=float(other_tokens), c_batch=float(batch_tokens),
                           t_fwd=t_fwd_fn, t_swap=t_swap_fn, m=float(kv_bytes_per_token))


def engine_time_fns(profile: EngineProfile, *, kv_bytes_per_token: int = 131072,
                    host_link_bytes_per_s: float = 25e9) -> tuple[Callable[[float], float],
                                                                  Callable[[float], float]]:
    """(t_fwd, t_swap) from the core's EngineProfile: an adapter, not a cost model of its own.
    A recompute is a cold prefill of C tokens (`EngineProfile.prefill_s`); a swap moves
    C * kv_bytes_per_token over the host link (default ~PCIe 4 x16), which the profile does not
    model."""
    def t_fwd(c: float) -> float:
        return profile.prefill_s(int(math.ceil(c)))

    def t_swap(c: float) -> float:
        return c * kv_bytes_per_token / host_link_bytes_per_s

    return t_fwd, t_swap

