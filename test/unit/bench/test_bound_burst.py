"""The burst bound (bench/bound_burst.py, used by bench/bound.py): tasks released together."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.bench.bound import alone_latency_s, upper_bound
from timelyllm_ros.bench.burst_search import event_tasks, search
from timelyllm_ros.bench.bound_burst import (best_assignment, completion_floors_s,
                                             grouped_responses, own_steps_floor_s,
                                             prefill_floors)
from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.tuf import TUF
from timelyllm_ros.lrtrace.workload import Event, TaskSpec, load_workload

CONFIG = BenchConfig(prompt_tokens=None, baseline_prefix_cache=True)
POLICIES = ("vllm-stream", "vllm-priority", "timelyllm-wc", "timelyllm-pred")
# Each event of a replay draws from its own traces: an instruction served in an earlier event
# stays in the prefix cache and can save a later task a few ms (the alone bound's exception).
TRACE_GROUPS = ((1, 2, 9), (3, 4, 10), (5, 6, 11))


def _context(tag: str, words: int) -> str:
    """A task's own context: `words` words no other tag's context starts with."""
    return "".join(f" {tag}w{n}" for n in range(words))


def test_one_task_events_keep_the_alone_bound():
    workload = load_workload("WID1")
    events = [Event(1.0 + 4 * n, n, (TaskSpec(n, "robot_1", trace, level,
                                              context=_context(f"e{n}", 40 * n)),))
              for n, (trace, level) in enumerate([(1, "urgent"), (6, "normal"), (9, "urgent")])]
    for task in upper_bound(events, workload, CONFIG):
        assert task.response_time_s == task.alone_response_time_s
        assert task.utility == task.alone_utility


@pytest.mark.parametrize("prompt, cached, tokens, budget", [
    (900, 400, 4, 8192), (5000, 0, 3, 2048), (700, 16, 9, 256)])
def test_a_lone_tasks_floor_is_at_most_its_alone_latency(prompt, cached, tokens, budget):
    """c_j1 is the alone latency when the prompt fits one step, and never above it."""
    profile = dataclasses.replace(EngineProfile(), max_num_batched_tokens=budget)
    (floor,), = completion_floors_s(profile, [prompt], [prompt - cached], [tokens])
    alone = alone_latency_s(profile, prompt, cached, tokens)
    assert floor <= alone + 1e-12
    if prompt - cached <= budget:
        assert floor == pytest.approx(alone, abs=1e-12)


def test_shared_prompts_of_one_event_lower_the_prefill_floor():
    block = 16
    base = list(range(100, 400))
    prompts = [base + [1, 2, 3], base + [1, 2, 3], base[:200] + [7] * 50, list(range(900, 950))]
    floors = prefill_floors(prompts, [0, 0, 0, 0], block)
    # Two identical prompts: either may hit all but the last token of the other, in blocks.
    assert floors[0] == floors[1] == len(prompts[0]) - (len(prompts[0]) - 1) // block * block
    assert floors[2] == len(prompts[2]) - 200 // block * block
    assert floors[3] == 50  # shares nothing
    # A prompt that is a proper prefix of another may hand it everything but its last token.
    assert prefill_floors([base, base + [5] * 40], [0, 0], block)[1] == \
        len(base) + 40 - (len(base) + 39) // block * block


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6000), st.integers(0, 3000), st.integers(1, 30),
                          st.sampled_from([0.2, 1.0, 5.0])), min_size=1, max_size=6),
       st.sampled_from([256, 2048, 8192]), st.floats(0.0, 0.2))
def test_the_burst_bound_never_exceeds_the_alone_bound(tasks, budget, latency):
    profile = dataclasses.replace(EngineProfile(), max_num_batched_tokens=budget)
    prompts = [u + c for u, c, _, _ in tasks]
    cached = [min(c, p - 1) for (_, c, _, _), p in zip(tasks, prompts)]
    floors = [p - c for p, c in zip(prompts, cached)]
    tokens = [g for _, _, g, _ in tasks]
    tufs = [TUF(ert_s=ert, initial_utility=1.0, slope_per_s=0.5)
            for *_, ert in tasks]
    alone = [latency + alone_latency_s(profile, p, c, g)
             for p, c, g in zip(prompts, cached, tokens)]
    slots = latency + completion_floors_s(profile, prompts, floors, tokens)
    assert np.all(np.diff(slots, axis=1) >= -1e-15)  # a later slot is never sooner
    responses = best_assignment(alone, slots, [t.utility for t in tufs])
    for response, a, tuf in zip(responses, alone, tufs):
        assert response >= a
        assert tuf.utility(response) <= tuf.utility(a)
    grouped, total = grouped_responses(profile, latency, floors, prompts, tokens, alone,
                                       [t.utility for t in tufs])
    assert total == pytest.approx(sum(t.utility(r) for t, r in zip(tufs, grouped)))
    assert all(r >= a for r, a in zip(grouped, alone))
    # Each task in its own slot: the responses are a permutation's entries of the slots.
    taken = sorted(int(np.argmin(np.abs(slots[i] - r))) for i, r in enumerate(responses)
                   if r > alone[i])
    assert len(taken) == len(set(taken))


def _event(rng: np.random.Generator, event_id: int, time_s: float, first_task: int) -> Event:
    """2-5 drone and arm tasks released together (traces of TRACE_GROUPS[event_id]), each with
    its own context (0-600 words), one of them sometimes a copy of another's prompt (the prefix
    cache can serve it)."""
    n = int(rng.integers(2, 6))
    specs = []
    for k in range(n):
        if k and rng.random() < 0.3:
            twin = specs[int(rng.integers(0, k))]
            specs.append(dataclasses.replace(twin, task_id=first_task + k,
                                             robot_id=f"robot_{k + 1}"))
            continue
        specs.append(TaskSpec(first_task + k, f"robot_{k + 1}",
                              int(rng.choice(TRACE_GROUPS[event_id])),
                              str(rng.choice(["urgent", "normal"])),
                              context=_context(f"t{first_task + k}", int(rng.integers(0, 600)))))
    return Event(time_s, event_id, tuple(specs))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_no_policy_beats_the_burst_bound_in_a_replay(seed):
    """The validity check: small bursts replayed on the simulated engine; in each event the
    tasks' summed utility under every policy is at most the burst bound's."""
    workload = load_workload("WID1")
    rng = np.random.default_rng(seed)
    events, first = [], 0
    for n in range(3):  # far apart: an event finds the engine idle
        events.append(_event(rng, n, 1.0 + 6.0 * n, first))
        first += len(events[-1].tasks)
    bound = {b.task_id: b for b in upper_bound(events, workload, CONFIG)}
    tightened = 0
    for event in events:
        ids = [f"t{s.task_id:05d}" for s in event.tasks]
        tightened += sum(bound[i].response_time_s > bound[i].alone_response_time_s for i in ids)
    assert tightened  # the bursts are tight enough for the burst bound to matter
    for policy in POLICIES:
        got = {t.task_id: t for t in run_policy(events, policy, workload, CONFIG).tasks}
        for event in events:
            ids = [f"t{s.task_id:05d}" for s in event.tasks]
            achieved = sum(got[i].utility for i in ids)
            assert achieved <= sum(bound[i].utility for i in ids) + 1e-9, (policy, event)
            if len(set(event.tasks)) == len({(s.trace_id, s.context) for s in event.tasks}):
                # Distinct prompts: below the alone bound (with copies the alone bound
                # overstates a copy's prefill and can be beaten).
                assert sum(bound[i].utility for i in ids) <= \
                    sum(bound[i].alone_utility for i in ids) + 1e-12


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_best_schedule_found_by_search_stays_under_the_burst_bound(seed):
    """The validity check against the best schedule of each burst (bench/burst_search.py: an
    exhaustive search over when each task joins the engine), not only the policies' ones."""
    workload = load_workload("WID1")
    rng = np.random.default_rng(seed)
    events, first = [], 0
    for n in range(3):
        events.append(_event(rng, n, 1.0 + 6.0 * n, first))
        first += len(events[-1].tasks)
    bound = {b.task_id: b for b in upper_bound(events, workload, CONFIG)}
    for event in events:
        burst = event_tasks([event], events, workload, CONFIG, earlier=False)
        found = search(burst)
        assert found.complete
        assert found.utility <= sum(bound[t.task_id].utility for t in burst.tasks) + 1e-9


