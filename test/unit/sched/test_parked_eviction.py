"""The scheduler evicts parked (preserved) generations for an urgent admission (core/sched/
parked.py): only when the candidate can still make its deadline, only lower-class victims, the
one whose robot is back last first (LAMPS' waste), nothing when eviction cannot make room, and
the recompute of each evicted generation's resume is counted."""

from __future__ import annotations

import dataclasses

import pytest

from timelyllm_ros.core.engine.base import PRESERVE
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine

from fakes import TRACES, assert_no_leaks, drive, make, spec

DRONES = [k for k, t in TRACES.items() if t.skill_set == "drone"]


class SessionEngine(SimulatedEngine):
    """The simulated engine with the vLLM session engine's defaults: suspensions preserve, and
    (optionally) a parked generation keeps its slot. Records the scheduler's evictions."""

    def __init__(self, *args, hold_slots=False, **kw):
        super().__init__(*args, **kw)
        self.hold_slots = hold_slots
        self.evicted: list[str] = []

    def capabilities(self):
        return dataclasses.replace(super().capabilities(), default_pause_handling=PRESERVE,
                                   paused_hold_slots=self.hold_slots)

    def evict_paused(self, request_id, reason="scheduler"):
        held = super().evict_paused(request_id, reason)
        if held:
            self.evicted.append(request_id)
        return held


def _two_parked(total_blocks, urgent=True, hold_slots=False, max_num_seqs=256, **config):
    """a1 parks first and its robot is back soon; a2 parks later and is back much later; then
    b arrives. Returns (scheduler, engine, listener, b)."""
    profile = dataclasses.replace(EngineProfile(), kv_total_blocks=total_blocks,
                                  kv_block_size=16)
    eng = SessionEngine(profile, hold_slots=hold_slots, max_num_seqs=max_num_seqs)
    sch, eng, lis = make("timelyllm", engine=eng, resume_lead_s=0.1, **config)
    sch.submit(spec("a1", DRONES[0], eng))
    drive(sch, eng, lis, until=lambda s: "a1" in s.state.paused)
    eng.advance_idle(sch.tasks["a1"].robot_free_at(0.0) - 0.6)
    sch.submit(spec("a2", DRONES[1], eng))
    drive(sch, eng, lis, until=lambda s: "a2" in s.state.paused)
    b = sch.submit(spec("b", DRONES[2], eng, level="urgent" if urgent else "normal"))
    return sch, eng, lis, b


def _tight_kv():
    """KV blocks for which b is 2 blocks short while a1 and a2 are parked (each holds 2 blocks
    of its own; the system prompt's are shared): measured on a roomy engine."""
    sch, eng, _, b = _two_parked(1000)
    used = eng.kv_usage().total_blocks - eng.kv_usage().free_blocks
    return used + sch.admission.inputs.blocks_needed(b) - 2


def test_an_urgent_admission_evicts_the_parked_generation_whose_robot_is_back_last():
    sch, eng, lis, b = _two_parked(_tight_kv())
    assert {p.key for p in eng.paused_generations()} == {"a1#0", "a2#0"}
    drive(sch, eng, lis)
    # a2's robot is busy for ~1 s more than a1's: keeping a2 wastes more, so it goes first
    # (oldest-first, the engine's own fallback, would have taken a1).
    assert eng.evicted[0] == "a2#0"
    assert sch.evictions.by_reason == {"admission": sch.evictions.evictions}
    assert sch.evictions.evictions >= 1 and sch.evictions.evicted_tokens > 0
    # Each evicted generation resumed through the prefix cache and computed its tail again.
    assert sch.evictions.recomputed_tokens > 0
    assert b.response_time_s < 0.5
    assert all(t.state == "done" for t in sch.tasks.values())
    assert sch.state.evicted == {}
    assert_no_leaks(sch, eng)


def test_nothing_is_evicted_when_the_kv_is_not_short():
    sch, eng, lis, _ = _two_parked(1000)
    drive(sch, eng, lis)
    assert eng.evicted == [] and sch.evictions.evictions == 0
    assert_no_leaks(sch, eng)


def test_a_normal_admission_does_not_evict():
    sch, eng, lis, _ = _two_parked(_tight_kv(), urgent=False)
    sch.tick()
    assert eng.evicted == [] and sch.evictions.evictions == 0


def test_eviction_can_be_switched_off():
    sch, eng, lis, _ = _two_parked(_tight_kv(), evict_parked=False)
    sch.tick()
    assert eng.evicted == []


def test_the_plan_skips_victims_ranked_above_and_refuses_what_cannot_make_room():
    sch, eng, _, b = _two_parked(_tight_kv())
    now, free = eng.now(), eng.kv_usage().free_blocks
    assert sch.parked.eviction_plan("b", 2, 0, set(), now, free).task_ids == ("a2",)
    # a2 was refused earlier in this walk: it ranks above b and is no victim.
    assert sch.parked.eviction_plan("b", 2, 0, {"a2"}, now, free).task_ids == ("a1",)
    # Both together free 4 blocks: a plan for 5 would evict for nothing.
    assert sch.parked.eviction_plan("b", 5, 0, set(), now, free) is None
    assert sch.parked.eviction_plan("b", 0, 0, set(), now, free) is None


def test_a_hopeless_candidate_evicts_nothing():
    sch, eng, _, b = _two_parked(_tight_kv())
    eng.advance_idle(b.spec.arrival_s + b.spec.tuf.ert_s)  # its deadline has passed
    assert sch.parked.eviction_plan("b", 2, 0, set(), eng.now(), eng.kv_usage().free_blocks) is None


@pytest.mark.parametrize("hold_slots, evicts", [(True, True), (False, False)])
def test_parked_generations_holding_slots_are_evicted_for_a_slot(hold_slots, evicts):
    # Two slots, both taken by parked generations where the engine counts them (vLLM).
    sch, eng, lis, _ = _two_parked(1000, hold_slots=hold_slots, max_num_seqs=2)
    sch.tick()
    assert (eng.evicted == ["a2#0"]) is evicts
