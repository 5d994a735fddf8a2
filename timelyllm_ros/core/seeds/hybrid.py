"""Hybrid offline-online scheduling of a known batch of requests on J client slots (seed 003).

The setting is "PD competition": at any moment the engine runs either a prefill stage (all the
prompts it chose, at once) or one decode iteration (one token for every decoding slot), never
both. A slot holds one request from its prefill to its last token. Idle slot time - a slot with
nothing to do, or whose request cannot be served by the stage that is running - is the waste
the paper attacks at three levels:

* offline: balance the per-slot workloads (minimum-makespan packing, P||Cmax);
* online request scheduling (the paper's Algorithm 1): each slot serves its own list longest
  first and, once empty, steals the longest request of the slot with the most work left;
* online iteration scheduling: a Lagrangian gate choosing prefill vs another decode round.

Time model (fitted by the paper on LLaMA-65B, 8 NPUs): prefill 25 ms + 0.13 ms/token, decode
29 ms + 0.21 ms per decoding sequence.

`simulate_batch` is a stage-level simulator of a GSM8K-like batch under that model; see
docs/seeds-001-003.md for the numbers and `python -m timelyllm_ros.core.seeds.hybrid`.
"""

from __future__ import annotations

import argparse
import heapq
import math
from dataclasses import dataclass
from typing import Hashable, Literal, Sequence

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

__all__ = [
    "TimeModel", "Packing", "makespan_lower_bound", "lpt", "pack_min_makespan",
    "prefill_lower_bound", "hybrid_lower_bound", "Dispatch", "SlotDispatcher",
    "PrefillDecodeGate", "Workload", "gsm8k_like", "BatchReport", "simulate_batch",
]


# ----------------------------------------------------------------------------- time model

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


# ----------------------------------------------------------------------------- offline packing

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


# ----------------------------------------------------------------------------- online dispatch

@dataclass(frozen=True)
class Dispatch:
    rid: Hashable
    size: float
    donor: int | None   # slot it was stolen from, None when it came from the slot's own list


class SlotDispatcher:
    """The paper's Algorithm 1 (sorting and online preemptive dispatch).

    lists[j]: (rid, size) pairs assigned to slot j, size = N_p + estimated N_d. With `sort`, a
    slot serves its list longest first, so each list ends with short requests that even out the
    finishing times; with `steal`, a slot whose list is empty takes the head (longest request) of
    the slot with the most undispatched tokens, which is charged to that donor. Sizes count when
    dispatched, not when finished.
    """

    def __init__(self, lists: Sequence[Sequence[tuple[Hashable, float]]], *, sort: bool = True,
                 steal: bool = True):
        self._lists: list[list[tuple[Hashable, float]]] = []
        for lst in lists:
            items = [(rid, float(size)) for rid, size in lst]
            if sort:
                items.sort(key=lambda it: -it[1])   # stable: equal sizes keep their given order
            items.reverse()                         # pop() from the end is O(1)
            self._lists.append(items)
        self.steal = steal
        self.remaining = np.array([sum(sz for _, sz in lst) for lst in self._lists], dtype=float)

    def __len__(self) -> int:
        return sum(len(lst) for lst in self._lists)

    def queue(self, slot: int) -> list[tuple[Hashable, float]]:
        """Slot's undispatched requests, next first."""
        return list(reversed(self._lists[slot]))

    def next_for(self, slot: int) -> Dispatch | None:
        own = self._lists[slot]
        if own:
            rid, size = own.pop()
            self.remaining[slot] -= size
            return Dispatch(rid, size, None)
        if not self.steal or not len(self):
            return None
        donor = int(np.argmax(self.remaining))
        if not self._lists[donor]:
            # Only zero-size leftovers can make argmax pick an empty list; fall back to any.
            donor = next(j for j, lst in enumerate(self._lists) if lst)
        rid, size = self._lists[donor].pop()
        self.remaining[donor] -= size
        return Dispatch(rid, size, donor)


# ----------------------------------------------------------------------------- iteration gate

