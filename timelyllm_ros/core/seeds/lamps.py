"""LAMPS: scheduling generations that pause mid-way (seed 004).

A request that calls an API stops generating until the API answers; a robot executing a segment
is exactly that, with the execution-time model predicting the pause. Three decisions follow:

* how to treat the KV cache during the pause - `choose_handling` picks the handling with least
  memory waste by INFERCEPT's equations (Preserve: keep it; Discard: drop and recompute on
  resume; Swap: copy to host and back);
* in which order to serve requests - `memory_time_score` ranks by the area under the request's
  memory-over-time curve under its predicted handling (formula rebuilt in the digest, [R]);
* how to stop that order starving long requests - `LampsQueue` keeps scores (refreshed every k
  iterations) and a per-request starvation counter that promotes a request to the head for good.

`simulate_toy` reproduces the paper's three-request example under explicit rules, and
`simulate_api_serving` is a small iteration-level simulator for docs/seeds-002-004.md.
`handling_for_pause` is the robot-facing entry point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence, Union

import numpy as np

PRESERVE = "preserve"
DISCARD = "discard"
SWAP = "swap"
# Also the tie order: on equal waste keep the KV where it is (no copy, no compute), then prefer
# a copy (bandwidth) over a recompute (it also delays every request batched with the resume).
HANDLINGS = (PRESERVE, SWAP, DISCARD)

TimeFn = Union[Callable[[float], float], float]


def _at(f: TimeFn, c: float) -> float:
    return float(f(c)) if callable(f) else float(f)


# --------------------------------------------------------------------------------------------
# Handling during a pause (INFERCEPT's waste equations)
# --------------------------------------------------------------------------------------------

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
    fwd = _at(t_fwd, c_i)
    swp = _at(t_swap, c_i)
    return {PRESERVE: waste_preserve(t_int, c_i, m),
            SWAP: waste_swap(swp, c_batch, m),
            DISCARD: waste_discard(fwd, c_i, c_other, m)}


def choose_handling(*, t_int: float, c_i: float, c_other: float, c_batch: float,
                    t_fwd: TimeFn, t_swap: TimeFn, m: float = 1.0) -> str:
    """"preserve", "discard" or "swap", whichever wastes least (ties in HANDLINGS order)."""
    w = handling_wastes(t_int=t_int, c_i=c_i, c_other=c_other, c_batch=c_batch, t_fwd=t_fwd,
                        t_swap=t_swap, m=m)
    best = min(w.values())
    # Relative tolerance: the switch points are products of decimal inputs (0.1*100 vs
    # 2*0.005*1000) that float arithmetic does not make exactly equal.
    tol = 1e-9 * max(best, 1e-300)
    return next(h for h in HANDLINGS if w[h] <= best + tol)


def preserve_limit_s(*, c_i: float, c_other: float, c_batch: float, t_fwd: TimeFn,
                     t_swap: TimeFn) -> float:
    """Longest pause for which Preserve still wins (its waste is linear in T_INT, the others
    do not depend on it)."""
    if c_i <= 0:
        return math.inf
    other = min(waste_swap(_at(t_swap, c_i), c_batch), waste_discard(_at(t_fwd, c_i), c_i, c_other))
    return other / c_i


# --------------------------------------------------------------------------------------------
# Ranking: memory over time [R]
# --------------------------------------------------------------------------------------------

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
        return base + m * (c + R) * _at(t_fwd, c + R)
    if handling == SWAP:
        return base + 2.0 * m * c * _at(t_swap, c)
    raise ValueError(f"handling must be one of {HANDLINGS} or None, got {handling!r}")


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


# --------------------------------------------------------------------------------------------
# The paper's toy example (Table 1, Figure 3)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ToyRequest:
    name: str
    length: int        # output tokens
    pause_after: int   # tokens before the API call
    pause: int         # API duration in units
    handling: str


TOY_TABLE1 = (
    ToyRequest("R1", 6, 5, 2, PRESERVE),
    ToyRequest("R2", 2, 1, 7, DISCARD),
    ToyRequest("R3", 3, 2, 1, SWAP),
)


@dataclass
class ToyState:
    index: int
    req: ToyRequest
    phase: str = "pre"        # pre -> call -> post -> done
    generated: int = 0
    recomputed: bool = False
    mem: int = 0
    ready_at: int = 0
    finish: int = -1

    @property
    def remaining_work(self) -> int:
        """Units of LLM work left: tokens plus a pending recompute."""
        r = self.req
        owe = 1 if (r.handling == DISCARD and r.pause_after < r.length and not self.recomputed) else 0
        return (r.length - self.generated) + owe

    @property
    def peak(self) -> int:
        """Memory at the end of the current segment."""
        return self.req.pause_after if self.phase == "pre" else self.req.length


@dataclass
class ToyResult:
    completion: dict[str, int]
    trace: list[str]           # what ran in each unit ("-" idle)

    @property
    def average(self) -> float:
        return sum(self.completion.values()) / len(self.completion)


def toy_key_fcfs(s: ToyState):
    return s.index


def toy_key_sjf(s: ToyState):
    # The paper's SJF narrative ("R1 also has two units remaining, so R2 must wait") ranks by
    # the work still to do, so it is SRPT-like; a static length order would let R2 preempt R1
    # at unit 8 and give 9.67, not 10.33.
    return s.remaining_work


def toy_key_sjf_total(s: ToyState):
    return s.req.length + s.req.pause


def toy_key_order(names: Sequence[str]) -> Callable[[ToyState], int]:
    pos = {n: i for i, n in enumerate(names)}
    return lambda s: pos[s.req.name]


def toy_score(r: ToyRequest) -> float:
    """`memory_time_score` in the toy's units: one unit per token, one recompute unit, free swap."""
    has_pause = r.pause_after < r.length
    return memory_time_score(prompt_tokens=0, pre_tokens=r.pause_after,
                             post_tokens=r.length - r.pause_after, iter_s=1.0,
                             handling=r.handling if has_pause else None, t_int=r.pause,
                             t_fwd=1.0, t_swap=0.0)


