"""The best schedule found by search for a burst (bench/burst_search.py)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from timelyllm_ros.bench.burst_search import (BurstEvent, BurstTask, relaxed, replay_on_engine,
                                              search, simulate)
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.tuf import TUF

URGENT = TUF(ert_s=0.2, initial_utility=2.0, slope_per_s=6.67)
NORMAL = TUF(ert_s=1.0, initial_utility=1.0, slope_per_s=2.0)
TOKENIZER = SimulatedEngine().tokenizer
PLAN = "takeoff(); fly_to(3, 4); land(); report('done')"
SHARED = list(range(1000, 1400))  # a skill set's shared prompt (warm in the prefix cache)


def _burst(rng: np.random.Generator, n: int, budget: int = 8192,
           releases: bool = False) -> BurstEvent:
    """n tasks: the shared prompt, then each its own tokens (some a copy of another's prefix,
    so the prefix cache can serve one from another); urgent and normal TUFs."""
    profile = dataclasses.replace(EngineProfile(), max_num_batched_tokens=budget)
    script = tuple(TOKENIZER.tokenize(PLAN))
    tasks, own = [], []
    for i in range(n):
        tail = list(rng.integers(5000, 9000, size=int(rng.integers(50, 900))))
        if own and rng.random() < 0.3:
            tail = own[int(rng.integers(0, len(own)))][:int(rng.integers(16, 200))] + tail
        own.append(tail)
        tasks.append(BurstTask(f"t{i}", tuple(SHARED + tail), PLAN, script,
                               int(rng.integers(2, 7)), URGENT if rng.random() < 0.6 else NORMAL,
                               release_s=float(rng.uniform(0, 0.2)) if releases and i else 0.0))
    return BurstEvent(profile, 0.008, tuple(tasks), ((tuple(SHARED), None),))


def _utility(event: BurstEvent, responses) -> float:
    return sum(t.tuf.utility(r) for t, r in zip(event.tasks, responses))


@pytest.mark.parametrize("seed, budget, releases", [(0, 8192, False), (1, 512, False),
                                                    (2, 8192, True), (3, 700, True)])
def test_the_re_implemented_step_is_the_engines(seed, budget, releases):
    """`simulate` and the real simulated engine give every task the same response, chunked
    prefill, prefix hits between the burst's prompts and later releases included."""
    rng = np.random.default_rng(seed)
    event = _burst(rng, 4, budget, releases)
    for _ in range(12):
        schedule = [int(x) for x in rng.integers(0, 9, size=4)]
        assert simulate(event, schedule) == pytest.approx(replay_on_engine(event, schedule),
                                                          abs=1e-9)


def test_a_later_prompt_hits_the_blocks_an_earlier_one_computed():
    """The second prompt extends the first: added after the first's prompt is computed, it
    computes only the rest (whole blocks); a prompt as long that shares nothing computes all."""
    rng = np.random.default_rng(5)
    event = _burst(rng, 2)
    first = list(event.tasks[0].prompt)
    extends = tuple(first + list(rng.integers(5000, 9000, size=300)))
    apart = tuple(SHARED + list(rng.integers(10000, 12000, size=len(extends) - len(SHARED))))
    times = {}
    for name, prompt in (("extends", extends), ("apart", apart)):
        burst = dataclasses.replace(event, tasks=(
            event.tasks[0], dataclasses.replace(event.tasks[1], prompt=prompt)))
        times[name] = simulate(burst, [0, 6])[1]
        assert times[name] == pytest.approx(replay_on_engine(burst, [0, 6])[1], abs=1e-9)
    hit = (len(first) - len(SHARED)) // 16 * 16  # whole blocks past the shared prompt
    assert times["apart"] - times["extends"] == pytest.approx(
        EngineProfile().prefill_per_token_s * hit, rel=0.05)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_search_finds_the_best_schedule_of_a_brute_force_sweep(seed):
    """Exhaustive: no schedule of a sweep over every task's step 0..7 beats it, and its figure
    is what its schedule gets."""
    rng = np.random.default_rng(10 + seed)
    event = _burst(rng, 3, releases=seed == 2)
    found = search(event)
    assert found.complete
    swept = max(_utility(event, simulate(event, s))
                for s in itertools.product(range(8), repeat=3))
    assert found.utility >= swept - 1e-9
    assert found.utility == pytest.approx(_utility(event, simulate(event, found.schedule)))
    assert list(found.responses) == pytest.approx(replay_on_engine(event, found.schedule))


def test_splitting_urgent_prompts_can_beat_serving_them_together():
    """Three urgent prompts of ~600-800 tokens: the best schedule serves two first and the
    third after their first segments, above all of them at once."""
    script = tuple(TOKENIZER.tokenize(PLAN))
    tasks = tuple(BurstTask(f"t{i}", tuple(SHARED + list(range(20000 * (i + 1),
                                                               20000 * (i + 1) + n))),
                            PLAN, script, 4, URGENT) for i, n in enumerate([435, 686, 818]))
    event = BurstEvent(EngineProfile(), 0.008, tasks, ((tuple(SHARED), None),))
    found = search(event)
    together = _utility(event, simulate(event, [0, 0, 0]))
    assert found.utility > together + 0.3
    assert sorted(found.schedule) == [0, 0, 4]


def test_the_relaxed_engine_gets_at_least_the_real_best():
    rng = np.random.default_rng(7)
    event = _burst(rng, 4)
    assert search(relaxed(event)).utility >= search(event).utility - 1e-9


def test_a_node_limit_stops_the_search_and_says_so():
    event = _burst(np.random.default_rng(8), 5)
    found = search(event, node_limit=3)
    assert not found.complete
    assert found.utility == pytest.approx(_utility(event, simulate(event, found.schedule)))


def test_family_seed_1_member_39_event_0_the_figures_docs_family_md_quotes():
    """Six drone tasks at once on the RTX 4090 profile: the burst bound 7.557 (7.986 before the
    sequenced bound), the best schedule found 7.520 (two urgent prompts, then the third, then the
    normal ones); the relaxed search, on an engine that charges nothing per sequence or context
    token, 7.597: above the bound, which charges each step a sequence."""
    from timelyllm_ros.bench.bound import upper_bound
    from timelyllm_ros.bench.burst_search import event_tasks
    from timelyllm_ros.bench.config import BenchConfig
    from timelyllm_ros.bench.family import draw_member
    from timelyllm_ros.lrtrace.workload import compose

    member = draw_member(1, 39)
    events = compose(member.workload)
    config = dataclasses.replace(BenchConfig(), profile=member.profile)
    event = next(e for e in events if e.event_id == 0)
    burst = event_tasks([event], events, member.workload, config)
    bound = {b.task_id: b for b in upper_bound(events, member.workload, config)}
    found = search(burst)
    assert found.complete and found.utility == pytest.approx(7.520, abs=5e-4)
    assert sum(bound[t.task_id].utility for t in burst.tasks) == pytest.approx(7.557, abs=5e-4)
    assert search(relaxed(burst)).utility == pytest.approx(7.597, abs=5e-4)