class PrefillDecodeGate:
    """Lagrangian choice between a prefill stage and one more decode round (paper §IV-C).

    C_p: the time of one prefill stage over all waiting prompts. C_d: decode time accumulated
    since the last prefill - the price already paid by waiting prompts. While C_p >= C_d, one more
    decode round is cheaper than stopping every decoding sequence for a prefill; once the waiting
    has cost more than the prefill would, prefill (and C_d restarts from zero).

    Call `decide` after every decode round (after `note_decode`), and `note_prefill` after a
    prefill stage. Times in ms. The paper charges only the per-sequence part of a round
    (`note_decode_round` does that); passing measured wall time to `note_decode` also charges
    the fixed 29 ms and makes the gate prefill sooner.
    """

    def __init__(self, tm: TimeModel = TimeModel()):
        self.tm = tm
        self.c_d = 0.0

    def prefill_cost(self, waiting_prompt_tokens: Sequence[float]) -> float:
        return self.tm.prefill_ms(float(sum(waiting_prompt_tokens)))

    def decide(self, waiting_prompt_tokens: Sequence[float], decoding: int) -> Literal["prefill", "decode"]:
        if len(waiting_prompt_tokens) == 0:
            return "decode"        # also with nothing decoding: the caller then simply idles
        if decoding <= 0:
            return "prefill"       # no decode round to weigh against; prefilling wastes nothing
        return "decode" if self.prefill_cost(waiting_prompt_tokens) >= self.c_d else "prefill"

    def note_decode(self, duration_ms: float) -> None:
        if not (math.isfinite(duration_ms) and duration_ms >= 0):
            raise ValueError("decode duration must be finite and >= 0")
        self.c_d += float(duration_ms)

    def note_decode_round(self, decoding: int) -> None:
        self.note_decode(self.tm.decode_marginal_ms(decoding))

    def note_prefill(self) -> None:
        self.c_d = 0.0


# ----------------------------------------------------------------------------- batch simulator

@dataclass(frozen=True)
class Workload:
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    predicted_output: np.ndarray

    def __len__(self) -> int:
        return int(self.prompt_tokens.shape[0])


# GSM8K on LLaMA-65B as reported by the paper: prompts 68.43 +- 25.04 tokens; outputs
# 344.83 +- 187.99 tokens with a 512-token cap.
GSM8K_PROMPT = (68.43, 25.04)
GSM8K_OUTPUT = (344.83, 187.99)
GSM8K_MAX_OUTPUT = 512


def gsm8k_like(n: int = 1319, seed: int = 0, prediction_sigma: float = 0.0) -> Workload:
    """A batch with GSM8K's reported moments.

    Prompts: normal(68.43, 25.04) rounded, at least 8 tokens. Outputs: the paper gives only mean
    and sd under a 512 cap; a Beta(a, b) on [0, 512] matched to both moments (a = 0.425,
    b = 0.206, U-shaped: many short answers and many runs into the cap, as a base model on
    GSM8K does) is our choice, rounded up to >= 1 token. Predicted outputs: exact, or times a
    lognormal(0, prediction_sigma) error, clipped to [1, 512].
    """
    rng = np.random.default_rng(seed)
    prompt = np.maximum(8, np.rint(rng.normal(*GSM8K_PROMPT, size=n))).astype(np.int64)
    m = GSM8K_OUTPUT[0] / GSM8K_MAX_OUTPUT
    v = (GSM8K_OUTPUT[1] / GSM8K_MAX_OUTPUT) ** 2
    k = m * (1 - m) / v - 1
    out = np.maximum(1, np.ceil(rng.beta(m * k, (1 - m) * k, size=n) * GSM8K_MAX_OUTPUT)).astype(np.int64)
    if prediction_sigma > 0:
        pred = np.clip(np.rint(out * rng.lognormal(0.0, prediction_sigma, size=n)), 1, GSM8K_MAX_OUTPUT)
    else:
        pred = out.astype(float)
    return Workload(prompt, out, pred.astype(np.int64))


@dataclass
class BatchReport:
    name: str
    total_s: float
    utilization: float
    tokens_per_s: float
    prefill_stages: int
    decode_rounds: int
    prefill_s: float
    decode_s: float


ListMode = Literal["shared", "round_robin", "packed"]