def toy_key_lamps_score(s: ToyState):
    return toy_score(s.req)


def simulate_toy(requests: Sequence[ToyRequest] = TOY_TABLE1,
                 key: Callable[[ToyState], Any] = toy_key_fcfs, *, memory: int = 6,
                 max_units: int = 10_000) -> ToyResult:
    """Unit-time simulation under the rules that reproduce the paper's Figure 3:

    * one request runs per unit; it produces one token, or (Discard, first unit after its call)
      recomputes its context instead;
    * memory of a request = tokens generated so far, held while it runs, while it waits after
      being preempted, and during its call only under Preserve; Swap and Discard hold nothing
      during the call; swapping in is free;
    * a segment (pre-call or post-call part) may run only if the memory held by all other
      requests plus the segment's peak (tokens at its end) fits the budget;
    * each unit, the ready request with the lowest `key` that fits runs (preemptive); the request
      that ran in the previous unit wins ties, then the lower index;
    * a call lasts `pause` units from the end of the token that triggers it.
    """
    states = [ToyState(i, r) for i, r in enumerate(requests)]
    for s in states:
        if s.req.handling not in HANDLINGS:
            raise ValueError(f"{s.req.name}: unknown handling {s.req.handling!r}")
        if not 0 < s.req.pause_after <= s.req.length:
            raise ValueError(f"{s.req.name}: need 0 < pause_after <= length")
    trace: list[str] = []
    prev: ToyState | None = None
    t = 0
    while any(s.phase != "done" for s in states):
        if t >= max_units:
            raise RuntimeError("toy simulation did not finish")
        for s in states:
            if s.phase == "call" and s.ready_at <= t:
                s.phase = "post"
        ready = [s for s in states if s.phase in ("pre", "post")]
        ready.sort(key=lambda s: (key(s), s is not prev, s.index))
        run = None
        for s in ready:
            others = sum(o.mem for o in states if o is not s)
            if others + s.peak <= memory:
                run = s
                break
        if run is None:
            trace.append("-")
            prev = None
            t += 1
            continue
        r = run.req
        if run.phase == "post" and r.handling == DISCARD and not run.recomputed:
            run.recomputed = True
            run.mem = run.generated
        else:
            run.generated += 1
            run.mem = run.generated
        t += 1
        trace.append(r.name)
        prev = run
        if run.phase == "pre" and run.generated == r.pause_after:
            if r.pause_after == r.length:
                run.phase, run.finish, run.mem = "done", t, 0
            else:
                run.phase = "call"
                run.ready_at = t + r.pause
                if r.handling != PRESERVE:
                    run.mem = 0
                prev = None
        elif run.phase == "post" and run.generated == r.length:
            run.phase, run.finish, run.mem = "done", t, 0
            prev = None
    return ToyResult({s.req.name: s.finish for s in states}, trace)