def test_the_assignment_beats_a_greedy_order():
    """Serving the shortest prompt first (a greedy order) leaves the urgent long one late;
    the assignment puts the urgent task first and the patient one second."""
    profile = EngineProfile()
    prompts, tokens = [3000, 400], [4, 4]
    urgent = TUF(ert_s=0.40, initial_utility=2.0, slope_per_s=20.0)
    patient = TUF(ert_s=5.0, initial_utility=1.0, slope_per_s=0.1)
    alone = [alone_latency_s(profile, p, 0, g) for p, g in zip(prompts, tokens)]
    slots = completion_floors_s(profile, prompts, prompts, tokens)
    utilities = [urgent.utility, patient.utility]
    best = best_assignment(alone, slots, utilities)
    greedy = [max(slots[0, 1], alone[0]), max(slots[1, 0], alone[1])]  # short prompt first
    best_u = sum(u(r) for u, r in zip(utilities, best))
    greedy_u = sum(u(r) for u, r in zip(utilities, greedy))
    assert best_u > greedy_u + 0.1
    assert best[0] == pytest.approx(alone[0]) and best[1] > alone[1]


def test_a_tasks_own_steps_hold_its_growing_context():
    profile = EngineProfile()
    one = own_steps_floor_s(profile, 1000, 600, 1)
    assert one == pytest.approx(profile.decode_step_s(1, 1000))
    assert own_steps_floor_s(profile, 1000, 600, 3) == pytest.approx(
        sum(profile.decode_step_s(1, 1000 + n) for n in range(3)))
    chunked = dataclasses.replace(profile, max_num_batched_tokens=256)
    # 600 computed tokens need 3 steps of 256: two partial ones before the completing one.
    assert own_steps_floor_s(chunked, 1000, 600, 1) == pytest.approx(
        profile.decode_step_s(1, 1000) + profile.decode_step_s(1, 744)
        + profile.decode_step_s(1, 488))
    assert math.isfinite(own_steps_floor_s(chunked, 10, 10, 1))


