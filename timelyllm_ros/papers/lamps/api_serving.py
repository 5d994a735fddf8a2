"""LAMPS's standalone reproduction: an iteration-level simulator of one engine serving requests
that pause (docs/seeds-002-004.md), under vLLM, INFERCEPT, LAMPS and fixed-handling policies.
`python -m timelyllm_ros.papers.lamps` prints the comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from timelyllm_ros.core.engine.base import DISCARD, PRESERVE, SWAP
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.papers.lamps.pause_workload import PausingRequest, PauseWorkload, make_requests
from timelyllm_ros.papers.lamps.ranking import LampsQueue, memory_time_score
from timelyllm_ros.papers.lamps.waste import choose_handling, engine_time_fns


@dataclass
class PauseResult:
    policy: str
    mean_latency_s: float
    p99_latency_s: float
    mean_ttft_s: float
    p99_ttft_s: float
    mean_service_s: float      # latency minus the request's own pauses: what scheduling controls
    p99_service_s: float
    throughput_rps: float
    done: int
    total: int
    handling: dict[str, int]
    recomputed_tokens: int
    swapped_tokens: int

    def row(self) -> str:
        h = self.handling
        return (f"{self.policy:16s} lat {self.mean_latency_s:7.2f}/{self.p99_latency_s:7.2f} s"
                f"  non-pause {self.mean_service_s:7.2f}/{self.p99_service_s:7.2f} s"
                f"  TTFT {self.mean_ttft_s:6.2f}/{self.p99_ttft_s:6.2f} s"
                f"  thr {self.throughput_rps:5.2f} req/s  done {self.done}/{self.total}"
                f"  P/S/D {h[PRESERVE]}/{h[SWAP]}/{h[DISCARD]}")


PAUSE_POLICIES = ("vllm", "infercept", "lamps", "lamps-nostarve", "lamps-np", "fcfs-preserve",
                  "fcfs-swap", "lamps-preserve", "lamps-swap")


def simulate_api_serving(policy: str, workload: PauseWorkload = PauseWorkload(), *,
                         profile: EngineProfile | None = None, max_seqs: int = 256,
                         max_batched_tokens: int = 8192, kv_bytes_per_token: int = 131072,
                         host_link_bytes_per_s: float = 25e9, starvation_threshold: int = 100,
                         refresh_every: int = 10, horizon_s: float = 3600.0) -> PauseResult:
    """Iteration-level simulation of one engine serving requests that pause.

    Policies (order / handling):
      vllm: FCFS / always discard (a pause ends the request; the resume is a new one).
      infercept: FCFS / least-waste handling chosen at the pause with the actual batch.
      lamps: memory-over-time score + starvation (threshold, refresh every k) / least-waste
        handling predicted when the segment is ranked. lamps-nostarve: without starvation.
        lamps-np: LAMPS order and handling, but waiting requests never preempt running ones.
      fcfs-/lamps-preserve, -swap: fixed handling, to measure where each wins.
    Engine: a step costs profile.step_s(prefill tokens, batch, context); swaps are synchronous
    (INFERCEPT's assumption) and add their copy time to the next step; a discarded or evicted
    request re-prefills its whole context. KV capacity is the profile's. A request that cannot
    get memory waits (the order is walked until the first that does not fit, as vLLM's
    scheduler does). A running request short of memory preempts lower-ranked resident ones
    (recompute); under LAMPS a waiting request may do so too.
    """
    if policy not in PAUSE_POLICIES:
        raise ValueError(f"policy must be one of {PAUSE_POLICIES}")
    if profile is None:
        profile = EngineProfile()
    t_fwd, t_swap = engine_time_fns(profile, kv_bytes_per_token=kv_bytes_per_token,
                                    host_link_bytes_per_s=host_link_bytes_per_s)
    capacity = profile.kv_capacity_tokens()
    reqs = make_requests(workload)
    pending = list(reversed(reqs))
    by_id = {r.rid: r for r in reqs}
    ranked = policy.startswith("lamps")
    # LAMPS re-forms the batch by rank every iteration, so a higher-ranked waiting request
    # displaces lower-ranked running ones; FCFS engines never preempt running work for waiting
    # work. lamps-np ranks like LAMPS but does not preempt.
    preemptive = ranked and policy != "lamps-np"
    fixed = {"fcfs-preserve": PRESERVE, "fcfs-swap": SWAP, "lamps-preserve": PRESERVE,
             "lamps-swap": SWAP, "vllm": DISCARD}.get(policy)
    iter_est = [profile.decode_step_s(1, 0)]
    batch_ctx_est = [0.0]          # EMA of the batch's context tokens, for predicted handling

    def predicted_handling(r: PausingRequest) -> str:
        if fixed is not None:
            return fixed
        s = r.segs[r.seg]
        c_i = r.context + s.tokens
        c_batch = max(batch_ctx_est[0], c_i)
        return choose_handling(t_int=s.pred_pause_s, c_i=c_i, c_other=c_batch - c_i,
                               c_batch=c_batch, t_fwd=t_fwd, t_swap=t_swap)

    def score(rid: int) -> float:
        r = by_id[rid]
        s = r.segs[r.seg]
        left = s.tokens - r.gen_in_seg
        if r.is_last:
            return memory_time_score(prompt_tokens=r.context, pre_tokens=left, post_tokens=0,
                                     iter_s=iter_est[0])
        nxt = r.segs[r.seg + 1]
        return memory_time_score(prompt_tokens=r.context, pre_tokens=left,
                                 post_tokens=nxt.tokens, iter_s=iter_est[0],
                                 handling=r.handling or predicted_handling(r),
                                 t_int=s.pred_pause_s, response_tokens=s.response,
                                 t_fwd=t_fwd, t_swap=t_swap)

    queue = LampsQueue(score, refresh_every=refresh_every,
                       starvation_threshold=(starvation_threshold if policy != "lamps-nostarve"
                                             else 1 << 60))
    fcfs_ready: list[PausingRequest] = []   # FCFS policies: ready requests by (arrival, rid)
    paused: list[PausingRequest] = []
    used = 0                        # KV tokens resident (running, waiting-resident, preserved)
    stall_s = 0.0                   # swap time charged to the next step
    now = 0.0
    recomputed = 0
    swapped = 0
    finished: list[PausingRequest] = []

    def make_ready(r: PausingRequest) -> None:
        if ranked:
            if not r.is_last and not r.handling:
                r.handling = predicted_handling(r)
            if queue.is_paused(r.rid):
                queue.resume(r.rid)
            else:
                queue.add(r.rid)
        else:
            fcfs_ready.append(r)
            fcfs_ready.sort(key=lambda q: (q.arrival, q.rid))

    def next_event() -> float:
        return min([p.paused_until for p in paused] + ([pending[-1].arrival] if pending else []),
                   default=math.inf)

    while len(finished) < len(reqs) and now < horizon_s:
        while pending and pending[-1].arrival <= now:
            make_ready(pending.pop())
        for r in [p for p in paused if p.paused_until <= now]:
            paused.remove(r)
            r.context += r.segs[r.seg].response
            r.seg += 1
            r.gen_in_seg = 0
            r.handling = ""
            make_ready(r)
        order = queue.begin_iteration() if ranked else [q.rid for q in fcfs_ready]
        chosen: list[PausingRequest] = []
        budget = max_batched_tokens
        step_swap = 0
        pre_tokens = 0
        admitting = True                     # waiting requests still admitted this step
        for i, rid in enumerate(order):
            if len(chosen) >= max_seqs:
                break
            r = by_id[rid]
            resident = r.kv > 0
            if not resident and not admitting:
                continue
            kept = r.kv + r.host
            feed = r.context - kept          # whole context after a discard; returned tokens
            add = r.host + feed + 1          # swap-in, prefill, and this step's token
            if feed > budget:
                admitting = admitting and resident
                continue
            if used + add > capacity and (resident or preemptive):
                # Preempt resident requests ranked below this one (lowest first); none of them
                # has run in this step yet, and they recompute when next scheduled. Promoted
                # requests rank above all others, so they only yield to an earlier promotion.
                for v in reversed(order[i + 1:]):
                    if used + add <= capacity:
                        break
                    q = by_id[v]
                    if q.kv > 0:
                        used -= q.kv
                        q.kv = 0
                        q.host = 0
            if used + add > capacity:
                # A running request that cannot grow idles this step; a waiting one closes
                # admission for the rest (head-of-line, as vLLM's scheduler does).
                if not resident:
                    admitting = False
                continue
            if r.host:
                step_swap += r.host
                swapped += r.host
            if feed and kept == 0 and not math.isnan(r.first_s):
                recomputed += feed
            r.kv += add
            r.host = 0
            used += add
            pre_tokens += feed
            budget -= feed
            chosen.append(r)
        if ranked:
            queue.end_iteration(r.rid for r in chosen)
        if not chosen:
            # Nothing fits: only a pause ending or an arrival can change that.
            nxt = next_event()
            if not math.isfinite(nxt):
                break
            now = max(now, nxt)
            continue

        ctx = sum(r.context for r in chosen)
        step = profile.step_s(pre_tokens, len(chosen), ctx) + stall_s + t_swap(step_swap)
        stall_s = 0.0
        now += step
        iter_est[0] += 0.2 * (step - iter_est[0])
        batch_ctx_est[0] += 0.2 * (ctx - batch_ctx_est[0])
        for r in chosen:
            if math.isnan(r.first_s):
                r.first_s = now
            r.gen_in_seg += 1
            r.context += 1
            s = r.segs[r.seg]
            if r.gen_in_seg < s.tokens:
                continue
            if r.is_last:
                r.finish_s = now
                used -= r.kv
                r.kv = 0
                finished.append(r)
                if ranked:
                    queue.finish(r.rid)
                else:
                    fcfs_ready.remove(r)
                continue
            # The segment ends in a pause: handle the KV.
            if ranked:
                h = r.handling
                queue.pause(r.rid)
            else:
                fcfs_ready.remove(r)
                if fixed is not None:
                    h = fixed
                else:
                    others = sum(q.kv for q in chosen if q is not r)
                    h = choose_handling(t_int=s.pause_s, c_i=r.context, c_other=others,
                                        c_batch=others + r.context, t_fwd=t_fwd, t_swap=t_swap)
            r.counts[h] += 1
            if h == SWAP:
                stall_s += t_swap(r.kv)
                swapped += r.kv
                r.host = r.kv
                used -= r.kv
                r.kv = 0
            elif h == DISCARD:
                used -= r.kv
                r.kv = 0
            r.paused_until = now + s.pause_s
            paused.append(r)

    lat = np.array([r.finish_s - r.arrival for r in finished]) if finished else np.array([np.nan])
    svc = (np.array([r.finish_s - r.arrival - sum(s.pause_s for s in r.segs[:-1]) for r in finished])
           if finished else np.array([np.nan]))
    ttft = np.array([r.first_s - r.arrival for r in reqs if not math.isnan(r.first_s)])
    if ttft.size == 0:
        ttft = np.array([np.nan])
    span = max((r.finish_s for r in finished), default=now) - reqs[0].arrival
    counts = {PRESERVE: 0, SWAP: 0, DISCARD: 0}
    for r in reqs:
        for k, v in r.counts.items():
            counts[k] += v
    return PauseResult(policy, float(lat.mean()), float(np.percentile(lat, 99)),
                       float(ttft.mean()), float(np.percentile(ttft, 99)),
                       float(svc.mean()), float(np.percentile(svc, 99)),
                       len(finished) / span if span > 0 else 0.0, len(finished), len(reqs),
                       counts, recomputed, swapped)

