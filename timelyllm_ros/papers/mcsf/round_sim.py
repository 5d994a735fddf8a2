"""The round-based reproduction: `simulate` runs a batching rule round by round on the paper's
unit model, and `brute_force_optimum` gives the hindsight optimum of tiny instances (the T1-T4
cases of docs/seeds-001-003.md).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from timelyllm_ros.papers.mcsf.round_policies import RoundPolicy
from timelyllm_ros.papers.mcsf.unit_model import Request


@dataclass
class Result:
    """Outcome of `simulate`; per-request tuples follow the order of the input requests.

    starts: round of the (last) start, None if never started.
    completions: completion round, None if not completed within the horizon.
    total_latency: sum of completion - arrival over completed requests.
    all_done: every request completed.
    usage_per_round: KV tokens held by the batch processed in each round (0 in a lost round).
    demand_per_round: tokens the continuing requests needed at the start of each round, before
        any clearing; above M means an overflow happened.
    clears: requests sent back to the queue; stalled_rounds: rounds lost to overflow.
    n_starts: how often each request was started (> 1 only after clearing).
    admissions: (round, rids admitted in admission order), one entry per round with admissions.
    """

    starts: tuple
    completions: tuple
    total_latency: int
    all_done: bool
    usage_per_round: np.ndarray
    demand_per_round: np.ndarray
    clears: int
    stalled_rounds: int
    n_starts: tuple
    rounds: int
    admissions: list = field(default_factory=list)

    def latencies_for(self, requests: Sequence[Request]) -> np.ndarray:
        """Latency of each completed request, in input order (incomplete ones omitted)."""
        return np.array([c - r.arrival for r, c in zip(requests, self.completions) if c is not None],
                        dtype=np.int64)


class _WaitingView(Sequence):
    """Read-only, lazily mapped view of the simulator's sorted waiting list: MC-SF looks at a
    handful of heads per round, so materialising thousands of Requests each round would
    dominate the run time."""

    def __init__(self, entries: list, reqs: Sequence[Request]):
        self._entries = entries
        self._reqs = reqs

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._reqs[e[-1]] for e in self._entries[i]]
        return self._reqs[self._entries[i][-1]]

    def __iter__(self) -> Iterator[Request]:
        reqs = self._reqs
        for e in self._entries:
            yield reqs[e[-1]]


def default_horizon(requests: Sequence[Request]) -> int:
    """Rounds by which one-at-a-time service would have finished everything; rules that never
    clear finish by then, and rules that clear get four times as long before giving up."""
    if not requests:
        return 0
    return max(r.arrival for r in requests) + sum(r.o + 1 for r in requests) + 1


def simulate(requests: Sequence[Request], M: int, policy: RoundPolicy, *,
             max_rounds: int | None = None, seed: int = 0) -> Result:
    """Run `policy` round by round until every request completed or `max_rounds` elapsed.

    Each round t: arrivals join the queue; if the continuing requests need more than M, the
    policy clears some (and if that is not enough the round is lost); the policy admits new
    requests; the batch is processed, and requests in their completion round leave.
    `seed` drives the policy's random clearing.
    """
    reqs = list(requests)
    n = len(reqs)
    M = int(M)
    if M < 1:
        raise ValueError("M must be >= 1")
    pos_of = {}
    for i, r in enumerate(reqs):
        if r.rid in pos_of:
            raise ValueError(f"duplicate request id {r.rid!r}")
        pos_of[r.rid] = i
        if r.s + r.o > M:
            # It could never be scheduled (and MC-SF would wait for it forever).
            raise ValueError(f"request {r.rid!r} needs {r.s + r.o} > M={M} tokens at its peak")
    if max_rounds is None:
        max_rounds = 4 * default_horizon(reqs) + 16
    rng = np.random.default_rng(seed)
    key = policy.key

    arrival_order = sorted(range(n), key=lambda i: (reqs[i].arrival, i))
    starts: list = [None] * n
    completions: list = [None] * n
    n_starts = [0] * n
    waiting: list = []          # sorted entries (key..., tiebreak, position)
    run_pos = np.zeros(0, np.int64)
    run_mem = np.zeros(0, np.int64)
    run_left = np.zeros(0, np.int64)
    usage: list[int] = []
    demand: list[int] = []
    admissions: list = []
    clears = stalled = done = 0
    ptr = 0
    t = 0

    def enqueue(i: int) -> None:
        bisect.insort(waiting, (key(reqs[i]), i))

    while done < n and t < max_rounds:
        while ptr < n and reqs[arrival_order[ptr]].arrival <= t:
            enqueue(arrival_order[ptr])
            ptr += 1

        need = int(run_mem.sum())
        demand.append(need)
        if need > M:
            mask = np.asarray(policy.on_overflow(np.stack([run_mem, run_left], 1), M, rng), bool)
            for i in run_pos[mask].tolist():
                enqueue(i)
            clears += int(mask.sum())
            keep = ~mask
            run_pos, run_mem, run_left = run_pos[keep], run_mem[keep], run_left[keep]
            if int(run_mem.sum()) > M:
                stalled += 1
                usage.append(0)
                t += 1
                continue

        if waiting:
            view = _WaitingView(waiting, reqs)
            admitted = policy.admit(t, np.stack([run_mem, run_left], 1), view, M)
            if admitted:
                idx = [pos_of[r.rid] for r in admitted]
                k = len(idx)
                if [e[-1] for e in waiting[:k]] == idx:
                    del waiting[:k]
                else:
                    gone = set(idx)
                    waiting[:] = [e for e in waiting if e[-1] not in gone]
                for i in idx:
                    starts[i] = t
                    n_starts[i] += 1
                admissions.append((t, [reqs[i].rid for i in idx]))
                run_pos = np.concatenate([run_pos, np.array(idx, np.int64)])
                run_mem = np.concatenate([run_mem, np.array([reqs[i].s for i in idx], np.int64)])
                run_left = np.concatenate([run_left, np.array([reqs[i].o for i in idx], np.int64)])

        usage.append(int(run_mem.sum()))
        finishing = run_left == 0
        if finishing.any():
            for i in run_pos[finishing].tolist():
                completions[i] = t
            done += int(finishing.sum())
            keep = ~finishing
            run_pos, run_mem, run_left = run_pos[keep], run_mem[keep], run_left[keep]
        run_mem = run_mem + 1
        run_left = run_left - 1
        t += 1

    total = sum(c - r.arrival for r, c in zip(reqs, completions) if c is not None)
    return Result(starts=tuple(starts), completions=tuple(completions), total_latency=int(total),
                  all_done=done == n, usage_per_round=np.array(usage, np.int64),
                  demand_per_round=np.array(demand, np.int64), clears=clears,
                  stalled_rounds=stalled, n_starts=tuple(n_starts), rounds=t,
                  admissions=admissions)


def brute_force_optimum(requests: Sequence[Request], M: int, *,
                        horizon: int | None = None) -> tuple[int, tuple]:
    """Minimum total latency over all non-preemptive start schedules (tiny instances only).

    Depth-first over start rounds, in arrival order, with a per-round memory profile; a branch is
    cut once its latency so far plus the remaining requests' minimum latencies (their o) cannot
    beat the best found. Returns (total latency, starts in input order).
    """
    reqs = list(requests)
    n = len(reqs)
    if n == 0:
        return 0, ()
    H = default_horizon(reqs) if horizon is None else int(horizon)
    max_o = max(r.o for r in reqs)
    profile = np.zeros(H + max_o + 2, np.int64)
    order = sorted(range(n), key=lambda i: (reqs[i].arrival, i))
    rest_min = [0] * (n + 1)
    for k in range(n - 1, -1, -1):
        rest_min[k] = rest_min[k + 1] + reqs[order[k]].o
    best = [math.inf, None]
    chosen = [0] * n

    def dfs(k: int, cost: int) -> None:
        if k == n:
            if cost < best[0]:
                best[0] = cost
                best[1] = tuple(chosen)
            return
        i = order[k]
        r = reqs[i]
        ramp = r.s + np.arange(r.o + 1, dtype=np.int64)
        for p in range(r.arrival, H + 1):
            c = cost + (p - r.arrival) + r.o
            if c + rest_min[k + 1] >= best[0]:
                break  # later starts only cost more
            window = profile[p:p + r.o + 1]
            if (window + ramp).max() > M:
                continue
            window += ramp
            chosen[i] = p
            dfs(k + 1, c)
            window -= ramp

    dfs(0, 0)
    if best[1] is None:
        raise ValueError("no feasible schedule within the horizon")
    return int(best[0]), best[1]
