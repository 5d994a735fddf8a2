"""The sequenced burst bound (bench/bound_sequenced.py): the grouped bound with the cost between
groups, checked against a brute force over its own formula and against the grouped bound."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.bench.bound import alone_latency_s
from timelyllm_ros.bench.bound_burst import grouped_responses, own_steps_floor_s
from timelyllm_ros.bench.bound_sequenced import sequenced_responses
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.tuf import TUF


def _brute_force(profile, latency, floors, prompts, tokens, alone, utilities):
    """The module docstring's bound by enumeration: every vector of the steps S_i at which the
    prompts complete (up to a horizon no useful schedule passes), each answer at
    R_x = S_x + g_x - 1, the budget respected at every prompt completion."""
    n, budget = len(floors), profile.max_num_batched_tokens
    d0 = profile.decode_step_s(1, 0)
    horizon = sum(math.ceil(m / budget) for m in floors) + sum(tokens) + n
    own_ctx = [own_steps_floor_s(profile, p, m, g)
               - (max(0, math.ceil(m / budget) - 1) + g) * d0
               for p, m, g in zip(prompts, floors, tokens)]
    best = -math.inf
    for steps in itertools.product(range(1, horizon + 1), repeat=n):
        if any(sum(m for m, t in zip(floors, steps) if t <= s) > budget * s for s in steps):
            continue
        total = 0.0
        for x in range(n):
            answer = steps[x] + tokens[x] - 1
            done = [i for i in range(n) if steps[i] <= answer]
            m = sum(floors[i] for i in done)
            prefill_steps = max(len({steps[i] for i in done}), math.ceil(m / budget))
            t = (latency + answer * d0 + profile.prefill_per_token_s * m
                 + profile.prefill_fixed_s * prefill_steps + own_ctx[x])
            total += utilities[x](max(t, alone[x]))
        best = max(best, total)
    return best


def _burst(profile, prompts, floors, tokens, tufs, latency=0.0):
    alone = [latency + alone_latency_s(profile, p, p - m, g)
             for p, m, g in zip(prompts, floors, tokens)]
    return alone, [t.utility for t in tufs]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1500), st.integers(0, 800), st.integers(1, 4),
                          st.sampled_from([0.15, 0.3, 1.0]), st.sampled_from([2.0, 20.0])),
                min_size=1, max_size=3),
       st.sampled_from([256, 1024, 8192]), st.floats(0.0, 0.05))
def test_the_search_finds_the_best_choice_of_prompt_steps(tasks, budget, latency):
    profile = dataclasses.replace(EngineProfile(), max_num_batched_tokens=budget)
    floors = [m for m, *_ in tasks]
    prompts = [m + c for m, c, *_ in tasks]
    tokens = [g for _, _, g, *_ in tasks]
    tufs = [TUF(ert_s=ert, initial_utility=2.0, slope_per_s=k) for *_, ert, k in tasks]
    alone, utilities = _burst(profile, prompts, floors, tokens, tufs, latency)
    responses, value = sequenced_responses(profile, latency, floors, prompts, tokens, alone,
                                           utilities)
    assert value == pytest.approx(_brute_force(profile, latency, floors, prompts, tokens, alone,
                                               utilities), abs=1e-9)
    assert value == pytest.approx(sum(u(r) for u, r in zip(utilities, responses)), abs=1e-12)
    assert all(r >= a for r, a in zip(responses, alone))
    # Never above the grouped bound, which leaves out the cost between groups.
    _, grouped = grouped_responses(profile, latency, floors, prompts, tokens, alone, utilities)
    assert value <= grouped + 1e-9


def test_a_prompt_between_groups_is_paid_by_one_side():
    """Three urgent drones, 800-token prompts, 4-token first segments. The grouped bound answers
    two of them together and the third one step later, as if its prompt shared no step with the
    first two's first segments and as if their segments took no steps. A schedule either makes
    the first two pay the third's prompt or starts it after their segments."""
    profile = EngineProfile()
    prompts = floors = [800, 800, 800]
    tokens = [4, 4, 4]
    urgent = [TUF(ert_s=0.2, initial_utility=2.0, slope_per_s=20.0)] * 3
    alone, utilities = _burst(profile, prompts, floors, tokens, urgent)
    _, grouped = grouped_responses(profile, 0.0, floors, prompts, tokens, alone, utilities)
    responses, value = sequenced_responses(profile, 0.0, floors, prompts, tokens, alone,
                                           utilities)
    assert value < grouped - 0.05
    d0 = profile.decode_step_s(1, 0)
    ppt, fixed = profile.prefill_per_token_s, profile.prefill_fixed_s
    ctx = [own_steps_floor_s(profile, 800, 800, 4) - 4 * d0] * 3
    # Every way of sequencing the three by hand: all together (one step, then 3 more); one
    # then two (after its answer, or while it still decodes) and two then one, alike.
    together = [ppt * 2400 + fixed + 4 * d0 + ctx[0]] * 3
    candidates = [together]
    for first, later in ((1, 2), (2, 1)):
        # The later group completes right after the first one's answer (step 5)...
        a = ppt * 800 * first + fixed + 4 * d0 + ctx[0]
        b = ppt * 2400 + 2 * fixed + 8 * d0 + ctx[0]
        candidates.append([a] * first + [b] * later)
        # ...or while it decodes, at step s in 2..4: the first group pays its prompt.
        for s in range(2, 5):
            a = ppt * 2400 + 2 * fixed + 4 * d0 + ctx[0]
            b = ppt * 2400 + 2 * fixed + (s + 3) * d0 + ctx[0]
            candidates.append([a] * first + [b] * later)
    by_hand = max(sum(u(max(t, al)) for u, t, al in zip(utilities, times, alone))
                  for times in candidates)
    assert value >= by_hand - 1e-12  # (three groups of one are searched too)
    assert value == pytest.approx(_brute_force(profile, 0.0, floors, prompts, tokens, alone,
                                               utilities), abs=1e-9)
    assert by_hand < grouped - 0.05  # each way by hand is already below the grouped bound


def test_one_task_is_its_alone_bound_and_bad_input_is_refused():
    profile = EngineProfile()
    tuf = TUF(ert_s=0.2, initial_utility=2.0, slope_per_s=20.0)
    alone, utilities = _burst(profile, [900], [500], [4], [tuf], latency=0.01)
    (response,), value = sequenced_responses(profile, 0.01, [500], [900], [4], alone, utilities)
    assert response == pytest.approx(alone[0], abs=1e-12)
    with pytest.raises(ValueError, match="as many prompts"):
        sequenced_responses(profile, 0.0, [500, 10], [900], [4], alone, utilities)
    with pytest.raises(ValueError, match=">= 1 token"):
        sequenced_responses(profile, 0.0, [500], [900], [0], alone, utilities)
