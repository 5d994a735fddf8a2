"""The sequenced burst bound (bench/bound_sequenced.py): the grouped bound with the cost between
groups, checked against a brute force over its own formula and against the grouped bound."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.bench.bound import alone_latency_s
from timelyllm_ros.bench.bound_burst import grouped_responses, own_steps_floor_s
from timelyllm_ros.bench.bound_sequenced import sequenced_responses
from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.tuf import TUF


CONFIG = BenchConfig(prompt_tokens=None, baseline_prefix_cache=True)
POLICIES = ("vllm-stream", "vllm-priority", "timelyllm-wc", "timelyllm-pred")
TRACE_GROUPS = ((1, 2, 9), (3, 4, 10), (5, 6, 11))  # as test_bound_burst: one per run


def _brute_force(profile, latency, floors, prompts, tokens, alone, utilities, sheddable=None):
    """The module docstring's bound by enumeration: every vector of the steps S_i at which the
    prompts complete (up to a horizon no useful schedule passes; None: a sheddable task
    refused, utility 0, no prompt), each answer at R_x = S_x + g_x - 1, the budget respected
    at every prompt completion."""
    n, budget = len(floors), profile.max_num_batched_tokens
    d0 = profile.decode_step_s(1, 0)
    horizon = sum(math.ceil(m / budget) for m in floors) + sum(tokens) + n
    own_ctx = [own_steps_floor_s(profile, p, m, g)
               - (max(0, math.ceil(m / budget) - 1) + g) * d0
               for p, m, g in zip(prompts, floors, tokens)]
    choices = [[None] * bool(sheddable and sheddable[x]) + list(range(1, horizon + 1))
               for x in range(n)]
    best = -math.inf
    for steps in itertools.product(*choices):
        if any(t is not None and sum(m for m, u in zip(floors, steps)
                                     if u is not None and u <= t) > budget * t for t in steps):
            continue
        total = 0.0
        for x in range(n):
            if steps[x] is None:
                continue
            answer = steps[x] + tokens[x] - 1
            done = [i for i in range(n) if steps[i] is not None and steps[i] <= answer]
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
                          st.sampled_from([0.15, 0.3, 1.0]), st.sampled_from([2.0, 20.0]),
                          st.booleans()),
                min_size=1, max_size=3),
       st.sampled_from([256, 1024, 8192]), st.floats(0.0, 0.05))
def test_the_search_finds_the_best_choice_of_prompt_steps(tasks, budget, latency):
    profile = dataclasses.replace(EngineProfile(), max_num_batched_tokens=budget)
    floors = [m for m, *_ in tasks]
    prompts = [m + c for m, c, *_ in tasks]
    tokens = [g for _, _, g, *_ in tasks]
    tufs = [TUF(ert_s=ert, initial_utility=2.0, slope_per_s=k) for *_, ert, k, _ in tasks]
    sheddable = [shed for *_, shed in tasks]
    alone, utilities = _burst(profile, prompts, floors, tokens, tufs, latency)
    responses, value = sequenced_responses(profile, latency, floors, prompts, tokens, alone,
                                           utilities, sheddable)
    assert value == pytest.approx(_brute_force(profile, latency, floors, prompts, tokens, alone,
                                               utilities, sheddable), abs=1e-9)
    assert value == pytest.approx(sum(0.0 if math.isnan(r) else u(r)
                                      for u, r in zip(utilities, responses)), abs=1e-12)
    assert all(r >= a for r, a in zip(responses, alone) if not math.isnan(r))
    assert all(shed for r, shed in zip(responses, sheddable) if math.isnan(r))
    # Never above the grouped bound, which leaves out the cost between groups.
    _, grouped = grouped_responses(profile, latency, floors, prompts, tokens, alone, utilities,
                                   sheddable)
    assert value <= grouped + 1e-9


def test_a_task_past_hope_is_refused_when_that_lets_another_answer_in_time():
    """Two urgent drones with long prompts on a slow engine: serving both leaves the second past
    its TUF's cut-off (negative utility); the bench sheds such a task at its cut-off (0 at
    most) and serves the other alone. Every bound counts that refusal, where it may."""
    from timelyllm_ros.bench.bound_burst import best_assignment, completion_floors_s
    profile = dataclasses.replace(EngineProfile(), prefill_per_token_s=1e-3)
    prompts = floors = [300, 300]
    tokens = [4, 4]
    tufs = [TUF(ert_s=0.35, initial_utility=2.0, slope_per_s=20.0)] * 2
    alone, utilities = _burst(profile, prompts, floors, tokens, tufs)
    assert all(tufs[0].utility(a) > 0 for a in alone)
    slots = completion_floors_s(profile, prompts, floors, tokens)
    served = best_assignment(alone, slots, utilities)
    assert min(u(r) for u, r in zip(utilities, served)) < 0  # both answered: one past hope
    refused = best_assignment(alone, slots, utilities, [True, True])
    assert sum(math.isnan(r) for r in refused) == 1
    for bound in (grouped_responses, sequenced_responses):
        with_refusal = bound(profile, 0.0, floors, prompts, tokens, alone, utilities,
                             [True, True])
        without = bound(profile, 0.0, floors, prompts, tokens, alone, utilities)
        assert with_refusal[1] > without[1]
        assert sum(math.isnan(r) for r in with_refusal[0]) == 1
        assert with_refusal[1] == pytest.approx(max(u(a) for u, a in zip(utilities, alone)))


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


def _close_events(seed: int):
    """Runs of 2-3 small events released 20-200 ms apart (each may still be answering when the
    next comes), the runs far apart; drone and arm traces, urgent and normal."""
    from timelyllm_ros.lrtrace.workload import Event, TaskSpec
    rng = np.random.default_rng(seed)
    events, task, event_id = [], 0, 0
    for run in range(3):
        time_s = 1.0 + 6.0 * run
        for _ in range(int(rng.integers(2, 4))):
            specs = []
            for k in range(int(rng.integers(1, 3))):
                specs.append(TaskSpec(task, f"robot_{task + 1}",
                                      int(rng.choice(TRACE_GROUPS[run])),
                                      str(rng.choice(["urgent", "normal"])),
                                      context=" ".join(f"c{task}w{n}" for n in
                                                       range(int(rng.integers(0, 400))))))
                task += 1
            events.append(Event(time_s, event_id, tuple(specs)))
            event_id += 1
            time_s += float(rng.uniform(0.02, 0.2))
    return events


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_events_released_close_together_stay_under_the_bound(seed):
    """The validity check for runs of overlapping events: every policy's replay, and the best
    schedule found by search for each run, gets at most the bound's summed utility over the
    run; and bounding a run together is lower than its events apart somewhere."""
    from timelyllm_ros.bench.bound import upper_bound
    from timelyllm_ros.bench.burst_search import event_tasks, search
    from timelyllm_ros.bench.replay import run_policy
    from timelyllm_ros.lrtrace.workload import load_workload

    workload = load_workload("WID1")
    events = _close_events(seed)
    bound = {b.task_id: b for b in upper_bound(events, workload, CONFIG)}
    runs = {}
    for event in events:
        runs.setdefault(round((event.time_s - 1.0) / 6.0), []).append(event)
    for policy in POLICIES:
        got = {t.task_id: t for t in run_policy(events, policy, workload, CONFIG).tasks}
        for run in runs.values():
            ids = [f"t{s.task_id:05d}" for e in run for s in e.tasks]
            assert sum(got[i].utility for i in ids) <= \
                sum(bound[i].utility for i in ids) + 1e-9, (policy, seed)
    for run in runs.values():
        ids = [f"t{s.task_id:05d}" for e in run for s in e.tasks]
        found = search(event_tasks(run, events, workload, CONFIG, earlier=False))
        assert found.complete
        assert found.utility <= sum(bound[i].utility for i in ids) + 1e-9, seed


def test_a_run_of_overlapping_events_is_bounded_together():
    """Family seed 1 member 6, events 16 and 17: bounded apart each keeps its alone bound
    (4.449 over both); together 3.694, above the best schedule found for them (3.392)."""
    from timelyllm_ros.bench.bound import upper_bound
    from timelyllm_ros.bench.burst_search import event_tasks, search
    from timelyllm_ros.bench.family import draw_member
    from timelyllm_ros.lrtrace.workload import compose

    member = draw_member(1, 6)
    events = compose(member.workload)
    config = dataclasses.replace(BenchConfig(), profile=member.profile)
    run = [e for e in events if e.event_id in (16, 17)]
    bound = {b.task_id: b for b in upper_bound(events, member.workload, config)}
    ids = [f"t{s.task_id:05d}" for e in run for s in e.tasks]
    together = sum(bound[i].utility for i in ids)
    assert sum(bound[i].alone_utility for i in ids) == pytest.approx(4.449, abs=5e-4)
    found = search(event_tasks(run, events, member.workload, config))
    assert found.utility <= together + 1e-9
    assert together == pytest.approx(3.694, abs=5e-4)


def test_a_search_past_its_state_limit_gives_up_and_the_other_bounds_stand(monkeypatch):
    """Six near-identical urgent prompts take the search thousands of states; with a limit of
    100 it gives up (NaN, an infinite sum) and bench/bound.py keeps the slot and grouped
    bounds, which stay finite."""
    from timelyllm_ros.bench import bound_sequenced
    profile = EngineProfile()
    prompts = [1500 + 37 * i for i in range(6)]
    tokens = [10] * 6
    tufs = [TUF(ert_s=0.2, initial_utility=2.0, slope_per_s=20.0)] * 6
    alone, utilities = _burst(profile, prompts, prompts, tokens, tufs)
    full = sequenced_responses(profile, 0.0, prompts, prompts, tokens, alone, utilities)
    assert math.isfinite(full[1])
    monkeypatch.setattr(bound_sequenced, "SEQUENCED_MAX_STATES", 100)
    responses, value = sequenced_responses(profile, 0.0, prompts, prompts, tokens, alone,
                                           utilities)
    assert value == math.inf and all(math.isnan(r) for r in responses)
    _, grouped = grouped_responses(profile, 0.0, prompts, prompts, tokens, alone, utilities)
    assert math.isfinite(grouped) and grouped >= full[1] - 1e-9
