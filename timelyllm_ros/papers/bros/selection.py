"""BROS's per-iteration batch selection (the paper's Algorithm 1, with the digest's guards).

`select_batch` is the priority packing: RT requests by slack, then BE requests by how much of
their KV sits in host memory, replacing the least urgent RT requests when the batch is full.
`AdaptiveBatchSize` and `BrosScheduler` wrap it with the TCP-like batch limit and the
moving-average iteration time. `column_selection.select_columns` makes the same selection on
numpy request columns (what the admission pass uses, with hundreds of queued requests per
iteration); `select_batch` is the reference it is tested against.

Interpretation choices (the paper leaves them open; each is marked where it is coded): the
selection guards of the digest - a displaced RT request must still meet its own deadline one
iteration later; an empty RT list ends the replacement step; FindBlock is a dry run. Two more
that simulation showed necessary: RT requests already past saving do not set Tres (they are
served first, unchecked), and waiting BE prefills sort after resident BE requests.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable, Iterable, Protocol

from timelyllm_ros.papers.bros.cost_model import cost_accumulator
from timelyllm_ros.papers.bros.requests import BE, RT, TIME_TOLERANCE_S, BrosRequest

if TYPE_CHECKING:
    from timelyllm_ros.papers.bros.column_selection import ColumnSelection, RequestColumns


class SlotOracle(Protocol):
    """What FindPreemptBlock / FindBlock need to know, without allocating anything."""

    def rt_capacity(self, req_id: Hashable) -> int:
        """Slots an RT request could still claim: empty ones plus BE slots it may preempt."""

    def be_capacity(self, req_id: Hashable) -> int:
        """Empty slots a BE request could claim."""


@dataclass
class Selection:
    rt: list[BrosRequest]
    be: list[BrosRequest]
    rt_queue: list[BrosRequest]   # RT requests left waiting, most urgent first (displaced at head)
    be_queue: list[BrosRequest]   # BE requests left waiting, in BE order
    displaced: list[BrosRequest]  # RT requests the replacement step moved back
    tres_s: float                 # residual time of the most urgent RT request (inf if none)
    hit: bool                     # the RT loop stopped because the next RT broke Tres
    est_iter_s: float             # estimated iteration time of the chosen batch
    late_served: int = 0          # RT requests past saving (slack < own time) served first

    @property
    def batch(self) -> list[BrosRequest]:
        return self.rt + self.be


def select_batch(rt_requests: Iterable[BrosRequest], be_requests: Iterable[BrosRequest], *,
                 cost, t_avg_s: float, batch_limit: int,
                 blocks: SlotOracle | None = None,
                 token_budget: int | None = None) -> Selection:
    """One iteration of BROS's priority packing. Nothing is allocated: the caller commits the
    returned batch to its KV manager, so rejected candidates leave no trace (FindBlock as a dry
    run). `cost` is a BrosCostModel or any `cost(list_of_requests) -> seconds`.

    `token_budget` caps the tokens fed in one iteration (an engine's max_num_batched_tokens); a
    candidate that would exceed it stops its loop like a failed FindBlock. Without RT requests
    Tres is infinite and nothing else bounds a BE prefill wave.

    BE order: resident requests by checkpointed (host) slots ascending, then waiting prefills.
    The paper sorts by host slots only; a waiting prefill has none, but it needs its whole prompt
    in the KV, and with it at the head a full KV stalls every resident BE behind it (FindBlock
    fails at the head and the loop stops) - in simulation BE throughput fell to zero.
    """
    if batch_limit < 1:
        raise ValueError(f"batch_limit must be >= 1, got {batch_limit}")
    t_avg_s = float(t_avg_s)
    rts = list(rt_requests)
    bes = list(be_requests)
    for r in rts:
        if r.kind != RT:
            raise ValueError(f"request {r.req_id!r} is {r.kind!r}, passed as RT")
    for b in bes:
        if b.kind != BE:
            raise ValueError(f"request {b.req_id!r} is {b.kind!r}, passed as BE")

    slack = {id(r): r.slack(t_avg_s) for r in rts}
    # Stable sort: equal slack keeps the caller's (arrival) order.
    qrt = deque(sorted(rts, key=lambda r: slack[id(r)]))
    acc = cost_accumulator(cost)
    alone = {id(r): acc.alone(r) for r in rts}

    def is_late(r: BrosRequest) -> bool:
        return slack[id(r)] + TIME_TOLERANCE_S < alone[id(r)]

    # Guard (late requests): Tres is the min slack over RT requests that can still make their
    # deadline. With the paper's min over all of them, one request already past its deadline
    # makes every batch break Tres: the RT loop serves nothing, every iteration, and in
    # simulation the engine spiralled into one-request batches that made every RT late.
    feasible = [slack[id(r)] for r in rts if not is_late(r)]
    tres = min(feasible) if feasible else math.inf

    # Slots promised so far in this iteration, so that successive dry runs do not all count
    # the same free slots.
    claimed_rt = 0
    claimed_be = 0
    budget_left = math.inf if token_budget is None else int(token_budget)

    def fits_rt(r: BrosRequest) -> bool:
        return blocks is None or r.slots_needed <= blocks.rt_capacity(r.req_id) - claimed_rt

    def fits_be(b: BrosRequest) -> bool:
        # An RT claim may consume empty slots, so it is charged to the BE budget too (the dry
        # run may be pessimistic, never optimistic).
        return (blocks is None
                or b.slots_needed <= blocks.be_capacity(b.req_id) - claimed_rt - claimed_be)

    chosen_rt: list[BrosRequest] = []
    hit = False
    late_served = 0
    while qrt:
        r = qrt[0]
        if len(chosen_rt) >= batch_limit or not fits_rt(r) or r.new_tokens > budget_left:
            break
        acc.push(r)
        if is_late(r) and len(chosen_rt) == late_served:
            # Late requests at the head of Qrt are served without the Tres check: their next
            # token's deadline counts from this one, so serving them now is what restores them.
            late_served += 1
        elif acc.value() > tres + TIME_TOLERANCE_S:
            acc.pop(r)
            hit = True
            break
        chosen_rt.append(qrt.popleft())
        claimed_rt += r.slots_needed
        budget_left -= r.new_tokens
    if late_served and not feasible:
        # Only late RT work: BE requests may not make it later still.
        tres = acc.value()

    qbe = deque(sorted(bes, key=lambda b: (b.prefill, b.host_slots)))
    chosen_be: list[BrosRequest] = []
    displaced: list[BrosRequest] = []
    while qbe:
        b = qbe[0]
        if not fits_be(b) or b.new_tokens > budget_left:
            break
        n = len(chosen_rt) + len(chosen_be)
        acc.push(b)
        if n + 1 <= batch_limit and acc.value() <= tres + TIME_TOLERANCE_S:
            chosen_be.append(b)
        else:
            if not chosen_rt:  # guard: nothing left to displace
                acc.pop(b)
                break
            r = chosen_rt[-1]  # least urgent RT in the batch
            acc.pop(r)
            est = acc.value()
            if (n <= batch_limit and est <= tres + TIME_TOLERANCE_S
                    and can_defer(slack[id(r)], est, t_avg_s)):
                chosen_rt.pop()
                claimed_rt -= r.slots_needed
                budget_left += r.new_tokens
                qrt.appendleft(r)
                displaced.append(r)
                chosen_be.append(b)
            else:
                acc.pop(b)
                acc.push(r)
                break
        claimed_be += b.slots_needed
        budget_left -= b.new_tokens
        qbe.popleft()

    est = acc.value() if (chosen_rt or chosen_be) else 0.0
    return Selection(rt=chosen_rt, be=chosen_be, rt_queue=list(qrt), be_queue=list(qbe),
                     displaced=displaced, tres_s=tres, hit=hit, est_iter_s=est,
                     late_served=late_served)


def can_defer(slack_s: float, this_iter_s: float, t_avg_s: float) -> bool:
    """Whether an RT request of slack `slack_s` may be displaced from a batch estimated at
    `this_iter_s`: deferred, its token comes one (average) iteration after this one at the
    earliest."""
    return slack_s + TIME_TOLERANCE_S >= this_iter_s + t_avg_s


@dataclass
class AdaptiveBatchSize:
    """TCP-like batch limit: doubles after an iteration without a HIT, back to base on a HIT or
    when the chosen batch is estimated to overrun Tres. `max_size` caps the doubling (the paper
    has no cap; without one a long RT-free stretch overflows any integer type)."""

    base: int = 128
    max_size: int = 1 << 14
    current: int = 0

    def __post_init__(self) -> None:
        if self.base < 1 or self.max_size < self.base:
            raise ValueError(f"need 1 <= base <= max_size, got base={self.base}, max={self.max_size}")
        if self.current == 0:
            self.current = self.base

    def update(self, hit: bool, est_iter_s: float = 0.0, tres_s: float = math.inf) -> int:
        if hit or est_iter_s > tres_s + TIME_TOLERANCE_S:
            self.current = self.base
        else:
            self.current = min(self.current * 2, self.max_size)
        return self.current


class BrosScheduler:
    """Selection + adaptive batch size + moving-average iteration time, one call per iteration."""

    def __init__(self, cost, *, batch: AdaptiveBatchSize | None = None,
                 t_avg_init_s: float = 0.025, t_avg_alpha: float = 0.2,
                 token_budget: int | None = None):
        if not 0 < t_avg_alpha <= 1:
            raise ValueError("t_avg_alpha must be in (0, 1]")
        self.cost = cost
        self.batch = batch if batch is not None else AdaptiveBatchSize()
        self.t_avg_s = float(t_avg_init_s)
        self.alpha = float(t_avg_alpha)
        self.token_budget = token_budget
        self.iterations = 0
        self.hits = 0

    def select(self, rt_requests, be_requests, blocks: SlotOracle | None = None) -> Selection:
        sel = select_batch(rt_requests, be_requests, cost=self.cost, t_avg_s=self.t_avg_s,
                           batch_limit=self.batch.current, blocks=blocks,
                           token_budget=self.token_budget)
        self._account(sel.hit, sel.est_iter_s, sel.tres_s)
        return sel

    def select_columns(self, requests: "RequestColumns",
                       blocks: SlotOracle | None = None) -> "ColumnSelection":
        """`select` on request columns (`column_selection`): the same selection and the same
        accounting, without a `BrosRequest` per request. Needs a `BrosCostModel`."""
        # Imported here: column_selection builds on this module (Selection, can_defer).
        from timelyllm_ros.papers.bros.column_selection import select_columns
        sel = select_columns(requests, cost=self.cost, t_avg_s=self.t_avg_s,
                             batch_limit=self.batch.current, blocks=blocks,
                             token_budget=self.token_budget)
        self._account(sel.hit, sel.est_iter_s, sel.tres_s)
        return sel

    def _account(self, hit: bool, est_iter_s: float, tres_s: float) -> None:
        self.batch.update(hit, est_iter_s, tres_s)
        self.iterations += 1
        self.hits += int(hit)

    def observe(self, iteration_s: float) -> None:
        """Feed the measured duration of the iteration just run (T_avg is an EMA of these)."""
        if not (math.isfinite(iteration_s) and iteration_s >= 0):
            raise ValueError(f"iteration time must be finite and >= 0, got {iteration_s}")
        self.t_avg_s += self.alpha * (iteration_s - self.t_avg_s)
