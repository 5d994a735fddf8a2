"""The offline level of seed 003: balance the per-slot workloads by minimum-makespan packing
(P||Cmax, LPT or an exact MILP), and the lower bounds T_LB = t_p* + t_d* the results are
measured against.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from timelyllm_ros.papers.hybrid.time_model import TimeModel


@dataclass
class Packing:
    """Assignment of items to slots.

    lower_bound is a proven bound on the optimal makespan: the optimum itself when `optimal`,
    else the best of max(sum/J, max) and the MILP's dual bound.
    """

    assignment: np.ndarray   # slot of each item
    loads: np.ndarray        # per-slot sum
    makespan: float
    optimal: bool
    lower_bound: float
    method: str              # "lpt", "milp", or "lpt+milp-bound" when the solver only helped the bound

    def slot_lists(self, order: Sequence[int] | None = None) -> list[list[int]]:
        """Item indices per slot, in `order` (default: item index)."""
        J = self.loads.shape[0]
        out: list[list[int]] = [[] for _ in range(J)]
        for i in (range(self.assignment.shape[0]) if order is None else order):
            out[int(self.assignment[i])].append(int(i))
        return out


def makespan_lower_bound(T: Sequence[float], J: int) -> float:
    """max(average load, largest item): no assignment onto J slots does better."""
    T = np.asarray(T, dtype=float)
    if T.size == 0:
        return 0.0
    return float(max(T.sum() / J, T.max()))


def _check(T, J) -> np.ndarray:
    T = np.asarray(T, dtype=float).ravel()
    if J < 1:
        raise ValueError("J must be >= 1")
    if (T < 0).any() or not np.isfinite(T).all():
        raise ValueError("item times must be finite and >= 0")
    return T


def lpt(T: Sequence[float], J: int) -> Packing:
    """Longest processing time first: each item, longest first, to the least-loaded slot
    (lowest index on ties). At most 4/3 - 1/(3J) times the optimum."""
    T = _check(T, J)
    assignment = np.zeros(T.size, np.int64)
    heap = [(0.0, j) for j in range(J)]
    for i in np.argsort(-T, kind="stable"):
        load, j = heapq.heappop(heap)
        assignment[i] = j
        heapq.heappush(heap, (load + T[i], j))
    loads = np.bincount(assignment, weights=T, minlength=J).astype(float)
    lb = makespan_lower_bound(T, J)
    ms = float(loads.max()) if T.size else 0.0
    return Packing(assignment, loads, ms, optimal=math.isclose(ms, lb, rel_tol=0, abs_tol=1e-9),
                   lower_bound=min(lb, ms) if T.size else 0.0, method="lpt")


def _milp(T: np.ndarray, J: int, time_limit_s: float, lb: float):
    n = T.size
    # Items sorted longest first; item k may only use slots 0..k. Any packing can be relabelled
    # to satisfy this (order slots by their first item), and it removes the J! mirror images that
    # otherwise make the search hopeless.
    order = np.argsort(-T, kind="stable")
    Ts = T[order]
    nx = n * J
    c = np.zeros(nx + 1)
    c[-1] = 1.0
    ub = np.ones(nx + 1)
    ub[-1] = np.inf
    for k in range(min(n, J)):
        ub[k * J + k + 1:(k + 1) * J] = 0.0
    lbv = np.zeros(nx + 1)
    lbv[-1] = lb
    integrality = np.ones(nx + 1)
    integrality[-1] = 0
    rows_assign = sparse.kron(sparse.eye(n), np.ones((1, J)))          # sum_j x_kj = 1
    rows_assign = sparse.hstack([rows_assign, sparse.csr_matrix((n, 1))])
    rows_load = sparse.kron(Ts[None, :], sparse.eye(J))                 # sum_k T_k x_kj - t <= 0
    rows_load = sparse.hstack([rows_load, -np.ones((J, 1))])
    A = sparse.vstack([rows_assign, rows_load]).tocsr()
    lo = np.concatenate([np.ones(n), np.full(J, -np.inf)])
    hi = np.concatenate([np.ones(n), np.zeros(J)])
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=integrality,
               bounds=Bounds(lbv, ub),
               options={"time_limit": float(time_limit_s), "mip_rel_gap": 0.0, "disp": False})
    assignment = None
    if res.x is not None:
        x = res.x[:nx].reshape(n, J)
        assignment = np.empty(n, np.int64)
        assignment[order] = np.argmax(x, axis=1)
    dual = getattr(res, "mip_dual_bound", None)
    return res.status == 0, assignment, (None if dual is None or not np.isfinite(dual) else float(dual))


def pack_min_makespan(T: Sequence[float], J: int, *, exact_max_vars: int = 4000,
                      time_limit_s: float = 5.0) -> Packing:
    """Minimum-makespan packing of item times T onto J slots.

    Exact through scipy's MILP (HiGHS) when n*J <= exact_max_vars; otherwise, or when the
    solver fails or runs out of time without beating it, the LPT packing. LPT is tried first and
    kept when it already meets the trivial lower bound.
    """
    T = _check(T, J)
    base = lpt(T, J)
    if base.optimal or T.size == 0 or T.size * J > exact_max_vars:
        return base
    try:
        proven, assignment, dual = _milp(T, J, time_limit_s, base.lower_bound)
    except Exception:  # the solver is an optimisation, never a requirement
        return base
    lb = base.lower_bound if dual is None else max(base.lower_bound, dual)
    if assignment is not None:
        loads = np.bincount(assignment, weights=T, minlength=J).astype(float)
        ms = float(loads.max())
        if ms <= base.makespan + 1e-9:
            if proven:
                lb = ms
            return Packing(assignment, loads, ms, optimal=proven, lower_bound=min(lb, ms),
                           method="milp")
    return Packing(base.assignment, base.loads, base.makespan, optimal=False,
                   lower_bound=min(lb, base.makespan), method="lpt+milp-bound")


def prefill_lower_bound(prompt_tokens: Sequence[int], prefill_cap_tokens: int,
                        tm: TimeModel = TimeModel()) -> float:
    """The paper's t_p* bound in ms: every prompt token goes through some prefill stage, and the
    largest stage level (cap tokens) has the lowest time per token, so at least
    floor(sum N_p / cap) full-cap stages' worth of time is spent prefilling."""
    total = int(np.sum(prompt_tokens))
    return tm.prefill_ms(prefill_cap_tokens) * (total // int(prefill_cap_tokens))


def hybrid_lower_bound(prompt_tokens: Sequence[int], decode_bound_ms: float,
                       prefill_cap_tokens: int, tm: TimeModel = TimeModel()) -> tuple[float, float, float]:
    """T_LB = t_p* + t_d* in ms, as (T_LB, t_p*, t_d*).

    decode_bound_ms must be a *lower* bound on the decode makespan - a proven optimum or the
    solver's dual bound (`Packing.lower_bound`), never an incumbent - or T_LB is no bound."""
    tp = prefill_lower_bound(prompt_tokens, prefill_cap_tokens, tm)
    return tp + float(decode_bound_ms), tp, float(decode_bound_ms)
