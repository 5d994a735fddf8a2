"""BROS: serving real-time (RT) and best-effort (BE) requests on one engine (seed 002).

Four pieces, each usable alone:

* `BrosCostModel` - iteration latency `a0*Ln + a1*Ln*La + b`, fitted separately for prefill and
  decode, plus a linear host-to-device swap time; an iteration costs `max(exec, swap)` because
  swaps run on a separate stream.
* `select_batch` - the per-iteration priority packing: RT requests by slack, then BE requests by
  how much of their KV sits in host memory, replacing the least urgent RT requests when the
  batch is full. `AdaptiveBatchSize` and `BrosScheduler` wrap it with the TCP-like batch limit
  and the moving-average iteration time.
* `BidirectionalKV` - a slot-exact model of the shared block layout (RT grows from the left of a
  block, BE from the right, only the BE slots actually overwritten are checkpointed to host).
* Robot mapping (`classify_robot_work`, `segment_request`) and a small iteration-level simulator
  (`simulate_hybrid`) used by docs/seeds-002-004.md.

Interpretation choices (the paper leaves them open; each is marked where it is coded):

* `Ln*La` is summed per request, i.e. it counts the elements of the attention-score matrices of
  the batch. For a single request this is the paper's term; for a batch it is what attention
  actually costs, and it makes the decode model coincide with the project's EngineProfile.
* The selection guards of the digest: a displaced RT request must still meet its own deadline one
  iteration later; an empty RT list ends the replacement step; FindBlock is a dry run. Two more
  that simulation showed necessary: RT requests already past saving do not set Tres (they are
  served first, unchecked), and waiting BE prefills sort after resident BE requests.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, Protocol, Sequence

import numpy as np
from scipy.optimize import nnls

RT = "rt"
BE = "be"
KINDS = (RT, BE)

# Default SLOs of the paper's evaluation (seconds).
TTFT_SLO_S = 0.4
TPOT_SLO_S = 0.2

BLOCK_SLOTS = 16

# Float slack: 0.2 - 0.12 is 0.08000000000000002, and the paper's comparisons are inclusive.
_EPS = 1e-9


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------

@dataclass
class BrosRequest:
    """One request's state as the selector sees it in one iteration.

    new_tokens: Ln_i, tokens fed in this iteration (the uncached prompt for a prefill, 1 for a
        decode).
    context_tokens: La_i, tokens attended over, new ones included (equals new_tokens for a
        prefill without cached prefix).
    t_since_token_s: t_i, time since its last token (since arrival before the first one).
    tokens_left: k_i, tokens left in its current token group (1 for per-token SLOs; for a robot,
        the tokens left in the segment).
    slo_s: T_SLO of the token being waited for (TTFT before the first token, TPOT after).
    host_slots: KV slots checkpointed in host memory; they must be swapped in before it runs.
    """

    req_id: Hashable
    kind: str = RT
    prefill: bool = False
    new_tokens: int = 1
    context_tokens: int = 1
    t_since_token_s: float = 0.0
    tokens_left: int = 1
    slo_s: float = math.inf
    host_slots: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"request {self.req_id!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.new_tokens < 0 or self.context_tokens < 0 or self.host_slots < 0:
            raise ValueError(f"request {self.req_id!r}: token counts must be >= 0")
        if self.tokens_left < 1:
            raise ValueError(f"request {self.req_id!r}: tokens_left must be >= 1")

    def slack(self, t_avg_s: float) -> float:
        """Time the token now due may still take, if the rest of its group then runs back to back."""
        return self.slo_s - self.t_since_token_s - (self.tokens_left - 1) * t_avg_s

    @property
    def slots_needed(self) -> int:
        """KV slots this iteration writes on the device: new tokens plus swapped-in ones."""
        return self.new_tokens + self.host_slots


# --------------------------------------------------------------------------------------------
# Cost model
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PhaseCost:
    """`a0*Ln + a1*sum(Ln_i*La_i) + b` for one phase; b is paid once if the phase is present."""

    a0: float = 0.0
    a1: float = 0.0
    b: float = 0.0

    def __post_init__(self) -> None:
        for name in ("a0", "a1", "b"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"PhaseCost.{name} must be finite and >= 0, got {v!r}")

    def __call__(self, ln: float, lnla: float) -> float:
        return self.a0 * ln + self.a1 * lnla + self.b


@dataclass(frozen=True)
class BrosCostModel:
    prefill: PhaseCost = PhaseCost()
    decode: PhaseCost = PhaseCost()
    swap_fixed_s: float = 0.0
    swap_per_slot_s: float = 0.0

    def swap_s(self, slots: int) -> float:
        return self.swap_fixed_s + self.swap_per_slot_s * slots if slots > 0 else 0.0

    def iteration_s(self, batch: Iterable[BrosRequest]) -> float:
        acc = _ModelCost(self)
        for r in batch:
            acc.push(r)
        return acc.value()

    def __call__(self, batch: Iterable[BrosRequest]) -> float:
        return self.iteration_s(batch)

    @classmethod
    def from_engine_profile(cls, profile: Any, *, kv_bytes_per_token: int = 131072,
                            host_link_bytes_per_s: float = 25e9) -> "BrosCostModel":
        """The project's step model in BROS form. The project charges no attention term to a
        prefill, so its a1 is 0; decode's per-context-token cost is exactly a1 with the per-request
        product (Ln_i = 1). Swap time assumes a PCIe-4-class link (~25 GB/s)."""
        return cls(
            prefill=PhaseCost(profile.prefill_per_token_s, 0.0, profile.prefill_fixed_s),
            decode=PhaseCost(profile.decode_per_seq_s, profile.decode_per_ctx_token_s,
                             profile.decode_fixed_s),
            swap_fixed_s=0.0,
            swap_per_slot_s=kv_bytes_per_token / host_link_bytes_per_s,
        )

    @staticmethod
    def fit_phase(samples: Iterable[tuple[float, float, float]]) -> tuple[PhaseCost, float]:
        """Nonnegative least squares on (Ln, sum Ln_i*La_i, seconds) samples -> (cost, rms s)."""
        rows = np.asarray(list(samples), dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != 3 or len(rows) < 3:
            raise ValueError("fit_phase needs at least 3 samples of (Ln, Ln*La, seconds)")
        design = np.column_stack([rows[:, 0], rows[:, 1], np.ones(len(rows))])
        # Columns span ~1 to ~1e7; unscaled NNLS loses the small ones.
        scale = np.linalg.norm(design, axis=0)
        scale[scale == 0] = 1.0
        coef, _ = nnls(design / scale, rows[:, 2])
        coef = coef / scale
        rms = float(np.sqrt(np.mean((rows[:, 2] - design @ coef) ** 2)))
        return PhaseCost(*map(float, coef)), rms

    @classmethod
    def fit(cls, prefill_samples, decode_samples, *, swap_per_slot_s: float = 0.0,
            swap_fixed_s: float = 0.0) -> "BrosCostModel":
        pre, _ = cls.fit_phase(prefill_samples)
        dec, _ = cls.fit_phase(decode_samples)
        return cls(pre, dec, swap_fixed_s, swap_per_slot_s)


class _ModelCost:
    """Running sums so the selector prices each candidate in O(1) instead of re-pricing the batch."""

    __slots__ = ("m", "p_n", "p_ln", "p_lnla", "d_n", "d_ln", "d_lnla", "host")

    def __init__(self, model: BrosCostModel):
        self.m = model
        self.p_n = self.p_ln = self.p_lnla = 0
        self.d_n = self.d_ln = self.d_lnla = 0
        self.host = 0

    def _add(self, r: BrosRequest, sign: int) -> None:
        la = max(r.context_tokens, r.new_tokens)
        if r.prefill:
            self.p_n += sign
            self.p_ln += sign * r.new_tokens
            self.p_lnla += sign * r.new_tokens * la
        else:
            self.d_n += sign
            self.d_ln += sign * r.new_tokens
            self.d_lnla += sign * r.new_tokens * la
        self.host += sign * r.host_slots

    def push(self, r: BrosRequest) -> None:
        self._add(r, 1)

    def pop(self, r: BrosRequest) -> None:
        self._add(r, -1)

    def value(self) -> float:
        ex = 0.0
        if self.p_n > 0:
            ex += self.m.prefill(self.p_ln, self.p_lnla)
        if self.d_n > 0:
            ex += self.m.decode(self.d_ln, self.d_lnla)
        return max(ex, self.m.swap_s(self.host))


class _CallableCost:
    """Adapter for a plain `cost(batch) -> seconds` (the stub costs of the reproduction cases)."""

    __slots__ = ("fn", "items")

    def __init__(self, fn: Callable[[Sequence[BrosRequest]], float]):
        self.fn = fn
        self.items: list[BrosRequest] = []

    def push(self, r: BrosRequest) -> None:
        self.items.append(r)

    def pop(self, r: BrosRequest) -> None:
        for i in range(len(self.items) - 1, -1, -1):
            if self.items[i] is r:
                del self.items[i]
                return
        raise KeyError(r.req_id)

    def value(self) -> float:
        return float(self.fn(self.items))


def _accumulator(cost):
    if isinstance(cost, BrosCostModel):
        return _ModelCost(cost)
    if callable(cost):
        return _CallableCost(cost)
    raise TypeError(f"cost must be a BrosCostModel or a callable, got {type(cost).__name__}")


# --------------------------------------------------------------------------------------------
# Selection (Algorithm 1 with the digest's guards)
# --------------------------------------------------------------------------------------------

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
    acc = _accumulator(cost)
    alone = {}
    for r in rts:
        acc.push(r)
        alone[id(r)] = acc.value()
        acc.pop(r)

    def is_late(r: BrosRequest) -> bool:
        return slack[id(r)] + _EPS < alone[id(r)]

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
        elif acc.value() > tres + _EPS:
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
        if n + 1 <= batch_limit and acc.value() <= tres + _EPS:
            chosen_be.append(b)
        else:
            if not chosen_rt:  # guard: nothing left to displace
                acc.pop(b)
                break
            r = chosen_rt[-1]  # least urgent RT in the batch
            acc.pop(r)
            est = acc.value()
            if n <= batch_limit and est <= tres + _EPS and _can_defer(r, slack[id(r)], est, t_avg_s):
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


def _can_defer(r: BrosRequest, slack_s: float, this_iter_s: float, t_avg_s: float) -> bool:
    # Deferred, r's token comes at the earliest one (average) iteration after this one.
    return slack_s + _EPS >= this_iter_s + t_avg_s


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
        if hit or est_iter_s > tres_s + _EPS:
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
        self.batch.update(sel.hit, sel.est_iter_s, sel.tres_s)
        self.iterations += 1
        self.hits += int(sel.hit)
        return sel

    def observe(self, iteration_s: float) -> None:
        """Feed the measured duration of the iteration just run (T_avg is an EMA of these)."""
        if not (math.isfinite(iteration_s) and iteration_s >= 0):
            raise ValueError(f"iteration time must be finite and >= 0, got {iteration_s}")
        self.t_avg_s += self.alpha * (iteration_s - self.t_avg_s)


# --------------------------------------------------------------------------------------------
# Bidirectional KV blocks
# --------------------------------------------------------------------------------------------

class KVFull(RuntimeError):
    """An append or swap-in that cannot be placed; the KV state is left unchanged."""


class BidirectionalKV:
    """Slot-exact model of BROS's shared blocks.

    In block j, RT slots are `[0, rt_fill[j])` and BE slots are `[size - be_fill[j], size)`; one
    RT and one BE request may share a block. Placement rules:

    * RT: empty slots of its own blocks (newest first), then the RT-free block with the most
      empty slots; only when no reachable slot is empty, overwrite BE slots (in its own blocks,
      newest first, else in a BE-only block) - the overwritten BE slots are checkpointed to
      host, one for one (lazy checkpoint). RT slots are never taken by anyone.
    * BE: empty slots of its own blocks (newest first), then the BE-free block with the most
      empty slots. BE never overwrites.
    * Swap-in: a BE request's checkpointed slots come back as BE slots wherever BE placement puts
      them, so first into the holes the overwrite left in its own blocks once the RT request
      has gone (a real block table maps each token's slot, so their position is free to
      change).

    A request's own blocks are all within its reach, not only its last one: the fronts of a
    block move as RT and BE requests come and go, and a hole left in an earlier block would
    otherwise be reachable by nobody but a newcomer of the other side. The capacity queries
    (`rt_capacity`, `be_capacity`, `reachable_empty_rt`) count exactly what placement can use,
    so an append within capacity never fails.

    `usable` marks the blocks placement may use (all by default). An engine that lends blocks of
    a larger paged pool to the shared region switches them on and off with `set_usable`; an
    unusable block holds nothing and counts for no capacity.
    """

    def __init__(self, num_blocks: int, block_size: int = BLOCK_SLOTS):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = int(num_blocks)
        self.size = int(block_size)
        self.rt_owner = np.full(self.num_blocks, -1, dtype=np.int64)
        self.be_owner = np.full(self.num_blocks, -1, dtype=np.int64)
        self.rt_fill = np.zeros(self.num_blocks, dtype=np.int64)
        self.be_fill = np.zeros(self.num_blocks, dtype=np.int64)
        self._ids: dict[Hashable, int] = {}
        self._next_key = 0
        self._names: dict[int, Hashable] = {}
        self._kind: dict[Hashable, str] = {}
        self._blocks: dict[Hashable, list[int]] = {}
        self._host: dict[Hashable, int] = {}
        self._preempted = np.zeros(self.num_blocks, dtype=bool)
        self.usable = np.ones(self.num_blocks, dtype=bool)
        # Counters (slots, cumulative).
        self.checkpointed_slots = 0   # device -> host copies forced by RT overwrites
        self.swapped_in_slots = 0     # host -> device copies when a BE request runs again
        self.preemption_events = 0    # times a block entered preemption status

    # -- bookkeeping --

    def _key(self, req_id: Hashable, kind: str) -> int:
        known = self._kind.get(req_id)
        if known is not None and known != kind:
            raise ValueError(f"request {req_id!r} is {known}, used as {kind}")
        if req_id not in self._ids:
            k = self._next_key  # never reused, so a stale key can never alias a new request
            self._next_key += 1
            self._ids[req_id] = k
            self._names[k] = req_id
            self._kind[req_id] = kind
            self._blocks[req_id] = []
            self._host[req_id] = 0
        return self._ids[req_id]

    def _empties(self) -> np.ndarray:
        return self.size - self.rt_fill - self.be_fill

    def _room_in_last(self, blocks: list[int]) -> int:
        # Appends that fit here need no capacity scan (the scan is O(blocks), this is O(1)).
        if not blocks:
            return 0
        j = blocks[-1]
        return self.size - int(self.rt_fill[j]) - int(self.be_fill[j])

    def _reachable_empty(self, req_id: Hashable, kind: str) -> int:
        """Empty slots a `kind` append by `req_id` can use without overwriting: those of blocks
        no request of that side owns, and those of its own blocks."""
        emp = self._empties()
        owner = self.rt_owner if kind == RT else self.be_owner
        reach = int(emp[(owner == -1) & self.usable].sum())
        if self._kind.get(req_id) == kind and self._blocks[req_id]:
            reach += int(emp[self._blocks[req_id]].sum())
        return reach

    def set_usable(self, j: int, usable: bool) -> None:
        if not usable and (self.rt_fill[j] or self.be_fill[j]):
            raise ValueError(f"block {j} still holds slots")
        self.usable[j] = usable

    # -- dry runs (SlotOracle) --

    def last_block_room(self, req_id: Hashable) -> int:
        """Empty slots of the request's last block: what it can append without any search."""
        return self._room_in_last(self._blocks.get(req_id, []))

    def rt_capacity(self, req_id: Hashable) -> int:
        """Slots an RT append can get, overwriting BE slots where it must: every slot of an
        RT-free block, plus whatever is not RT in its own blocks."""
        cap = int(np.count_nonzero((self.rt_owner == -1) & self.usable)) * self.size
        if self._kind.get(req_id) == RT:
            blocks = self._blocks[req_id]
            cap += len(blocks) * self.size - int(self.rt_fill[blocks].sum())
        return cap

    def be_capacity(self, req_id: Hashable) -> int:
        """Empty slots a BE append can get (BE never overwrites)."""
        return self._reachable_empty(req_id, BE)

    def reachable_empty_rt(self, req_id: Hashable) -> int:
        """Empty slots an RT append would use before it has to overwrite BE slots."""
        return self._reachable_empty(req_id, RT)

    # -- mutations --

    def append_rt(self, req_id: Hashable, n: int = 1) -> int:
        """Place n RT slots; returns how many BE slots were checkpointed to make room."""
        if n < 0:
            raise ValueError("n must be >= 0")
        key = self._key(req_id, RT)
        if n > self._room_in_last(self._blocks[req_id]) and n > self.rt_capacity(req_id):
            raise KVFull(f"RT {req_id!r}: {n} slots requested, {self.rt_capacity(req_id)} reachable")
        blocks = self._blocks[req_id]
        ckpt = 0
        while True:
            n = self._fill_empty(blocks, n, self.rt_fill, self.rt_owner, key)
            if n == 0:
                return ckpt
            # Every reachable slot is taken: now, and only now, overwrite BE slots.
            j = self._overwrite_target(req_id, key)
            take = min(n, int(self.be_fill[j]))
            self._checkpoint(j, take)
            self.rt_fill[j] += take
            n -= take
            ckpt += take

    def _overwrite_target(self, req_id: Hashable, key: int) -> int:
        """The block whose BE slots an RT append overwrites next: one the request already
        shares with a BE request (newest first: the fronts meet there first), else a claimed
        RT-free block. Every BE slot `rt_capacity` counts is reachable this way; _fill_empty may
        have claimed several part-BE blocks before any overwrite, so the last block alone is
        not enough."""
        blocks = self._blocks[req_id]
        for j in reversed(blocks):
            if self.be_fill[j] > 0:
                return j
        cand = np.flatnonzero((self.rt_owner == -1) & self.usable)
        if not cand.size:  # unreachable: capacity was checked by append_rt
            raise KVFull(f"RT {req_id!r}: no block left")
        j = int(cand[0])
        self.rt_owner[j] = key
        blocks.append(j)
        return j

    def _fill_empty(self, blocks: list[int], n: int, fill: np.ndarray, owner: np.ndarray,
                    key: int) -> int:
        """Place up to n slots in empty space only: the request's own blocks (newest first),
        then the emptiest block not yet owned on this side. Returns how many are left over."""
        if n > 0 and blocks:
            room = self._room_in_last(blocks)
            if room >= n:  # the common case: one more token in the block it is writing
                fill[blocks[-1]] += n
                return 0
            own = np.asarray(blocks)
            own_room = self._empties()[own]
            for i in np.flatnonzero(own_room)[::-1]:
                take = min(n, int(own_room[i]))
                fill[own[i]] += take
                n -= take
                if n == 0:
                    return 0
        while n > 0:
            emp = self._empties()
            cand = np.flatnonzero((owner == -1) & (emp > 0) & self.usable)
            if not cand.size:
                return n
            j = int(cand[np.argmax(emp[cand])])
            owner[j] = key
            blocks.append(j)
            take = min(n, int(emp[j]))
            fill[j] += take
            n -= take
        return 0

    def _checkpoint(self, j: int, take: int) -> None:
        victim = self._names[int(self.be_owner[j])]
        self.be_fill[j] -= take
        self._host[victim] += take
        self.checkpointed_slots += take
        if not self._preempted[j]:
            self._preempted[j] = True
            self.preemption_events += 1
        if self.be_fill[j] == 0:
            self.be_owner[j] = -1
            self._blocks[victim].remove(j)

    def append_be(self, req_id: Hashable, n: int = 1) -> None:
        if n < 0:
            raise ValueError("n must be >= 0")
        self._key(req_id, BE)
        if n > self._room_in_last(self._blocks[req_id]) and n > self.be_capacity(req_id):
            raise KVFull(f"BE {req_id!r}: {n} slots requested, {self.be_capacity(req_id)} free")
        self._place_be(req_id, n)

    def _place_be(self, req_id: Hashable, n: int) -> None:
        left = self._fill_empty(self._blocks[req_id], n, self.be_fill, self.be_owner,
                                self._ids[req_id])
        if left:  # unreachable: capacity was checked by the caller
            raise KVFull(f"BE {req_id!r}: no block left")

    def swap_in(self, req_id: Hashable) -> int:
        """Bring a BE request's checkpointed slots back; returns how many were copied."""
        if self._kind.get(req_id) != BE:
            return 0
        h = self._host[req_id]
        if h == 0:
            return 0
        if h > self.be_capacity(req_id):
            raise KVFull(f"BE {req_id!r}: {h} slots to swap in, {self.be_capacity(req_id)} free")
        self._place_be(req_id, h)
        self._host[req_id] = 0
        self.swapped_in_slots += h
        return h

    def rename(self, old_id: Hashable, new_id: Hashable) -> None:
        """Hand everything `old_id` holds (device slots, host checkpoint, side) to `new_id`, e.g.
        when a paused generation continues as a new request that keeps its KV."""
        if old_id not in self._kind:
            return
        if new_id in self._kind:
            raise ValueError(f"request {new_id!r} already holds slots")
        key = self._ids.pop(old_id)
        self._ids[new_id] = key
        self._names[key] = new_id
        self._kind[new_id] = self._kind.pop(old_id)
        self._blocks[new_id] = self._blocks.pop(old_id)
        self._host[new_id] = self._host.pop(old_id)

    def release(self, req_id: Hashable) -> None:
        """Free a finished (or dropped) request's device slots and its host checkpoint."""
        kind = self._kind.get(req_id)
        if kind is None:
            return
        for j in self._blocks[req_id]:
            if kind == RT:
                self.rt_owner[j] = -1
                self.rt_fill[j] = 0
            else:
                self.be_owner[j] = -1
                self.be_fill[j] = 0
            if self.rt_fill[j] == 0 or self.be_fill[j] == 0:
                self._preempted[j] = False
        del self._names[self._ids[req_id]]
        del self._ids[req_id]
        del self._kind[req_id]
        del self._blocks[req_id]
        del self._host[req_id]

    # -- views --

    def gpu_slots(self, req_id: Hashable) -> int:
        kind = self._kind.get(req_id)
        if kind is None:
            return 0
        fill = self.rt_fill if kind == RT else self.be_fill
        return int(sum(int(fill[j]) for j in self._blocks[req_id]))

    def host_slots(self, req_id: Hashable) -> int:
        return self._host.get(req_id, 0)

    def blocks_of(self, req_id: Hashable) -> list[int]:
        return list(self._blocks.get(req_id, ()))

    def kind_of(self, req_id: Hashable) -> str | None:
        return self._kind.get(req_id)

    def empty_slots(self) -> int:
        return int(self._empties()[self.usable].sum())

    def slot_owners(self) -> np.ndarray:
        """(num_blocks, size) array of owner keys (-1 empty); raises if RT and BE would overlap."""
        out = np.full((self.num_blocks, self.size), -1, dtype=np.int64)
        for j in range(self.num_blocks):
            r, b = int(self.rt_fill[j]), int(self.be_fill[j])
            if r + b > self.size:
                raise AssertionError(f"block {j}: RT {r} + BE {b} slots exceed {self.size}")
            out[j, :r] = self.rt_owner[j]
            if b:
                out[j, self.size - b:] = self.be_owner[j]
        return out

    def counters(self) -> dict[str, int]:
        return {"checkpointed_slots": self.checkpointed_slots,
                "swapped_in_slots": self.swapped_in_slots,
                "preemption_events": self.preemption_events,
                "host_slots_now": sum(self._host.values())}


