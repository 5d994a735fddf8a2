"""The simulated fleet (core/engine/sim/fleet.py): replicas that step in parallel in virtual
time behind the replica router's placement."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from fakes import assert_no_leaks, drive, make, spec
from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.replicas import affinity_key
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.engine.sim.fleet import SimulatedFleet, simulated_fleet

WORDS = "go up left right down hover land take photo scan"


def _request(i: int, prompt: int, tokens: int) -> EngineRequest:
    # Distinct prompts: no replica finds another's prefix in its cache.
    ids = [100_000 + i * 10_000 + k for k in range(prompt)]
    text = " ".join(WORDS.split()[k % 10] for k in range(tokens))
    return EngineRequest(f"task{i}#0", ids, max_tokens=tokens, scripted_text=text)


def _run_to_end(engine, requests) -> list[tuple[float, str, bool]]:
    for r in requests:
        engine.add_request(r)
    seen = []
    while engine.has_unfinished_requests():
        before = engine.now()
        for out in engine.step():
            seen.append((engine.now(), out.request_id, out.finished))
        assert engine.now() >= before
    return seen


def test_one_replica_is_the_engine_alone_step_by_step():
    requests = [_request(i, 300 + 50 * i, 5 + i) for i in range(6)]
    alone = _run_to_end(SimulatedEngine(), requests)
    fleet = SimulatedFleet(lambda _i: SimulatedEngine(), 1)
    assert _run_to_end(fleet, requests) == alone


@settings(max_examples=15, deadline=None)
@given(per_replica=st.integers(1, 6), replicas=st.integers(2, 4),
       prompt=st.integers(16, 600), tokens=st.integers(1, 30))
def test_replicas_with_a_share_each_finish_as_fast_as_one_with_that_share(
        per_replica, replicas, prompt, tokens):
    """Steps overlap: R replicas with k identical requests each end when one replica with k
    ends, not R times later (which stepping them one after another on one clock would give)."""
    one = SimulatedEngine()
    _run_to_end(one, [_request(i, prompt, tokens) for i in range(per_replica)])
    fleet = SimulatedFleet(lambda _i: SimulatedEngine(), replicas)
    _run_to_end(fleet, [_request(i, prompt, tokens) for i in range(per_replica * replicas)])
    assert fleet.now() == one.now()
    assert sorted(fleet.stats.placed.values()) == [per_replica] * replicas


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.5), st.integers(16, 3000), st.integers(1, 40),
                          st.booleans()), min_size=1, max_size=25),
       st.integers(1, 5))
def test_the_common_clock_never_goes_back_and_outputs_come_in_time_order(arrivals, replicas):
    """Requests arrive at random times (the fleet idles up to each), some are aborted while
    their replica has a step in flight: the clock is monotonic, every kept request finishes,
    and no aborted request's output is ever released."""
    fleet = SimulatedFleet(lambda _i: SimulatedEngine(), replicas)
    pending = sorted(((fleet.now() + gap * (i + 1), i, prompt, tokens, abort)
                      for i, (gap, prompt, tokens, abort) in enumerate(arrivals)))
    aborted: set[str] = set()
    finished: set[str] = set()
    last = fleet.now()
    while pending or fleet.has_unfinished_requests():
        while pending and pending[0][0] <= fleet.now():
            _, i, prompt, tokens, abort = pending.pop(0)
            fleet.add_request(_request(i, prompt, tokens))
            if abort:  # its replica may be mid-step: the output it computes must not come out
                fleet.abort_request(f"task{i}#0")
                aborted.add(f"task{i}#0")
        if fleet.has_unfinished_requests():
            for out in fleet.step():
                assert out.request_id not in aborted
                if out.finished:
                    finished.add(out.request_id)
        elif pending:
            fleet.advance_idle(pending[0][0])
        assert fleet.now() >= last
        last = fleet.now()
    kept = {f"task{i}#0" for i in range(len(arrivals))} - aborted
    assert finished == kept
    kv = fleet.kv_usage()
    assert kv.free_blocks == kv.total_blocks and fleet.in_flight() == 0


def test_an_idle_replica_starts_when_its_work_arrives_not_when_it_last_stepped():
    fleet = SimulatedFleet(lambda _i: SimulatedEngine(), 2)
    fleet.add_request(_request(0, 200, 400))  # keeps one replica busy
    for _ in range(50):
        fleet.step()
    late = fleet.now()
    fleet.add_request(_request(1, 200, 3))
    assert fleet.replica_of("task1#0") != fleet.replica_of("task0#0")
    seen = {}
    while "task1#0" not in seen:
        for out in fleet.step():
            seen.setdefault(out.request_id, fleet.now())
    alone = SimulatedEngine()
    alone.advance_idle(late)
    first = _run_to_end(alone, [_request(1, 200, 3)])[0][0]
    assert seen["task1#0"] == first  # not earlier: its replica's clock was brought up to `late`


def test_a_plan_s_runs_stay_on_its_home_replica_under_the_scheduler():
    fleet = SimulatedFleet(lambda _i: SimulatedEngine(), 3)
    homes: dict[str, set[str]] = {}
    original = fleet.add_request

    def add(request):
        original(request)
        homes.setdefault(affinity_key(request.request_id), set()).add(
            fleet.replica_of(request.request_id))

    fleet.add_request = add
    # The paper's policy suspends at every boundary, so every plan is resumed (on its home).
    sch, eng, lis = make("timelyllm", engine=fleet)
    ids = [f"t{i}" for i in range(9)]
    for i, tid in enumerate(ids):
        sch.submit(spec(tid, 1 + i % 8, eng))
    drive(sch, eng, lis)
    assert all(sch.tasks[t].state == "done" for t in ids)
    assert all(len(homes[t]) == 1 for t in ids), homes
    assert sum(sch.tasks[t].engine_requests for t in ids) > len(ids)  # there were resumes
    assert len(set().union(*(homes[t] for t in ids))) == 3  # every replica got plans
    assert fleet.stats.moved == 0
    assert_no_leaks(sch, eng)


def test_fleet_of_one_is_the_engine_itself():
    engine = simulated_fleet(lambda: SimulatedEngine(EngineProfile()), 1)
    assert isinstance(engine, SimulatedEngine)
    assert isinstance(simulated_fleet(SimulatedEngine, 2), SimulatedFleet)
