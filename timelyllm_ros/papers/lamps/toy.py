"""The paper's toy example (Table 1, Figure 3): three requests with one API call each, served
one unit at a time under explicit rules that reproduce the paper's completion times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from timelyllm_ros.core.engine.base import DISCARD, PAUSE_HANDLINGS, PRESERVE, SWAP
from timelyllm_ros.papers.lamps.ranking import memory_time_score


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
        if s.req.handling not in PAUSE_HANDLINGS:
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