# --------------------------------------------------------------------------------------------
# Robot mapping
# --------------------------------------------------------------------------------------------

ROBOT_KINDS = ("segment", "chat", "background")


def classify_robot_work(*, urgent: bool, kind: str = "segment", slack_s: float = 0.0,
                        be_slack_s: float = 5.0) -> str:
    """RT or BE for one piece of fleet work.

    Urgent segments are RT whatever their slack. Chat replies and background jobs (batch
    analytics, log summaries) are BE: nobody's robot waits on them. A normal segment is BE only
    while its slack exceeds `be_slack_s` - it will be re-classified RT as its slack shrinks, so
    it cannot starve past its deadline.
    """
    if kind not in ROBOT_KINDS:
        raise ValueError(f"kind must be one of {ROBOT_KINDS}, got {kind!r}")
    if urgent:
        return RT
    if kind != "segment":
        return BE
    return BE if slack_s > be_slack_s else RT


def segment_request(req_id: Hashable, *, now_s: float, reference_s: float, deadline_s: float,
                    tokens_left: int, prefill: bool, new_tokens: int, context_tokens: int,
                    kind: str = RT, host_slots: int = 0) -> BrosRequest:
    """A segment generation as a BROS request.

    The segment is one token group: k_i = tokens left in it and T_SLO = its deadline (e.g.
    reference + TUF ERT), both measured from `reference_s` (the previous segment's completion,
    or task arrival), so slack = deadline - now - (k_i - 1) * T_avg.
    """
    return BrosRequest(req_id, kind=kind, prefill=prefill, new_tokens=new_tokens,
                       context_tokens=context_tokens, t_since_token_s=now_s - reference_s,
                       tokens_left=max(1, int(tokens_left)), slo_s=deadline_s - reference_s,
                       host_slots=host_slots)


