"""BROS's standalone reproduction: an iteration-level simulator of one engine serving Poisson RT
chat next to closed-loop BE batches (docs/seeds-002-004.md).

`simulate_hybrid` runs one policy - vLLM-like FCFS, the paper's BROS-RR, BROS, or BROS without
the bidirectional cache - on `reproduction_workload.HybridWorkload`; every iteration costs the
core EngineProfile's step time. `python -m timelyllm_ros.papers.bros` prints the comparison.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.papers.bros.bidirectional_kv import BidirectionalKV, KVFull
from timelyllm_ros.papers.bros.cost_model import BrosCostModel
from timelyllm_ros.papers.bros.reproduction_workload import (HybridWorkload, SimRequest,
                                                             rt_arrivals)
from timelyllm_ros.papers.bros.requests import (BE, RT, TIME_TOLERANCE_S, TPOT_SLO_S, TTFT_SLO_S,
                                                BrosRequest)
from timelyllm_ros.papers.bros.selection import BrosScheduler


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

    def __init__(self, policy: str, w: HybridWorkload, profile: EngineProfile, ttft_slo_s: float,
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

    def _holds(self, r: SimRequest) -> bool:
        if self.bikv is not None:
            return self.bikv.gpu_slots(r.rid) + self.bikv.host_slots(r.rid) > 0
        return r.resident > 0

    def _drop(self, r: SimRequest) -> None:
        """Free a request's KV; it will re-prefill prompt + generated tokens (recompute)."""
        if self.bikv is not None:
            self.bikv.release(r.rid)
        else:
            self.used -= self._nb(r.resident)
        if r.resident and not r.done:
            r.recomputes += 1
        r.resident = 0

    def _grow(self, r: SimRequest, n: int) -> None:
        self.used += self._nb(r.resident + n) - self._nb(r.resident)
        r.resident += n

    # -- batch planning --

    def _plan_fcfs(self, live: list[SimRequest]) -> list[tuple[SimRequest, int, bool]]:
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

    def _plan_bros(self, live: list[SimRequest]) -> tuple[list[tuple[SimRequest, int, bool]], int]:
        bikv = self.bikv
        t_avg = self.sched.t_avg_s
        by_id = {r.rid: r for r in live}

        def as_request(r: SimRequest) -> BrosRequest:
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

    def _evict_one(self, live: list[SimRequest]) -> bool:
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

    def _new_be_batch(self, t: float) -> list[SimRequest]:
        out = []
        for _ in range(self.w.be_batch):
            out.append(SimRequest(self.next_id, BE, t, int(self.rng.integers(512, 1025)),
                               int(self.rng.integers(32, 129))))
            self.next_id += 1
        return out

    def _record_token(self, r: SimRequest) -> None:
        t = self.now
        if math.isnan(r.first_s):
            r.first_s = t
        else:
            r.gaps += 1
            if t - r.last_s > self.tpot + TIME_TOLERANCE_S:
                r.late_gaps += 1
        r.last_s = t
        r.generated += 1
        if r.done:
            r.finish_s = t

    def run(self) -> HybridResult:
        rts = rt_arrivals(self.w)
        self.next_id = len(rts)
        pending = deque(rts)
        end_s = self.w.duration_s
        active_be = self._new_be_batch(0.0)
        all_be = list(active_be)
        live: list[SimRequest] = list(active_be)
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

        ttft_ok = [(not math.isnan(r.first_s))
                   and r.first_s - r.arrival <= self.ttft + TIME_TOLERANCE_S for r in rts]
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
                    profile: EngineProfile | None = None, ttft_slo_s: float = TTFT_SLO_S,
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
        profile = EngineProfile()
    return _HybridSim(policy, workload, profile, ttft_slo_s, tpot_slo_s, max_seqs,
                      max_batched_tokens).run()


class _PlainOracle:
    """SlotOracle over block-granular plain KV: no sharing, so RT and BE see the same free slots
    (plus what fits in each request's partly filled last block)."""

    def __init__(self, free_blocks: Callable[[], int], size: int, by_id: Mapping[int, SimRequest]):
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
