import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

import numpy as np
import pytest

from timelyllm_ros.core.engine.factory import EngineSpec, build_engine

from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.papers.bros.engine import BidirectionalKvEngine
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.sched.interface import GenerationInfo
from timelyllm_ros.core.policies.registry import get_policy

BS = 16
SLOT_S = 131072.0 / 25e9  # one slot over the default host link


def _engine(blocks: int) -> BidirectionalKvEngine:
    return BidirectionalKvEngine(dataclasses.replace(EngineProfile(), kv_total_blocks=blocks))


def _req(rid, prompt_len, script, cls, base=1000):
    # Prompt ids are arbitrary (never decoded); distinct bases keep prompts from sharing blocks.
    return EngineRequest(rid, list(range(base, base + prompt_len)), 64, scripted_text=script,
                         service_class=cls)


def _drain(engine, text=None, cached=None):
    text = {} if text is None else text
    timings = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            text[out.request_id] = text.get(out.request_id, "") + out.new_text
            if cached is not None and out.num_cached_tokens is not None:
                cached[out.request_id] = out.num_cached_tokens
        timings.append(engine.last_step_timing())
    return text, timings


def _assert_no_leaks(engine):
    assert not engine.has_unfinished_requests() and engine.num_paused() == 0
    usage = engine.kv_usage()
    assert usage.free_blocks == usage.total_blocks
    assert engine.region_blocks() == 0 and engine.pinned_blocks() == 0
    kv = engine.bidirectional_kv
    assert not kv.rt_fill.any() and not kv.be_fill.any() and kv.counters()["host_slots_now"] == 0


def test_rt_fills_from_the_left_and_be_from_the_right():
    engine = _engine(8)
    engine.add_request(_req("be", 10, "a b c", "be", base=1000))
    engine.add_request(_req("rt", 10, "x y z", "rt", base=2000))
    engine.step()
    kv = engine.bidirectional_kv
    owners = kv.slot_owners()
    (be_block,), (rt_block,) = kv.blocks_of("be"), kv.blocks_of("rt")
    assert kv.kind_of("be") == "be" and kv.kind_of("rt") == "rt"
    assert kv.be_fill[be_block] == 10 and kv.rt_fill[be_block] == 0
    assert (owners[be_block, -10:] >= 0).all() and (owners[be_block, :-10] == -1).all()
    assert kv.rt_fill[rt_block] == 10 and kv.be_fill[rt_block] == 0
    assert (owners[rt_block, :10] >= 0).all() and (owners[rt_block, 10:] == -1).all()
    assert engine.region_blocks() == 2
    # Only the two borrowed blocks are used; their empty slots still count as free.
    assert engine.kv_usage().free_blocks == 8 - 2 + (2 * BS - 20) // BS
    _drain(engine)
    _assert_no_leaks(engine)


def _overwrite_scenario():
    """A BE request fills the whole KV; an RT request then arrives."""
    engine = _engine(3)
    be_script = "one two three"  # 46 + 3 tokens: all the KV the engine has
    engine.add_request(_req("be", 46, be_script, "be"))
    text = {}
    for out in engine.step():  # BE prefill: 46 slots in 3 blocks
        text[out.request_id] = out.new_text
    assert engine.kv_usage().free_blocks == 0 or engine.bidirectional_kv.empty_slots() < BS
    engine.add_request(_req("rt", 6, "go go go", "rt", base=5000))
    return engine, text, be_script


def test_rt_overwrites_be_slots_instead_of_preempting():
    engine, text, be_script = _overwrite_scenario()
    kv = engine.bidirectional_kv
    outs = engine.step()
    timing = engine.last_step_timing()
    assert timing.extra["preempted"] == [] and timing.extra["admitted"] == ["rt"]
    # The BE request got its decode slot, then the RT prefill needed 6: 1 empty + 5 overwritten.
    assert timing.extra["checkpointed_slots"] == 5
    assert kv.host_slots("be") == 5 and engine.bidir_stats["checkpointed_slots"] == 5
    assert engine.bidir_stats["rt_overwrites"] == 1
    assert engine.bidir_stats["recompute_preemptions"] == 0
    # Exactly the overwritten slots left the device: the BE request lost nothing else.
    assert kv.gpu_slots("be") + kv.host_slots("be") == 46 + 1
    assert [o.request_id for o in outs] == ["rt"]  # BE waits while part of its KV is on host
    assert timing.extra["bidir_swap_out_s"] == pytest.approx(5 * SLOT_S)
    assert timing.extra["swap_s"] == pytest.approx(5 * SLOT_S)
    assert timing.duration_s > timing.extra["swap_s"]