def simulate_batch(w: Workload, J: int = 200, *, lists: ListMode = "shared", online: bool = False,
                   gate: bool = False, gate_charge: Literal["marginal", "wall"] = "marginal",
                   tm: TimeModel = TimeModel(), name: str = "",
                   exact_max_vars: int = 4000) -> BatchReport:
    """Serve workload `w` on J slots under PD competition.

    lists: how requests reach slots -
        "shared": one FCFS queue that any idle slot takes from (vLLM's behaviour; this baseline
            reproduces the paper's 80.2% / 201 s closely, see the docs);
        "round_robin": static per-slot lists, request i to slot i mod J (J benchmark clients);
        "packed": static per-slot lists from the offline minimum-makespan packing of
            N_p + predicted N_d.
    online: Algorithm 1 - lists served longest first, and slots with an empty list steal
        (without it, static lists are served in dataset order and an empty slot idles; the shared
        queue is always taken from by any idle slot).
    gate: PrefillDecodeGate (otherwise prefill-first: prefill whenever a prompt waits).
    gate_charge: what a decode round adds to the gate's C_d - "marginal" (the paper's T^d per
        decoding sequence) or "wall" (the whole iteration, fixed 29 ms included).

    Utilization = sum over stages of (slots the stage serves x its duration) / (J x total time):
    a decoding slot is idle during a prefill stage, a slot with a waiting prompt is idle during a
    decode round, and an empty slot is idle throughout.
    """
    n = len(w)
    sizes = (w.prompt_tokens + w.predicted_output).astype(float)
    slot_lists: list[list[tuple[int, float]]] = [[] for _ in range(J)]
    if lists == "shared":
        # Parked on slot 0; every other slot "steals" from it, i.e. takes the queue's head.
        slot_lists[0] = [(i, float(sizes[i])) for i in range(n)]
        disp = SlotDispatcher(slot_lists, sort=online, steal=True)
    else:
        if lists == "packed":
            assignment = pack_min_makespan(sizes, J, exact_max_vars=exact_max_vars).assignment
        elif lists == "round_robin":
            assignment = np.arange(n) % J
        else:
            raise ValueError(f"unknown list mode {lists!r}")
        for i in range(n):
            slot_lists[int(assignment[i])].append((i, float(sizes[i])))
        disp = SlotDispatcher(slot_lists, sort=online, steal=online)
    g = PrefillDecodeGate(tm) if gate else None

    IDLE, WAIT, DECODE = 0, 1, 2
    phase = np.full(J, IDLE, np.int8)
    req = np.full(J, -1, np.int64)
    left = np.zeros(J, np.int64)
    free = list(range(J))
    t_ms = busy = prefill_ms = decode_ms = 0.0
    n_prefill = n_decode = 0
    while True:
        if free:
            still = []
            for j in sorted(free):
                d = disp.next_for(j)
                if d is None:
                    still.append(j)
                else:
                    phase[j] = WAIT
                    req[j] = d.rid
            free = still
        waiting = np.flatnonzero(phase == WAIT)
        decoding = np.flatnonzero(phase == DECODE)
        if waiting.size == 0 and decoding.size == 0:
            break
        if g is not None:
            action = g.decide(w.prompt_tokens[req[waiting]], int(decoding.size))
        else:
            action = "prefill" if waiting.size else "decode"
        if action == "prefill":
            dur = tm.prefill_ms(float(w.prompt_tokens[req[waiting]].sum()))
            busy += waiting.size * dur
            prefill_ms += dur
            n_prefill += 1
            phase[waiting] = DECODE
            left[waiting] = w.output_tokens[req[waiting]]
            if g is not None:
                g.note_prefill()
        else:
            dur = tm.decode_ms(int(decoding.size))
            busy += decoding.size * dur
            decode_ms += dur
            n_decode += 1
            left[decoding] -= 1
            finished = decoding[left[decoding] == 0]
            phase[finished] = IDLE
            req[finished] = -1
            free.extend(finished.tolist())
            if g is not None:
                if gate_charge == "wall":
                    g.note_decode(dur)
                else:
                    g.note_decode_round(int(decoding.size))
        t_ms += dur

    total_s = t_ms / 1000.0
    return BatchReport(
        name=name or _variant_name(lists, online, gate), total_s=total_s,
        utilization=busy / (J * t_ms) if t_ms > 0 else 0.0,
        tokens_per_s=float(w.output_tokens.sum()) / total_s if total_s > 0 else 0.0,
        prefill_stages=n_prefill, decode_rounds=n_decode,
        prefill_s=prefill_ms / 1000.0, decode_s=decode_ms / 1000.0)


