"""The sequenced burst bound: the grouped bound (bench/bound_burst.py) with the cost it leaves out
between groups, for events of a few tasks (bench/bound.py takes the smallest of the three).

The grouped bound lets a task whose prompt completes in an early step answer as if the prompts
completing in later steps never shared its steps, and lets those later tasks answer as if the
early task's first segment took no steps of its own. No schedule does both: a prompt completed
while an earlier task is still emitting its first segment makes that task's remaining steps pay
for its tokens, and a prompt completed after that task's first segment is out waits for all of
that task's steps. (docs/family.md measured the gap on member 39 event 0: the grouped bound
answers a third urgent drone at 0.324 s, the best schedule found at 0.390 s.)

Notation as in bench/bound_burst.py: task i computes at least m_i prompt tokens, emits a first
segment of g_i tokens, and answers no sooner than alone_i. Number the steps from the event's
release, 1, 2, ... (every step begun after it: the event's own and others'). Let S_i be the step
in which task i's prompt completes (its first token comes out with it) and R_i the step in which
its first segment is out: R_i >= S_i + g_i - 1. Every step costs at least d0 =
decode_step_s(1, 0) (at least one sequence samples in it); a step computing prompt tokens also
pays prefill_fixed; each prompt token costs prefill_per_token; in each of task i's own steps
(its partial prompt steps, S_i and its g_i - 1 decode steps) the batch holds at least its
context, decode_per_ctx_token * ctx more (`own_ctx_i`, the decode-context terms of
bound_burst.own_steps_floor_s). So task x answers no sooner than

    T_x = latency + R_x * d0 + prefill_per_token * M(R_x) + prefill_fixed * F(R_x) + own_ctx_x,

M(s) the floors m_i summed over the tasks with S_i <= s (their prompts are computed in steps up
to s; a prompt completing later may have computed part of itself by then, which only adds),
F(s) >= max(the number of distinct S_i <= s, ceil(M(s) / b)) the steps up to s that compute
prompt tokens, b the token budget of a step; and M(s) <= b * s. Lowering R_x to S_x + g_x - 1
only lowers T_x (a sequence left out of some steps answers later, and no term above counts
another task's presence), and a TUF never rises with time, so the best summed utility of
U_x(max(T_x, alone_x)) over every choice of the S_i is an upper bound of every schedule's.

The search runs over the steps at which prompts complete: a state is the
last such step, the tasks whose prompts have completed, how many steps completed one, and the
answer step of each task still emitting its first segment (its utility is settled as soon as
no later prompt can complete before its answer). From a state the next prompts to complete are
any non-empty subset of the others, at the first step whose budget the subset's prompts fit
or at the step right after a pending answer: at any step in between the same tasks have been
answered, and the earliest of them is best for everyone (later, every answer to come only moves
later). It is a branch and bound: a state reached again with no more utility is dropped, and
a branch whose optimistic figure (each pending task answered with no further prompt, each other
one placed next on its own) cannot beat the best complete choice found so far is cut. On 200
random events of 1-6 tasks the slowest took 0.06 s (2-core VM, 2 December 2026).

Refusals: a task the bench may shed (`sheddable`) can be left out, utility 0 (a refusal comes at
its TUF's cut-off at the soonest), its prompt computed in no step; the search runs once per set
of tasks served, largest first, sharing the best found. bench/bound.py also uses this bound for
a run of events released while an earlier one may still be answering: all released at the
first one's time, each task valued from its own release and answering no sooner than its own
release plus its alone floor (that only lets later tasks start earlier, so it stays a bound).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from timelyllm_ros.bench.bound_burst import own_steps_floor_s, refusable_mask, subset_sums
from timelyllm_ros.core.engine.cost_model import EngineProfile

# Events of more tasks get the slot and grouped bounds only. A cost limit, not a model
# constant: any value gives a valid bound, a larger one a tighter bound on larger events.
SEQUENCED_MAX_TASKS = 6
# States the search may visit before it gives up on an event (the other bounds then stand):
# a cost limit too. The events of family seeds 1, 2 and 3 take at most 8,651; six
# near-identical prompts, the worst found, 18,549-32,163 (0.3-0.6 s).
SEQUENCED_MAX_STATES = 200_000


def sequenced_responses(profile: EngineProfile, latency_s: float,
                        computed_floors: Sequence[int], prompt_tokens: Sequence[int],
                        first_segment_tokens: Sequence[int], alone_s: Sequence[float],
                        utilities: Sequence[Callable[[float], float]],
                        sheddable: Sequence[bool] | None = None) -> tuple[list[float], float]:
    """The sequenced bound of one event (module docstring): each task's response time in the
    best choice of the steps its prompt completes in, and the summed utility. A task marked in
    `sheddable` may instead be refused (NaN response, utility 0: a refusal comes at its TUF's
    cut-off at the soonest, so it gets 0 at most) and then takes no step. If the search visits
    more than SEQUENCED_MAX_STATES states it gives up: NaN responses and an infinite sum, so a
    caller that keeps the smallest of its bounds keeps the others."""
    n = len(computed_floors)
    if not (len(prompt_tokens) == len(first_segment_tokens) == len(alone_s)
            == len(utilities) == n):
        raise ValueError(f"sequenced_responses: {n} floors need as many prompts, segments, "
                         "alone times and utilities")
    if any(g < 1 for g in first_segment_tokens) or any(m < 1 for m in computed_floors):
        raise ValueError("sequenced_responses: every task computes >= 1 prompt token and "
                         "emits >= 1 token")
    budget = profile.max_num_batched_tokens
    d0 = profile.decode_step_s(1, 0)
    floors = list(computed_floors)
    tails = [g - 1 for g in first_segment_tokens]
    own_ctx = []
    for x in range(n):
        steps = max(0, math.ceil(floors[x] / budget) - 1) + first_segment_tokens[x]
        own_ctx.append(own_steps_floor_s(profile, prompt_tokens[x], floors[x],
                                         first_segment_tokens[x]) - steps * d0)
    tokens_of = subset_sums(floors)
    members = [tuple(x for x in range(n) if mask >> x & 1) for mask in range(1 << n)]

    def answer_s(x: int, step: int, mask: int, prefill_steps: int) -> float:
        tokens = tokens_of[mask]
        seconds = (latency_s + step * d0 + profile.prefill_per_token_s * tokens
                   + profile.prefill_fixed_s * max(prefill_steps, math.ceil(tokens / budget))
                   + own_ctx[x])
        return max(seconds, alone_s[x])

    def settle(pending: tuple, upto: float, mask: int, prefill_steps: int):
        """Answer the pending tasks ((task, answer step)) whose answer step is before `upto`
        (no prompt completes between): (their summed utility, their answers, the others)."""
        value, answers, left = 0.0, (), ()
        for x, step in pending:
            if step < upto:
                t = answer_s(x, step, mask, prefill_steps)
                value += utilities[x](t)
                answers += ((x, t),)
            else:
                left += ((x, step),)
        return value, answers, left

    def optimistic(step: int, mask: int, prefill_steps: int, pending: tuple) -> float:
        """At least the utility still to come from a state: each pending task answered with
        no further prompt, each other one placed next, alone."""
        value = settle(pending, math.inf, mask, prefill_steps)[0]
        for x in members[full & ~mask]:
            done = mask | 1 << x
            at = max(step + 1, math.ceil(tokens_of[done] / budget))
            value += utilities[x](answer_s(x, at + tails[x], done, prefill_steps + 1))
        return value

    incumbent = [-math.inf, ()]
    seen: dict = {}
    full = 0  # the tasks served, in turn each set that leaves out only sheddable ones

    def search(step: int, mask: int, prefill_steps: int, pending: tuple, value: float,
               answers: tuple) -> None:
        if mask == full:
            more, last, _ = settle(pending, math.inf, mask, prefill_steps)
            if value + more > incumbent[0]:
                incumbent[:] = [value + more, answers + last]
            return
        key = (full, step, mask, prefill_steps, pending)
        if seen.get(key, -math.inf) >= value:
            return  # the same state was reached with at least as much
        seen[key] = value
        if len(seen) > SEQUENCED_MAX_STATES:
            raise _GiveUp
        if value + optimistic(step, mask, prefill_steps, pending) <= incumbent[0] + 1e-12:
            return
        rest = full & ~mask
        pending_next = sorted({s + 1 for _, s in pending})
        group = rest
        while group:
            done = mask | group
            earliest = max(step + 1, math.ceil(tokens_of[done] / budget))
            # Between two pending answers the same tasks are settled first, and the earliest
            # such step is best for everyone: the next prompts then complete either as soon
            # as they can or right after a pending answer.
            for at in [earliest] + [s for s in pending_next if s > earliest]:
                gained, answered, left = settle(pending, at, mask, prefill_steps)
                started = tuple(sorted(left + tuple((x, at + tails[x]) for x in members[group])))
                search(at, done, prefill_steps + 1, started, value + gained, answers + answered)
            group = (group - 1) & rest

    every = (1 << n) - 1
    optional = refusable_mask(sheddable)
    try:
        for served in sorted((every & ~shed for shed in _subsets(optional)),
                             key=lambda m: -bin(m).count("1")):
            full = served
            search(0, 0, 0, (), 0.0, ())  # (the refused add 0; the best so far prunes the rest)
    except _GiveUp:
        return [math.nan] * n, math.inf
    value, answers = incumbent
    responses = dict(answers)
    return [responses.get(x, math.nan) for x in range(n)], value


class _GiveUp(Exception):
    """The search visited more than SEQUENCED_MAX_STATES states."""


def _subsets(mask: int) -> list[int]:
    """Every subset of the bits of `mask`, the empty one first."""
    out, sub = [0], mask
    while sub:
        out.append(sub)
        sub = (sub - 1) & mask
    return out