def test_checkpointed_be_swaps_in_and_finishes_its_script_once():
    engine, text, be_script = _overwrite_scenario()
    kv = engine.bidirectional_kv
    before = engine.now()
    text, timings = _drain(engine, text)
    assert text == {"be": be_script, "rt": "go go go"}
    stats = engine.bidir_stats
    # The RT request's decode slots were overwritten BE slots too (its block's peer).
    assert stats["checkpointed_slots"] == 5 + 2
    assert stats["swapped_in_slots"] == stats["checkpointed_slots"]
    assert stats["stalled_steps"] >= 2 and stats["recompute_preemptions"] == 0
    assert stats["swap_in_s"] == pytest.approx(7 * SLOT_S)
    swap_in_steps = [t for t in timings if t.extra["bidir_swap_in_s"] > 0]
    assert len(swap_in_steps) == 1 and swap_in_steps[0].extra["swapped_in_slots"] == 7
    assert swap_in_steps[0].extra["swap_s"] == pytest.approx(7 * SLOT_S)
    assert engine.now() - before == pytest.approx(sum(t.duration_s for t in timings))
    assert kv.counters()["checkpointed_slots"] == 7
    _assert_no_leaks(engine)


def test_same_arrival_waits_on_the_standard_engine():
    def first_rt_token_step(engine):
        engine.add_request(_req("be", 46, "one two three", "be"))
        engine.step()
        engine.add_request(_req("rt", 6, "go go go", "rt", base=5000))
        for i in range(1, 20):
            if any(o.request_id == "rt" for o in engine.step()):
                return i
    standard = SimulatedEngine(dataclasses.replace(EngineProfile(), kv_total_blocks=3))
    # Plain paged KV: the RT request waits until the BE request has finished and freed its
    # blocks; with bidirectional blocks it starts at once.
    assert first_rt_token_step(standard) == 3
    assert first_rt_token_step(_engine(3)) == 1


def test_resumed_generation_hits_the_prefix_cache():
    engine = _engine(64)
    script = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi"
    prompt = list(range(100, 140))
    engine.add_request(EngineRequest("a#0", prompt, 64, scripted_text=script, service_class="be"))
    generated = []
    for _ in range(30):  # run until well past a block boundary, then pause (discard)
        for out in engine.step():
            generated += out.new_token_ids
    engine.suspend_request("a#0", "discard")
    assert engine.kv_usage().free_blocks == 64
    rest = script[len(engine.decode(generated)):]
    engine.resume_request("a#0", EngineRequest("a#1", prompt + generated, 64, scripted_text=rest,
                                               service_class="rt"))
    cached = {}
    text, _ = _drain(engine, cached=cached)
    assert engine.decode(generated) + text["a#1"] == script
    assert cached["a#1"] == (len(prompt) + len(generated) - 1) // BS * BS > 0
    _assert_no_leaks(engine)


def test_preserved_pause_keeps_slots_and_swap_pause_frees_them():
    engine = _engine(16)
    script = "p q r s t u v w"
    engine.add_request(_req("k#0", 20, script, "be"))
    out = engine.step() + engine.step()
    ids = [t for o in out for t in o.new_token_ids]
    engine.suspend_request("k#0", "preserve")
    assert engine.pinned_blocks() >= 1 and engine.bidirectional_kv.gpu_slots("k#0") == 21
    rest = script[len(engine.decode(ids)):]
    engine.resume_request("k#0", EngineRequest("k#1", list(range(1000, 1020)) + ids, 64,
                                               scripted_text=rest, service_class="rt"))
    assert engine.bidirectional_kv.kind_of("k#1") == "be"  # keeps its side and its slots
    cached = {}
    text, _ = _drain(engine, cached=cached)
    assert engine.decode(ids) + text["k#1"] == script and cached["k#1"] == 21
    _assert_no_leaks(engine)

    engine.add_request(_req("s#0", 20, script, "rt", base=3000))
    out = engine.step() + engine.step()
    ids = [t for o in out for t in o.new_token_ids]
    engine.suspend_request("s#0", "swap")
    assert engine.pause_stats["swap_out_tokens"] == 21 and engine.region_blocks() == 0
    engine.resume_request("s#0", EngineRequest("s#1", list(range(3000, 3020)) + ids, 64,
                                               scripted_text=script[len(engine.decode(ids)):]))
    text, _ = _drain(engine)
    assert engine.decode(ids) + text["s#1"] == script
    _assert_no_leaks(engine)


def test_identical_runs_give_identical_timings():
    def run():
        engine, text, _ = _overwrite_scenario()
        _, timings = _drain(engine, text)
        return [(t.duration_s, t.batch_size, t.prefill_tokens) for t in timings], engine.now()

    assert run() == run()


def test_bros_policies_pick_their_engines():
    profile = EngineProfile()
    bros = get_policy("bros")
    assert isinstance(build_engine(EngineSpec(profile=profile), bros.engine_needs()),
                      BidirectionalKvEngine)
    assert get_policy("bros-recompute").engine_needs().simulated_engine is None
    assert get_policy("timelyllm-bros").engine_needs().simulated_engine is None
    # The planner's wall-clock engine is the same variant, paced.
    paced = build_engine(EngineSpec(kind="sim-realtime", profile=profile), bros.engine_needs())
    assert isinstance(paced, BidirectionalKvEngine) and paced.name == "sim-realtime"
    gen = dict(task_id="t", deadline_s=100.0, bound_tokens=10, context_tokens=500,
               skill_set="drone")
    assert bros.service_class(GenerationInfo(is_urgent=True, **gen), now=0.0) == "rt"
    assert bros.service_class(GenerationInfo(is_urgent=False, **gen), now=0.0) == "be"
    assert bros.service_class(GenerationInfo(is_urgent=False, **gen), now=99.0) == "rt"