def test_grouping_charges_what_separate_slots_share():
    """Two prompts: the slot bound lets the first answer alone and the second after both
    prompts in one step's worth of fixed costs; no schedule does both, and the grouped bound,
    which takes each task's group as a whole, is lower."""
    profile = EngineProfile()
    prompts, tokens = [800, 800], [4, 4]
    urgent = [TUF(ert_s=0.2, initial_utility=2.0, slope_per_s=20.0)] * 2
    alone = [alone_latency_s(profile, p, 0, g) for p, g in zip(prompts, tokens)]
    utilities = [t.utility for t in urgent]
    slots = completion_floors_s(profile, prompts, prompts, tokens)
    by_slot = sum(u(r) for u, r in zip(utilities, best_assignment(alone, slots, utilities)))
    grouped, by_group = grouped_responses(profile, 0.0, prompts, prompts, tokens, alone,
                                          utilities)
    assert by_group < by_slot - 0.05
    # The best grouping: one prompt alone first, the other in the next step, which pays its
    # own fixed prefill and decode costs on top of both prompts' tokens.
    first, second = sorted(grouped)
    assert first == pytest.approx(alone[0])
    assert second == pytest.approx(
        profile.prefill_per_token_s * 1600 + 2 * (profile.prefill_fixed_s
                                                  + profile.decode_step_s(1, 0))
        + sum(profile.decode_step_s(1, 800 + k) for k in range(1, 4)))
