"""A tighter upper bound for tasks that arrive together: the burst bound (bench/bound.py uses it).

The alone bound serves every task as if it were alone on the engine. When one event releases
several tasks at once (a burst), no schedule serves them all alone: the engine computes their
prompts one step after another. This module lowers each event's tasks to what the simulated
engine's cost model (core/engine/cost_model.py, charged per step as core/engine/sim/engine.py
does) allows at best, and stays a valid upper bound of every policy's summed utility.

Notation, for the tasks of one event released at time a (those with a first segment): task i has
a prompt of `len_i` tokens, of which at least `m_i` must be computed (below), and a first segment
of `g_i` tokens; `alone_i` is its alone-bound response time. A step costs (cost model)

    prefill_fixed * [P > 0] + prefill_per_token * P + decode_fixed + decode_per_seq * B
        + decode_per_ctx_token * ctx

for P prompt tokens computed in it (P <= the token budget b), B >= 1 sequences in its batch, ctx
the tokens in their KV. Grammar work, swaps and grammar waits only add to it.

Claim: in any schedule, the k-th first segment of the event to complete is out no sooner than

    c_k = latency + min over j [ prefill_per_token * T_jk + prefill_fixed * ceil(T_jk / b)
                                 + own_j ],
    T_jk = m_j + the sum of the k-1 smallest m_i of the other tasks,
    own_j = sum of decode_step_s(1, ctx) over the steps task j itself must be in.

Proof sketch. Let S be the k tasks completed first and j the last of them. Every step that
works on S starts after a (a step begun before the event cannot hold its tasks) and the engine
runs one step at a time, so the k-th completion is at least a plus the cost of those steps.
(1) Prefill part: each task of S computes at least m_i prompt tokens, so these steps compute at
least T(S) >= T_jk prompt tokens (a task outside S adds to it), at most b per step, so at least
ceil(T_jk / b) of them pay the fixed prefill cost. (2) Decode part: task j is in the batch of
each of its own steps, which pay decode_fixed + decode_per_seq + decode_per_ctx_token * ctx
with ctx at least j's own tokens: its prompt needs ceil(m_j / b) steps, the last of which
emits its first token, and g_j - 1 more steps follow, one token each. In the step that
completes j's prompt and the ones after, j holds len_j, len_j + 1, ... tokens; in its t-th
partial prompt step counted back from that one it holds at least len_j - t * b (each chunk is at
most b). Decode work runs concurrently with other tasks' prefills (chunked prefill), so these
steps may be the very steps of (1); the sum still holds because (1) counts only the prefill terms
of a step and (2) only its decode terms. Minimising over j (and so over S) gives c_k, and c_k
grows with k. Response times add the network latency as the alone bound does.

So the task completed k-th has response >= max(c_k, alone_i), and since a TUF never rises with
time, any schedule's summed utility is at most sum_i U_i(max(c_slot(i), alone_i)) for the
permutation that its completion order defines, hence at most the best permutation: an
assignment problem (scipy.optimize.linear_sum_assignment). Tasks of other events only take
steps away, except through the prefix cache (below); the bound ignores them.

Prefix cache: as in the alone bound, the skill set's shared prompt prefix is warm (`cached_i`,
whole KV blocks) and nothing else of a task's prompt is assumed cached from earlier events (an
identical prompt served before could save a few ms: the alone bound's stated exception). Inside
an event the bound does not assume so: a task served after another of the same event may hit the
blocks that one computed, so m_i counts only what no other prompt of the event can give it:
m_i = len_i - max(cached_i, the longest common prefix with another prompt of the event in whole
blocks, at most len_i - 1: the last prompt token is always computed). With distinct prompts
m_i = len_i - cached_i, the alone bound's uncached tokens.

Grouped: a second valid bound, for events of at most `GROUPED_MAX_TASKS` tasks, counts what the
slots above count separately. In any schedule, group the event's tasks by the step in which their
prompts complete (and their first tokens come out): groups G_1, G_2, ... in the order of those
steps. The g-th of these steps ends no sooner than a plus the prefill of every prompt of
G_1..G_g (prefill_per_token * T, T their floors m_i summed) plus, for each of at least
max(g, ceil(T / b)) steps that compute prompt tokens, prefill_fixed + decode_step_s(1, 0);
a task x of G_g then needs g_x - 1 more steps, each at least decode_step_s(1, its context).
These steps are distinct, so x answers no sooner than that sum (plus the latency, and never
before alone_x). The best summed utility over all ordered groupings (a dynamic programme over
the subsets already grouped and the number of groups) is an upper bound too, and the event
takes the smaller of the two. It charges the slot bound's missing cost: a prompt computed with
an earlier one delays that one's first token, one computed in a later step pays that step.

An event with one task keeps its alone bound exactly; a task without a first segment keeps its
alone figures (no response) and takes no completion slot. A task the bench may shed (its TUF
reaches 0) may instead be refused in either bound (`sheddable`): it then counts 0, the most a
refusal gets (it comes at the TUF's cut-off at the soonest), and takes no slot or group; the
slots' floors still hold for the tasks served (each counts the smallest prompts of any other
tasks).

How far above the best schedule it is: bench/burst_search.py searches a burst's schedules on the
simulated engine (a reference, not a bound); docs/family.md gives the figures (0.38-0.47 of
summed utility above the best found on the three bursts studied there; the sequenced bound,
bench/bound_sequenced.py, which bench/bound.py also takes where lower, is 0.03-0.04 above).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from timelyllm_ros.core.engine.cost_model import EngineProfile


def prefill_floors(prompts: Sequence[Sequence[int]], cached: Sequence[int],
                   block_size: int) -> list[int]:
    """m_i of each prompt (module docstring): the tokens it computes at least, whatever the
    other prompts of its event left in the prefix cache. A prompt that is a proper prefix of
    another could hand it all of its blocks and whatever it generated after, so that other
    prompt may hit everything but its last token."""
    arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
    out = []
    for i, a in enumerate(arrays):
        hit = cached[i]
        for j, other in enumerate(arrays):
            if j == i:
                continue
            n = min(len(a), len(other))
            differ = np.flatnonzero(a[:n] != other[:n])
            common = int(differ[0]) if differ.size else n
            if common == len(other) < len(a):
                common = len(a)  # other's generated tokens may continue into this prompt
            hit = max(hit, min(common, len(a) - 1) // block_size * block_size)
        out.append(len(a) - hit)
    return out


def own_steps_floor_s(profile: EngineProfile, prompt_tokens: int, computed_floor: int,
                      first_segment_tokens: int) -> float:
    """The decode terms of the steps a task must be in to emit its first segment (own_j):
    ceil(m / b) - 1 partial prompt steps holding at least len - t * b tokens, then one step per
    first-segment token holding len, len + 1, ... tokens, each at batch size >= 1."""
    budget = profile.max_num_batched_tokens
    partial = max(0, math.ceil(computed_floor / budget) - 1)
    total = sum(profile.decode_step_s(1, max(0, prompt_tokens - t * budget))
                for t in range(1, partial + 1))
    total += sum(profile.decode_step_s(1, prompt_tokens + n) for n in range(first_segment_tokens))
    return total


def completion_floors_s(profile: EngineProfile, prompt_tokens: Sequence[int],
                        computed_floors: Sequence[int],
                        first_segment_tokens: Sequence[int]) -> np.ndarray:
    """Engine seconds after the event before task j's first segment can be out if it is the
    k-th of the event's to be out: c_jk less the latency (module docstring), as an n x n array
    indexed [j, k - 1]."""
    n = len(prompt_tokens)
    budget = profile.max_num_batched_tokens
    order = sorted(range(n), key=lambda i: computed_floors[i])
    position = {i: p for p, i in enumerate(order)}
    smallest = [0]  # smallest[q]: the sum of the q smallest floors
    for i in order:
        smallest.append(smallest[-1] + computed_floors[i])
    floors = np.empty((n, n))
    for j in range(n):
        own = own_steps_floor_s(profile, prompt_tokens[j], computed_floors[j],
                                first_segment_tokens[j])
        for k in range(1, n + 1):
            # The k-1 smallest floors of the other tasks: skip j's own if it is among them.
            others = smallest[k - 1] if position[j] >= k - 1 else \
                smallest[k] - computed_floors[j]
            tokens = computed_floors[j] + others
            floors[j, k - 1] = (profile.prefill_per_token_s * tokens
                                + profile.prefill_fixed_s * math.ceil(tokens / budget) + own)
    return floors


def best_assignment(alone_s: Sequence[float], slot_floors_s: np.ndarray,
                    utilities: Sequence[Callable[[float], float]],
                    sheddable: Sequence[bool] | None = None) -> list[float]:
    """Response times of the best assignment of tasks to completion slots: task i in slot k
    answers at max(slot_floors_s[i, k], alone_s[i]); the assignment maximises the summed
    utility. Returns each task's response time in it. A task marked in `sheddable` may be
    refused instead (NaN: utility 0 at most, a refusal comes at its TUF's cut-off at the
    soonest); the others then take the first slots, which the floors allow them (a slot's floor
    counts the smallest prompts of any other tasks, refused ones included)."""
    n = len(alone_s)
    floors = np.asarray(slot_floors_s, dtype=float)
    if floors.shape != (n, n) or len(utilities) != n:
        raise ValueError(f"best_assignment: {n} tasks need an {n} x {n} array of slot floors "
                         f"(got shape {floors.shape}) and {n} utility functions (got "
                         f"{len(utilities)})")
    response = np.maximum(floors, np.asarray(alone_s, dtype=float)[:, None])
    utility = np.array([[utilities[i](response[i, k]) for k in range(n)] for i in range(n)])
    if sheddable is not None:
        # One refusal column per task: 0 for a sheddable one, out of reach for the others.
        refuse = np.where(np.eye(n, dtype=bool) & np.asarray(sheddable, dtype=bool)[:, None],
                          0.0, -1e18)
        utility = np.hstack((utility, refuse))
    rows, cols = linear_sum_assignment(utility, maximize=True)
    out = [math.nan] * n
    for i, k in zip(rows, cols):
        if k < n:
            out[i] = float(response[i, k])
    return out


def subset_sums(values: Sequence[int]) -> list[int]:
    """The sum of `values` over each subset, indexed by the subset's bit mask (bit x: values[x];
    the grouped and sequenced bounds' prompt tokens of a set of tasks)."""
    out = [0]
    for value in values:  # the subsets with this bit set: those without it, plus it
        out += [total + value for total in out]
    return out