# --------------------------------------------------------------------------------------------
# Robot adapter
# --------------------------------------------------------------------------------------------

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


def engine_time_fns(profile: Any, *, kv_bytes_per_token: int = 131072,
                    host_link_bytes_per_s: float = 25e9) -> tuple[Callable[[float], float],
                                                                  Callable[[float], float]]:
    """(t_fwd, t_swap) from an EngineProfile: a recompute is a cold prefill of C tokens; a swap
    moves C * kv_bytes_per_token over the host link (default ~PCIe 4 x16)."""
    def t_fwd(c: float) -> float:
        return profile.prefill_s(int(math.ceil(c)))

    def t_swap(c: float) -> float:
        return c * kv_bytes_per_token / host_link_bytes_per_s

    return t_fwd, t_swap


# --------------------------------------------------------------------------------------------
# Iteration-level simulation of requests with pauses
# --------------------------------------------------------------------------------------------

# LAMPS Table 2 (from INFERCEPT): API duration (mean, std) seconds and calls per request (mean,
# std). Token counts are not in the paper; the workload below assumes them.
INFERCEPT_APIS: Mapping[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "math": ((9e-5, 6e-5), (3.75, 1.3)),
    "qa": ((0.69, 0.17), (2.52, 1.73)),
    "ve": ((0.09, 0.014), (28.18, 15.2)),
    "chatbot": ((28.6, 15.6), (4.45, 1.96)),
    "image": ((20.03, 7.8), (6.91, 3.93)),
    "tts": ((17.24, 7.6), (6.91, 3.93)),
}


@dataclass
class _Seg:
    tokens: int
    pause_s: float            # actual pause after this segment (nan for the last)
    pred_pause_s: float       # what the scheduler predicts
    response: int             # tokens the pause returns into the context


@dataclass
class _PReq:
    rid: int
    arrival: float
    prompt: int
    segs: list[_Seg]
    seg: int = 0
    gen_in_seg: int = 0
    context: int = 0          # tokens in the logical context
    kv: int = 0               # tokens resident on the device
    host: int = 0             # tokens swapped to host
    paused_until: float = math.nan
    handling: str = ""        # handling of the current segment's pause
    first_s: float = math.nan
    finish_s: float = math.nan
    counts: dict = field(default_factory=lambda: {PRESERVE: 0, SWAP: 0, DISCARD: 0})

    @property
    def done(self) -> bool:
        return not math.isnan(self.finish_s)

    @property
    def is_last(self) -> bool:
        return self.seg == len(self.segs) - 1


@dataclass(frozen=True)
class PauseWorkload:
    """Poisson arrivals of requests whose segments each end in a pause.

    kind "infercept": API type uniform over INFERCEPT_APIS; calls and durations from its
        (mean, std) as truncated normals. Assumed (not in the paper): prompt U(100, 600),
        segment tokens lognormal(mean 40, std 30), response tokens U(5, 50).
    kind "robot": a planner prompt U(1500, 3000) (TimelyLLM's prompts are ~2.9k tokens), 3-8
        segments of lognormal(mean 40, std 20) tokens, execution pauses lognormal with median
        `robot_pause_median_s`, sigma 0.8, no returned tokens (feedback arrives with the next
        task, not the resume).
    The scheduler's predicted pause is the API type's mean (infercept) or the pause scaled by a
    lognormal error of sigma `pred_sigma` (robot), as the paper's per-type mean / this project's
    execution-time model would give.
    """

    kind: str = "infercept"
    rate: float = 2.0
    n_requests: int = 300
    robot_pause_median_s: float = 2.0
    pred_sigma: float = 0.2
    seed: int = 0