def _variant_name(lists: str, online: bool, gate: bool) -> str:
    return "+".join([lists] + [p for p, on in (("online", online), ("gate", gate)) if on])


# The paper's four configurations as (lists, online request scheduling, gate). "online only"
# needs per-slot lists for Algorithm 1 and has no offline packing, so it starts from round robin.
PAPER_VARIANTS = (
    ("baseline", "shared", False, False),
    ("offline only", "packed", False, False),
    ("online only", "round_robin", True, True),
    ("hybrid", "packed", True, True),
)


def run_gsm8k(n: int = 1319, J: int = 200, seeds: Sequence[int] = (0,), prediction_sigma: float = 0.0,
              prefill_cap_tokens: int = 5000, tm: TimeModel = TimeModel(),
              gate_charge: Literal["marginal", "wall"] = "marginal") -> dict:
    """Every (lists, online, gate) combination per seed, plus T_LB per seed."""
    rows: dict[tuple[str, bool, bool], list[BatchReport]] = {}
    lbs = []
    for seed in seeds:
        w = gsm8k_like(n, seed=seed, prediction_sigma=prediction_sigma)
        for mode in ("shared", "round_robin", "packed"):
            for on in (False, True):
                for gt in (False, True):
                    rows.setdefault((mode, on, gt), []).append(
                        simulate_batch(w, J, lists=mode, online=on, gate=gt, tm=tm,
                                   gate_charge=gate_charge))
        # t_d*: every output token of a slot costs it one full-batch decode iteration, and
        # max(sum/J, max) is a proven bound on the best packing of those times.
        td = makespan_lower_bound(w.output_tokens * tm.decode_ms(J), J)
        lbs.append(hybrid_lower_bound(w.prompt_tokens, td, prefill_cap_tokens, tm))
    return {"rows": rows, "lower_bounds": lbs}


def _main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Seed 003 GSM8K-like batch simulation")
    ap.add_argument("--n", type=int, default=1319)
    ap.add_argument("--slots", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--prediction-sigma", type=float, default=0.0)
    ap.add_argument("--prefill-cap", type=int, default=5000)
    ap.add_argument("--gate-charge", choices=("marginal", "wall"), default="marginal")
    a = ap.parse_args(argv)
    res = run_gsm8k(a.n, a.slots, range(a.seeds), a.prediction_sigma, a.prefill_cap,
                    gate_charge=a.gate_charge)
    print(f"n={a.n} J={a.slots} seeds={a.seeds} prediction_sigma={a.prediction_sigma}"
          f" gate_charge={a.gate_charge}")
    print(f"{'lists':>11} {'online':>6} {'gate':>5} | {'util %':>7} {'total s':>8} {'tok/s':>7}"
          f" {'prefills':>8} {'prefill s':>9}")
    paper = {(m, on, gt): name for name, m, on, gt in PAPER_VARIANTS}
    for (mode, on, gt), reps in res["rows"].items():
        print(f"{mode:>11} {on!s:>6} {gt!s:>5} | {100 * np.mean([r.utilization for r in reps]):7.2f}"
              f" {np.mean([r.total_s for r in reps]):8.2f} {np.mean([r.tokens_per_s for r in reps]):7.1f}"
              f" {np.mean([r.prefill_stages for r in reps]):8.0f} {np.mean([r.prefill_s for r in reps]):9.2f}"
              f"  {paper.get((mode, on, gt), '')}")
    lb = np.mean([x[0] for x in res["lower_bounds"]]) / 1000
    tp = np.mean([x[1] for x in res["lower_bounds"]]) / 1000
    td = np.mean([x[2] for x in res["lower_bounds"]]) / 1000
    print(f"T_LB = {lb:.2f} s (t_p* = {tp:.2f} s, t_d* >= {td:.2f} s)")


if __name__ == "__main__":
    _main()