def refusable_mask(sheddable: Sequence[bool] | None) -> int:
    """The bit mask of the tasks marked in `sheddable` (none if it is None)."""
    return 0 if sheddable is None else sum(1 << x for x, shed in enumerate(sheddable) if shed)


# The grouped bound visits 3^n (task set, next group) pairs of an n-task event: events of more
# tasks get the assignment bound only. A cost limit, not a model constant: any value gives a
# valid bound, a larger one a tighter bound on larger events (6: ~15 ms per 6-task event).
GROUPED_MAX_TASKS = 6


def grouped_responses(profile: EngineProfile, latency_s: float, computed_floors: Sequence[int],
                      prompt_tokens: Sequence[int], first_segment_tokens: Sequence[int],
                      alone_s: Sequence[float],
                      utilities: Sequence[Callable[[float], float]],
                      sheddable: Sequence[bool] | None = None) -> tuple[list[float], float]:
    """The grouped bound of one event (module docstring, "Grouped"): the best summed utility
    over ordered groups of the tasks, a group being the tasks whose prompts complete in the same
    step. Returns each task's response time in the best grouping and the summed utility. Tasks
    marked in `sheddable` may be refused instead (NaN, utility 0 at most: `best_assignment`)."""
    n = len(computed_floors)
    budget = profile.max_num_batched_tokens
    step_floor = profile.prefill_fixed_s + profile.decode_step_s(1, 0)
    tail = [sum(profile.decode_step_s(1, prompt_tokens[x] + k)
                for k in range(1, first_segment_tokens[x])) for x in range(n)]
    full = (1 << n) - 1
    tokens = subset_sums(computed_floors)

    def response(x: int, mask: int, groups: int) -> float:
        steps = max(groups, math.ceil(tokens[mask] / budget))
        seconds = profile.prefill_per_token_s * tokens[mask] + steps * step_floor + tail[x]
        return max(latency_s + seconds, alone_s[x])

    # best[(mask, g)]: (summed utility, responses) of the tasks of `mask` in g groups.
    best: dict[tuple[int, int], tuple[float, dict[int, float]]] = {(0, 0): (0.0, {})}
    for g in range(n):
        layer = [(m, v) for (m, gg), v in best.items() if gg == g]
        for mask, (value, times) in layer:
            rest = full & ~mask
            group = rest
            while group:
                done = mask | group
                new_times = dict(times)
                total = value
                for x in range(n):
                    if group >> x & 1:
                        new_times[x] = response(x, done, g + 1)
                        total += utilities[x](new_times[x])
                key = (done, g + 1)
                if key not in best or total > best[key][0]:
                    best[key] = (total, new_times)
                group = (group - 1) & rest
    optional = refusable_mask(sheddable)
    value, times = max((v for (m, _), v in best.items() if (full & ~m) & ~optional == 0),
                       key=lambda v: v[0])
    return [times.get(x, math.nan) for x in range(n)], value