def split_queue(view: Any, now_s: float, tokens_left: Sequence[int] | np.ndarray, *,
                t_avg_s: float, be_slack_s: float = 5.0,
                kinds: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of a policies.QueueView that are RT and BE. Deadline = reference + ERT (the
    column semantics of QueueView); `kinds` marks chat/background rows (default: all segments)."""
    n = len(view)
    deadline = np.asarray(view.reference_s) + np.asarray(view.ert_s)
    slack = deadline - now_s - np.asarray(tokens_left, dtype=np.float64) * t_avg_s
    urgent = np.asarray(view.is_urgent, dtype=bool)
    if kinds is None:
        is_seg = np.ones(n, dtype=bool)
    else:
        ks = np.asarray(kinds)
        bad = set(ks.tolist()) - set(ROBOT_KINDS)
        if bad:
            raise ValueError(f"unknown kinds {sorted(bad)}")
        is_seg = ks == "segment"
    is_rt = urgent | (is_seg & (slack <= be_slack_s))
    return np.flatnonzero(is_rt), np.flatnonzero(~is_rt)


# --------------------------------------------------------------------------------------------
# Simulator: Poisson RT chat + closed-loop BE batches on one engine
# --------------------------------------------------------------------------------------------

@dataclass
class _SimReq:
    rid: int
    kind: str
    arrival: float
    prompt: int
    output: int
    generated: int = 0
    resident: int = 0            # KV tokens on the device (plain KV) / placed (bidirectional)
    first_s: float = math.nan
    last_s: float = math.nan
    finish_s: float = math.nan
    late_gaps: int = 0           # inter-token gaps above TPOT
    gaps: int = 0
    recomputes: int = 0

    @property
    def done(self) -> bool:
        return self.generated >= self.output

    def context(self) -> int:
        return self.prompt + self.generated


@dataclass(frozen=True)
class HybridWorkload:
    """RT: Poisson arrivals with ShareGPT-like lengths (lognormal matched to the paper's Table 2
    means/stds, clipped). BE: closed-loop batches, prompt U(512,1024), output U(32,128); the next
    batch is submitted when the previous one has completed."""

    rt_rate: float = 2.0
    duration_s: float = 60.0
    be_batch: int = 64
    rt_prompt_mean: float = 222.76
    rt_prompt_std: float = 256.36
    rt_output_mean: float = 234.51
    rt_output_std: float = 268.50
    max_len: int = 2048
    seed: int = 0


def _lognormal(rng, mean, std, size):
    s2 = math.log1p((std / mean) ** 2)
    return rng.lognormal(math.log(mean) - s2 / 2, math.sqrt(s2), size)


def _rt_arrivals(w: HybridWorkload) -> list[_SimReq]:
    rng = np.random.default_rng(w.seed)
    t = 0.0
    out = []
    while True:
        t += rng.exponential(1.0 / w.rt_rate)
        if t >= w.duration_s:
            break
        p = int(np.clip(_lognormal(rng, w.rt_prompt_mean, w.rt_prompt_std, 1)[0], 4, w.max_len))
        o = int(np.clip(_lognormal(rng, w.rt_output_mean, w.rt_output_std, 1)[0], 2, w.max_len))
        out.append(_SimReq(len(out), RT, t, p, o))
    return out


@dataclass
class HybridResult:
    policy: str
    rt_done: int
    rt_total: int
    ttft_attain: float
    tpot_attain: float
    norm_latency_s: float
    be_throughput_rps: float
    be_done: int
    iterations: int
    checkpointed_slots: int = 0
    swapped_in_slots: int = 0
    recomputes: int = 0

    def row(self) -> str:
        return (f"{self.policy:10s} TTFT-att {self.ttft_attain:6.1%}  TPOT-att {self.tpot_attain:6.1%}"
                f"  norm-lat {self.norm_latency_s * 1e3:7.1f} ms/tok  BE {self.be_throughput_rps:6.2f} req/s"
                f"  ckpt {self.checkpointed_slots:7d}  swap-in {self.swapped_in_slots:7d}"
                f"  recompute {self.recomputes:5d}")


HYBRID_POLICIES = ("fcfs", "rr", "bros", "bros-nobi")


class _HybridSim:
    """One engine, one virtual clock; see `simulate_hybrid`."""

    def __init__(self, policy: str, w: HybridWorkload, profile: Any, ttft_slo_s: float,
                 tpot_slo_s: float, max_seqs: int, max_batched_tokens: int):
        self.policy = policy
        self.w = w
        self.profile = profile
        self.ttft = ttft_slo_s
        self.tpot = tpot_slo_s
        self.max_seqs = max_seqs
        self.max_tokens = max_batched_tokens
        self.cost = BrosCostModel.from_engine_profile(profile)
        self.size = profile.kv_block_size
        self.nblocks = profile.kv_total_blocks
        self.bikv = BidirectionalKV(self.nblocks, self.size) if policy == "bros" else None
        self.sched = (BrosScheduler(self.cost, token_budget=max_batched_tokens)
                      if policy.startswith("bros") else None)
        self.used = 0                      # plain KV blocks in use
        self.rr_turn = RT
        self.rng = np.random.default_rng(w.seed + 1)
        self.next_id = 0
        self.now = 0.0
        self.iterations = 0
        self.be_done = 0

    # -- plain KV --

    def _nb(self, tokens: int) -> int:
        return -(-tokens // self.size)

    def _free(self) -> int:
        return self.nblocks - self.used

    def _holds(self, r: _SimReq) -> bool:
        if self.bikv is not None:
            return self.bikv.gpu_slots(r.rid) + self.bikv.host_slots(r.rid) > 0
        return r.resident > 0

    def _drop(self, r: _SimReq) -> None:
        """Free a request's KV; it will re-prefill prompt + generated tokens (recompute)."""
        if self.bikv is not None:
            self.bikv.release(r.rid)
        else:
            self.used -= self._nb(r.resident)
        if r.resident and not r.done:
            r.recomputes += 1
        r.resident = 0

    def _grow(self, r: _SimReq, n: int) -> None:
        self.used += self._nb(r.resident + n) - self._nb(r.resident)
        r.resident += n

    # -- batch planning --

    def _plan_fcfs(self, live: list[_SimReq]) -> list[tuple[_SimReq, int, bool]]:
        pool = live
        if self.policy == "rr" and len({r.kind for r in live}) == 2:
            pool = [r for r in live if r.kind == self.rr_turn]
            self.rr_turn = BE if self.rr_turn == RT else RT
        running = sorted((r for r in pool if r.resident > 0), key=lambda r: r.arrival)
        waiting = sorted((r for r in pool if r.resident == 0), key=lambda r: r.arrival)

        def need() -> int:
            return sum(self._nb(r.resident + 1) - self._nb(r.resident) for r in running)

        # Short of blocks for the decodes, preempt the latest arrival (vLLM's recompute rule).
        while running and need() > self._free():
            victim = max((r for r in live if r.resident > 0), key=lambda r: r.arrival)
            if victim in running:
                running.remove(victim)
            self._drop(victim)
        batch = [(r, 1, False) for r in running]
        budget = self.max_tokens
        free = self._free() - need()
        for r in waiting:
            feed = r.context()
            nb = self._nb(feed)
            if len(batch) >= self.max_seqs or feed > budget or nb > free:
                break  # FCFS head-of-line blocking, as in the baseline being modelled
            batch.append((r, feed, True))
            budget -= feed
            free -= nb
        for r, n, _ in batch:
            self._grow(r, n)
        return batch

    def _plan_bros(self, live: list[_SimReq]) -> tuple[list[tuple[_SimReq, int, bool]], int]:
        bikv = self.bikv
        t_avg = self.sched.t_avg_s
        by_id = {r.rid: r for r in live}

        def as_request(r: _SimReq) -> BrosRequest:
            host = bikv.host_slots(r.rid) if bikv is not None else 0
            pre = r.resident == 0 and host == 0
            feed = r.context() if pre else 1
            if r.kind == RT:
                first = math.isnan(r.first_s)
                since = self.now - (r.arrival if first else r.last_s)
                slo = self.ttft if first else self.tpot
            else:
                since, slo = 0.0, math.inf
            return BrosRequest(r.rid, kind=r.kind, prefill=pre, new_tokens=feed,
                               context_tokens=r.context(), t_since_token_s=since, slo_s=slo,
                               host_slots=host)

        oracle = bikv if bikv is not None else _PlainOracle(self._free, self.size, by_id)
        rts = [as_request(r) for r in live if r.kind == RT]
        if rts:
            # Even preemption cannot make room for the most urgent RT: drop BE work first
            # (the paper's fallback), the one with the most tokens still to go.
            head = min(rts, key=lambda q: q.slack(t_avg))
            while head.slots_needed > oracle.rt_capacity(head.req_id):
                victims = [r for r in live if r.kind == BE and self._holds(r)]
                if not victims:
                    break
                self._drop(max(victims, key=lambda r: r.output - r.generated))
        bes = [as_request(r) for r in live if r.kind == BE]
        sel = self.sched.select(rts, bes, blocks=oracle)
        batch = []
        swap = 0
        for q in sel.batch:
            r = by_id[q.req_id]
            if bikv is not None:
                try:
                    if r.kind == RT:
                        bikv.append_rt(r.rid, q.new_tokens)
                    else:
                        swap += bikv.swap_in(r.rid)
                        bikv.append_be(r.rid, q.new_tokens)
                except KVFull:
                    continue
                r.resident = bikv.gpu_slots(r.rid)
            else:
                if self._nb(r.resident + q.new_tokens) - self._nb(r.resident) > self._free():
                    continue
                self._grow(r, q.new_tokens)
            batch.append((r, q.new_tokens, q.prefill))
        return batch, swap

    def _evict_one(self, live: list[_SimReq]) -> bool:
        holders = [r for r in live if self._holds(r)]
        if not holders:
            return False
        be = [r for r in holders if r.kind == BE]
        if self.policy.startswith("bros") and be:
            victim = max(be, key=lambda r: r.output - r.generated)
        else:
            victim = max(holders, key=lambda r: r.arrival)
        self._drop(victim)
        return True

    # -- main loop --

    def _new_be_batch(self, t: float) -> list[_SimReq]:
        out = []
        for _ in range(self.w.be_batch):
            out.append(_SimReq(self.next_id, BE, t, int(self.rng.integers(512, 1025)),
                               int(self.rng.integers(32, 129))))
            self.next_id += 1
        return out

    def _record_token(self, r: _SimReq) -> None:
        t = self.now
        if math.isnan(r.first_s):
            r.first_s = t
        else:
            r.gaps += 1
            if t - r.last_s > self.tpot + _EPS:
                r.late_gaps += 1
        r.last_s = t
        r.generated += 1
        if r.done:
            r.finish_s = t

    def run(self) -> HybridResult:
        rts = _rt_arrivals(self.w)
        self.next_id = len(rts)
        pending = deque(rts)
        end_s = self.w.duration_s
        active_be = self._new_be_batch(0.0)
        all_be = list(active_be)
        live: list[_SimReq] = list(active_be)
        be_open = True
        while True:
            while pending and pending[0].arrival <= self.now:
                live.append(pending.popleft())
            if be_open and self.now >= end_s:
                # Stop the BE feed; the RT requests that arrived drain.
                be_open = False
                for r in live:
                    if r.kind == BE:
                        self._drop(r)
                live = [r for r in live if r.kind == RT]
            if not live:
                if not pending:
                    break
                self.now = pending[0].arrival
                continue
            if self.now > end_s + max(3 * end_s, 600.0):  # safety net; RT drains long before
                break
            if self.sched is None:
                batch, swap = self._plan_fcfs(live), 0
            else:
                batch, swap = self._plan_bros(live)
            if not batch:
                if self._evict_one(live):
                    continue
                if pending:
                    self.now = max(self.now, pending[0].arrival)
                    continue
                break
            pre = sum(n for _, n, is_pre in batch if is_pre)
            ctx = sum(r.context() for r, _, _ in batch)
            step = max(self.profile.step_s(pre, len(batch), ctx), self.cost.swap_s(swap))
            self.now += step
            self.iterations += 1
            if self.sched is not None:
                self.sched.observe(step)
            for r, _, _ in batch:
                self._record_token(r)
            for r in [r for r, _, _ in batch if r.done]:
                live.remove(r)
                self._drop(r)
                if r.kind == BE and r.finish_s <= end_s:
                    self.be_done += 1
            if be_open and all(r.done for r in active_be):
                active_be = self._new_be_batch(self.now)
                all_be.extend(active_be)
                live.extend(active_be)

        ttft_ok = [(not math.isnan(r.first_s)) and r.first_s - r.arrival <= self.ttft + _EPS
                   for r in rts]
        tpot = [1.0 - r.late_gaps / r.gaps if r.gaps else 1.0 for r in rts if r.done]
        tpot += [0.0] * sum(1 for r in rts if not r.done)
        norm = [(r.finish_s - r.arrival) / r.output for r in rts if r.done]
        return HybridResult(
            policy=self.policy, rt_done=sum(r.done for r in rts), rt_total=len(rts),
            ttft_attain=float(np.mean(ttft_ok)) if rts else 1.0,
            tpot_attain=float(np.mean(tpot)) if rts else 1.0,
            norm_latency_s=float(np.mean(norm)) if norm else math.nan,
            be_throughput_rps=self.be_done / end_s, be_done=self.be_done,
            iterations=self.iterations,
            checkpointed_slots=self.bikv.checkpointed_slots if self.bikv else 0,
            swapped_in_slots=self.bikv.swapped_in_slots if self.bikv else 0,
            recomputes=sum(r.recomputes for r in rts) + sum(r.recomputes for r in all_be))


def simulate_hybrid(policy: str, workload: HybridWorkload = HybridWorkload(), *,
                    profile: Any = None, ttft_slo_s: float = TTFT_SLO_S,
                    tpot_slo_s: float = TPOT_SLO_S, max_seqs: int = 256,
                    max_batched_tokens: int = 8192) -> HybridResult:
    """Iteration-level simulation of one engine; every iteration costs the profile's step time.

    fcfs: vLLM-like continuous batching by arrival, recompute-preemption of the latest arrival.
    rr: alternate RT-only and BE-only iterations while both have work (the paper's BROS-RR).
    bros: Algorithm 1 + adaptive batch + bidirectional KV with lazy checkpointing.
    bros-nobi: Algorithm 1 + adaptive batch on plain KV; an RT short of memory evicts BE work
        (recompute) - the paper's "No Bi-cache" ablation.
    """
    if policy not in HYBRID_POLICIES:
        raise ValueError(f"policy must be one of {HYBRID_POLICIES}")
    if profile is None:
        from timelyllm_ros.core.engine.cost_model import EngineProfile
        profile = EngineProfile()
    return _HybridSim(policy, workload, profile, ttft_slo_s, tpot_slo_s, max_seqs,
                      max_batched_tokens).run()


class _PlainOracle:
    """SlotOracle over block-granular plain KV: no sharing, so RT and BE see the same free slots
    (plus what fits in each request's partly filled last block)."""

    def __init__(self, free_blocks: Callable[[], int], size: int, by_id: Mapping[int, _SimReq]):
        self.free_blocks = free_blocks
        self.size = size
        self.by_id = by_id

    def _cap(self, req_id) -> int:
        r = self.by_id.get(req_id)
        tail = (-r.resident) % self.size if r is not None else 0
        return self.free_blocks() * self.size + tail

    def rt_capacity(self, req_id) -> int:
        return self._cap(req_id)

    def be_capacity(self, req_id) -> int:
        return self._cap(req_id)


def _main(argv: Sequence[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="BROS hybrid RT/BE simulation (docs/seeds-002-004.md)")
    ap.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--be-batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", nargs="+", default=list(HYBRID_POLICIES))
    args = ap.parse_args(argv)
    for rate in args.rates:
        w = HybridWorkload(rt_rate=rate, duration_s=args.duration, be_batch=args.be_batch,
                           seed=args.seed)
        print(f"RT rate {rate} req/s, BE batch {args.be_batch}, {args.duration:.0f} s")
        for p in args.policies:
            print("  " + simulate_hybrid(p, w).row())


if __name__ == "__main__":
    _main()