def test_bench_run_on_tight_kv_uses_the_bidirectional_blocks(monkeypatch):
    import timelyllm_ros.bench.replay as harness  # the module whose build_engine run_policy calls
    from timelyllm_ros.bench.config import BenchConfig
    from timelyllm_ros.bench.replay import run_policy
    from timelyllm_ros.bench.workloads import shorten
    from timelyllm_ros.lrtrace.workload import compose, load_workload

    built = []
    build = harness.build_engine
    monkeypatch.setattr(harness, "build_engine", lambda *a, **k: built.append(build(*a, **k))
                        or built[-1])
    workload = shorten(load_workload("WID1"), 120)
    events = compose(workload)
    profile = dataclasses.replace(EngineProfile(), kv_total_blocks=36)
    result = run_policy(events, "bros", workload, BenchConfig(profile=profile, prompt_tokens=None))
    (engine,) = built
    assert isinstance(engine, BidirectionalKvEngine)
    assert result.tasks and all(t.state == "done" for t in result.tasks)
    assert np.isfinite([t.response_time_s for t in result.tasks]).all()
    stats = engine.bidir_stats
    assert stats["rt_overwrites"] > 0 and stats["checkpointed_slots"] > 0
    assert stats["swapped_in_slots"] > 0 and stats["swap_out_s"] > 0
    _assert_no_leaks(engine)


def _be_blocks_with_holes(engine, count=4, hole=8):
    """`count` region blocks, each a BE request's with `hole` slots an RT request overwrote and
    then gave back: empty slots that only that BE request or an RT request can reach."""
    kv = engine.bidirectional_kv
    engine._borrow_blocks(count)
    for i in range(count):
        kv.append_be(f"old-be{i}", BS)
    for i in range(count):  # all held at once, or the next would reuse the last one's hole
        kv.append_rt(f"old-rt{i}", hole)
    for i in range(count):
        kv.release(f"old-rt{i}")
    return kv


def test_free_count_leaves_out_slots_only_rt_requests_can_reach():
    engine = _engine(8)
    kv = _be_blocks_with_holes(engine)
    assert kv.empty_slots() == 4 * 8
    # A newcomer BE request cannot use the holes: they are not free blocks.
    assert engine.kv_usage().free_blocks == 8 - 4
    # An RT request can: the holes and every BE slot it may overwrite count for it.
    assert engine.rt_room_blocks() == 8


def test_be_request_that_cannot_be_placed_does_not_hold_back_rt():
    engine = _engine(8)
    _be_blocks_with_holes(engine)
    # 70 slots: more than the 4 free blocks, so the BE request must wait; the RT request
    # behind it fits (holes + free blocks) and is admitted first.
    engine.add_request(_req("be", 70, "a b", "be", base=3000))
    engine.add_request(_req("rt", 70, "c d", "rt", base=4000))
    engine.step()
    assert engine.last_step_timing().extra["admitted"] == ["rt"]
    assert engine.num_waiting() == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["rt", "be"]), st.integers(1, 60),
                          st.integers(1, 12), st.integers(0, 6)), min_size=1, max_size=12))
def test_random_mixes_on_a_tiny_kv_finish_intact_and_leak_nothing(requests):
    # Every request fits the KV on its own; together they overflow it, so RT requests
    # overwrite BE slots, BE requests swap back in, and the fallback preempts by recompute.
    engine = _engine(8)
    scripts, text = {}, {}
    for i, (cls, prompt, words, delay) in enumerate(requests):
        script = " ".join(f"t{i}x{k}" for k in range(words))
        scripts[f"r{i}"] = script
        engine.add_request(_req(f"r{i}", prompt, script, cls, base=1000 * (i + 1)))
        for _ in range(delay):
            for out in engine.step():
                text[out.request_id] = text.get(out.request_id, "") + out.new_text
    _drain(engine, text)
    assert text == scripts
    _assert_no_leaks(engine)


def test_chunked_prefill_on_shared_blocks_finishes_intact():
    # A 150-token prompt on a 40-token budget is prefilled over four steps while an RT request
    # decodes beside it: every slot it was given at admission is used, nothing is left over.
    profile = dataclasses.replace(EngineProfile(), kv_total_blocks=64, max_num_batched_tokens=40)
    engine = BidirectionalKvEngine(profile, max_num_seqs=4)
    engine.add_request(_req("long", 150, "a b", "be", base=1000))
    engine.add_request(_req("short", 3, "x y z w v u", "rt", base=5000))
    text, timings = _drain(engine)
    assert text == {"long": "a b", "short": "x y z w v u"}
    assert sum(t.prefill_tokens for t in timings) == 150 + 3
    assert max(t.extra["scheduled_tokens"] for t in timings) <= 40
    assert sum(1 for t in timings if t.extra["partial_prefills"]) >= 3
    _assert_no_leaks(engine)