def _make_requests(w: PauseWorkload) -> list[_PReq]:
    rng = np.random.default_rng(w.seed)
    out = []
    t = 0.0
    for i in range(w.n_requests):
        t += rng.exponential(1.0 / w.rate)
        segs: list[_Seg] = []
        if w.kind == "infercept":
            api = list(INFERCEPT_APIS)[int(rng.integers(len(INFERCEPT_APIS)))]
            (dm, ds), (cm, cs) = INFERCEPT_APIS[api]
            calls = int(np.clip(round(rng.normal(cm, cs)), 1, 40))
            prompt = int(rng.integers(100, 601))
            for _ in range(calls):
                tok = int(np.clip(_lognormal(rng, 40, 30), 2, 400))
                segs.append(_Seg(tok, max(float(rng.normal(dm, ds)), 1e-5), dm,
                                 int(rng.integers(5, 51))))
            segs.append(_Seg(int(np.clip(_lognormal(rng, 40, 30), 2, 400)), math.nan, math.nan, 0))
        elif w.kind == "robot":
            prompt = int(rng.integers(1500, 3001))
            n = int(rng.integers(3, 9))
            for k in range(n):
                tok = int(np.clip(_lognormal(rng, 40, 20), 5, 200))
                if k == n - 1:
                    segs.append(_Seg(tok, math.nan, math.nan, 0))
                else:
                    p = float(w.robot_pause_median_s * rng.lognormal(0.0, 0.8))
                    segs.append(_Seg(tok, p, p * float(rng.lognormal(0.0, w.pred_sigma)), 0))
        else:
            raise ValueError(f"unknown workload kind {w.kind!r}")
        out.append(_PReq(i, t, prompt, segs, context=prompt))
    return out


def _lognormal(rng, mean, std):
    s2 = math.log1p((std / mean) ** 2)
    return float(rng.lognormal(math.log(mean) - s2 / 2, math.sqrt(s2)))


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
                         profile: Any = None, max_seqs: int = 256,
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
        from timelyllm_ros.core.engine.cost_model import EngineProfile
        profile = EngineProfile()
    t_fwd, t_swap = engine_time_fns(profile, kv_bytes_per_token=kv_bytes_per_token,
                                    host_link_bytes_per_s=host_link_bytes_per_s)
    capacity = profile.kv_capacity_tokens()
    reqs = _make_requests(workload)
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

    def predicted_handling(r: _PReq) -> str:
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
    fcfs_ready: list[_PReq] = []   # FCFS policies: ready requests by (arrival, rid)
    paused: list[_PReq] = []
    used = 0                        # KV tokens resident (running, waiting-resident, preserved)
    stall_s = 0.0                   # swap time charged to the next step
    now = 0.0
    recomputed = 0
    swapped = 0
    finished: list[_PReq] = []

    def make_ready(r: _PReq) -> None:
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
        chosen: list[_PReq] = []
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


def _main(argv: Sequence[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="LAMPS simulations (docs/seeds-002-004.md)")
    ap.add_argument("--toy", action="store_true", help="print the Table 1 toy results")
    ap.add_argument("--kind", default="infercept", choices=("infercept", "robot"))
    ap.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--pause-median", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", nargs="+", default=["vllm", "infercept", "lamps", "lamps-nostarve"])
    args = ap.parse_args(argv)
    if args.toy:
        for name, key in (("FCFS", toy_key_fcfs), ("SJF", toy_key_sjf),
                          ("SJF-total", toy_key_sjf_total),
                          ("LAMPS R3,R2,R1", toy_key_order(["R3", "R2", "R1"])),
                          ("score [R]", toy_key_lamps_score)):
            res = simulate_toy(TOY_TABLE1, key)
            print(f"{name:16s} avg {res.average:6.3f}  {res.completion}  {''.join(x[-1] for x in res.trace)}")
        return
    for rate in args.rates:
        w = PauseWorkload(kind=args.kind, rate=rate, n_requests=args.n,
                          robot_pause_median_s=args.pause_median, seed=args.seed)
        print(f"{args.kind}: rate {rate} req/s, {args.n} requests")
        for p in args.policies:
            print("  " + simulate_api_serving(p, w).row())


if __name__ == "__main__":
    _main()
