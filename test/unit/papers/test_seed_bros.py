import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.sched.queue_view import QueueView
from timelyllm_ros.papers.bros.bidirectional_kv import BidirectionalKV, KVFull
from timelyllm_ros.papers.bros.cost_model import BrosCostModel, PhaseCost
from timelyllm_ros.papers.bros.reproduction import simulate_hybrid
from timelyllm_ros.papers.bros.reproduction_workload import HybridWorkload
from timelyllm_ros.papers.bros.requests import (BE, RT, BrosRequest, classify_robot_work,
                                                segment_request, split_queue)
from timelyllm_ros.papers.bros.selection import AdaptiveBatchSize, BrosScheduler, select_batch

# ---- the digest's reproduction case --------------------------------------------------------

T_AVG = 0.05


def stub_cost(batch):
    return 0.01 * len(batch)


def rt_a():
    # decode RT, TPOT 0.2, 0.12 s since its last token -> slack 0.08
    return BrosRequest("A", kind=RT, prefill=False, t_since_token_s=0.12, slo_s=0.2)


def rt_b():
    # waiting prefill RT, TTFT 0.4, waited 0.1 s -> slack 0.3
    return BrosRequest("B", kind=RT, prefill=True, new_tokens=50, context_tokens=50,
                       t_since_token_s=0.1, slo_s=0.4)


def bes(n):
    return [BrosRequest(f"be{i}", kind=BE) for i in range(n)]


def ids(reqs):
    return [r.req_id for r in reqs]


def test_slack_and_order():
    a, b = rt_a(), rt_b()
    assert a.slack(T_AVG) == pytest.approx(0.08)
    assert b.slack(T_AVG) == pytest.approx(0.3)
    sel = select_batch([b, a], [], cost=stub_cost, t_avg_s=T_AVG, batch_limit=8)
    assert ids(sel.rt) == ["A", "B"]
    assert sel.tres_s == pytest.approx(0.08)
    assert not sel.hit


def test_six_be_fill_the_batch():
    sel = select_batch([rt_b(), rt_a()], bes(6), cost=stub_cost, t_avg_s=T_AVG, batch_limit=8)
    assert ids(sel.rt) == ["A", "B"]
    assert len(sel.be) == 6 and not sel.displaced
    assert sel.est_iter_s == pytest.approx(0.08)


def test_seventh_be_displaces_b_to_head_of_qrt():
    sel = select_batch([rt_b(), rt_a()], bes(7), cost=stub_cost, t_avg_s=T_AVG, batch_limit=8)
    assert ids(sel.rt) == ["A"]
    assert len(sel.be) == 7
    assert ids(sel.displaced) == ["B"]
    assert ids(sel.rt_queue)[0] == "B"
    assert sel.est_iter_s == pytest.approx(0.08)


def test_displacement_guard_protects_a_request_that_would_miss():
    # The 8th BE would have to displace A; deferred one iteration (0.08 + T_avg) A misses.
    sel = select_batch([rt_b(), rt_a()], bes(8), cost=stub_cost, t_avg_s=T_AVG, batch_limit=8)
    assert ids(sel.rt) == ["A"] and len(sel.be) == 7
    assert ids(sel.be_queue) == ["be7"]


def test_empty_rt_list_fills_with_be_and_stops():
    sel = select_batch([], bes(5), cost=stub_cost, t_avg_s=T_AVG, batch_limit=3)
    assert sel.rt == [] and len(sel.be) == 3 and len(sel.be_queue) == 2
    assert sel.tres_s == math.inf and not sel.hit


def test_hit_when_next_rt_breaks_tres():
    rts = [BrosRequest(i, kind=RT, t_since_token_s=0.185, slo_s=0.2) for i in range(3)]
    sel = select_batch(rts, bes(2), cost=stub_cost, t_avg_s=T_AVG, batch_limit=8)
    assert sel.hit and len(sel.rt) == 1 and sel.be == []


def test_late_request_is_served_first_and_does_not_set_tres():
    late = BrosRequest("late", kind=RT, t_since_token_s=0.25, slo_s=0.2)   # slack -0.05
    ok = BrosRequest("ok", kind=RT, t_since_token_s=0.1, slo_s=0.2)        # slack 0.1
    sel = select_batch([ok, late], bes(20), cost=stub_cost, t_avg_s=T_AVG, batch_limit=64)
    assert ids(sel.rt) == ["late", "ok"] and sel.late_served == 1
    assert sel.tres_s == pytest.approx(0.1)
    assert len(sel.be) == 8  # 10 requests * 0.01 = Tres
    only_late = select_batch([late], bes(3), cost=stub_cost, t_avg_s=T_AVG, batch_limit=64)
    assert ids(only_late.rt) == ["late"] and only_late.be == []


def test_be_order_resident_by_host_slots_then_prefills():
    reqs = [BrosRequest("pre", kind=BE, prefill=True, new_tokens=100, context_tokens=100),
            BrosRequest("h5", kind=BE, host_slots=5), BrosRequest("h0", kind=BE)]
    sel = select_batch([], reqs, cost=stub_cost, t_avg_s=T_AVG, batch_limit=8)
    assert ids(sel.be) == ["h0", "h5", "pre"]


def test_token_budget_stops_prefill_waves():
    reqs = [BrosRequest(i, kind=BE, prefill=True, new_tokens=800, context_tokens=800)
            for i in range(5)]
    sel = select_batch([], reqs, cost=stub_cost, t_avg_s=T_AVG, batch_limit=64, token_budget=2000)
    assert len(sel.be) == 2


def test_kind_mismatch_rejected():
    with pytest.raises(ValueError):
        select_batch(bes(1), [], cost=stub_cost, t_avg_s=T_AVG, batch_limit=4)
    with pytest.raises(ValueError):
        BrosRequest("x", kind="urgent")


# ---- adaptive batch size ------------------------------------------------------------------

def test_batch_size_doubles_without_hit_and_resets_on_hit():
    sched = BrosScheduler(stub_cost, t_avg_init_s=T_AVG)
    assert sched.batch.current == 128
    sched.select([rt_a()], bes(2))
    assert sched.batch.current == 256
    sched.select([rt_a()], bes(2))
    assert sched.batch.current == 512
    tight = [BrosRequest(i, kind=RT, t_since_token_s=0.185, slo_s=0.2) for i in range(3)]
    sel = sched.select(tight, [])
    assert sel.hit and sched.batch.current == 128


def test_adaptive_batch_resets_on_estimate_over_tres_and_caps():
    b = AdaptiveBatchSize(base=128, max_size=512)
    assert [b.update(False) for _ in range(4)] == [256, 512, 512, 512]
    assert b.update(False, est_iter_s=0.2, tres_s=0.1) == 128
    with pytest.raises(ValueError):
        AdaptiveBatchSize(base=0)


def test_t_avg_is_a_moving_average():
    s = BrosScheduler(stub_cost, t_avg_init_s=0.1, t_avg_alpha=0.5)
    s.observe(0.2)
    assert s.t_avg_s == pytest.approx(0.15)
    with pytest.raises(ValueError):
        s.observe(float("nan"))


# ---- cost model ---------------------------------------------------------------------------

def test_cost_model_phases_and_swap_overlap():
    m = BrosCostModel(prefill=PhaseCost(a0=1e-4, a1=1e-8, b=0.002),
                      decode=PhaseCost(a0=2.5e-4, a1=1.6e-7, b=0.02),
                      swap_per_slot_s=1e-4)
    pre = BrosRequest("p", prefill=True, new_tokens=1000, context_tokens=1000)
    dec = BrosRequest("d", new_tokens=1, context_tokens=2000)
    assert m([pre]) == pytest.approx(1e-4 * 1000 + 1e-8 * 1000 * 1000 + 0.002)
    assert m([dec]) == pytest.approx(2.5e-4 + 1.6e-7 * 2000 + 0.02)
    assert m([pre, dec]) == pytest.approx(m([pre]) + m([dec]))
    assert m([]) == 0.0
    # swap overlaps execution: the iteration is the longer of the two
    swapped = BrosRequest("s", kind=BE, host_slots=10_000)
    assert m([swapped]) == pytest.approx(max(m([BrosRequest("s", kind=BE)]), 1.0))


def test_cost_model_matches_engine_profile_decode():
    prof = EngineProfile()
    m = BrosCostModel.from_engine_profile(prof)
    batch = [BrosRequest(i, context_tokens=500 + i) for i in range(32)]
    ctx = sum(r.context_tokens for r in batch)
    assert m(batch) == pytest.approx(prof.decode_step_s(32, ctx))


def test_fit_recovers_coefficients():
    rng = np.random.default_rng(0)
    truth = PhaseCost(a0=1.2e-4, a1=3e-9, b=0.004)
    samples = []
    for _ in range(60):
        ln = float(rng.integers(16, 4096))
        lnla = ln * ln
        samples.append((ln, lnla, truth(ln, lnla)))
    fit, rms = BrosCostModel.fit_phase(samples)
    assert rms < 1e-9
    assert fit.a0 == pytest.approx(truth.a0, rel=1e-4)
    assert fit.a1 == pytest.approx(truth.a1, rel=1e-3)
    assert fit.b == pytest.approx(truth.b, rel=1e-3)
    with pytest.raises(ValueError):
        BrosCostModel.fit_phase([(1, 1, 1)])


# ---- bidirectional KV ---------------------------------------------------------------------

def test_lazy_checkpoint_example():
    kv = BidirectionalKV(1, 16)
    kv.append_be("b", 10)
    assert kv.append_rt("r", 6) == 0            # fills the 6 empty slots first
    assert kv.counters()["checkpointed_slots"] == 0
    assert kv.append_rt("r", 2) == 2            # only now the two nearest BE slots go to host
    assert kv.host_slots("b") == 2 and kv.gpu_slots("b") == 8 and kv.gpu_slots("r") == 8
    with pytest.raises(KVFull):
        kv.swap_in("b")                         # no free slot until the RT request leaves
    kv.release("r")
    assert kv.swap_in("b") == 2
    assert kv.gpu_slots("b") == 10 and kv.host_slots("b") == 0
    assert kv.counters() == {"checkpointed_slots": 2, "swapped_in_slots": 2,
                             "preemption_events": 1, "host_slots_now": 0}


def test_rt_prefers_empty_blocks_and_be_never_overwrites():
    kv = BidirectionalKV(2, 16)
    kv.append_be("b", 16)
    kv.append_rt("r", 16)                      # goes to the empty block
    assert kv.checkpointed_slots == 0
    with pytest.raises(KVFull):
        kv.append_be("b2", 1)
    assert kv.gpu_slots("r") == 16 and kv.gpu_slots("b") == 16


def test_rt_reaches_the_be_slots_of_every_block_it_claimed():
    # Regression: capacity counted both part-BE blocks, but once the RT request had claimed
    # both for their empty slots it could only overwrite the BE slots of the last one.
    kv = BidirectionalKV(2, 16)
    kv.append_be("a", 6)
    kv.append_be("b", 11)
    assert kv.rt_capacity("r") == 32
    assert kv.append_rt("r", 30) == 30 - (10 + 5)     # 15 empty slots, then 15 overwritten
    assert kv.host_slots("a") + kv.host_slots("b") == 15
    assert kv.gpu_slots("r") == 30
    kv.slot_owners()


def test_checkpointed_be_swaps_back_into_the_hole_in_its_own_block():
    kv = BidirectionalKV(3, 16)
    kv.append_be("b", 32)                         # blocks 0 and 1, full
    kv.append_rt("r", 16)                         # the empty block 2
    assert kv.append_rt("r", 4) == 4              # overwrites 4 BE slots of block 0
    kv.release("r")
    assert kv.blocks_of("b") == [0, 1] and kv.be_fill[0] == 12
    assert kv.be_capacity("b") == 4 + 16          # its hole, and the empty block 2
    assert kv.swap_in("b") == 4
    # Back into its own hole (not its last block), leaving block 2 empty for others.
    assert kv.blocks_of("b") == [0, 1] and kv.be_fill[0] == 16 and kv.be_fill[2] == 0


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("rt"), st.integers(0, 2), st.integers(0, 40)),
        st.tuples(st.just("be"), st.integers(0, 2), st.integers(0, 40)),
        st.tuples(st.just("swap"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("release_rt"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("release_be"), st.integers(0, 2), st.just(0)),
    ),
    max_size=40)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_bidirectional_kv_properties(ops):
    _check_kv_ops(ops, BidirectionalKV(6, 16))


DENSE_OPS = st.lists(
    st.tuples(st.sampled_from(["rt", "be", "swap", "release_rt", "release_be"]),
              st.integers(0, 3), st.integers(0, 9)),
    max_size=60)


@settings(max_examples=300, deadline=None)
@given(DENSE_OPS)
def test_bidirectional_kv_properties_dense(ops):
    # Small blocks and many requests: every block is shared and fronts meet all the time.
    _check_kv_ops(ops, BidirectionalKV(3, 4))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=8), st.data())
def test_rt_append_within_capacity_always_fits(be_sizes, data):
    # The contract admission relies on: whatever the BE layout, and however much the RT request
    # already holds, an append within rt_capacity succeeds and loses no BE slot.
    kv = BidirectionalKV(4, 4)
    for i, n in enumerate(be_sizes):
        if n <= kv.be_capacity(f"b{i}"):
            kv.append_be(f"b{i}", n)
    be_names = [f"b{i}" for i in range(len(be_sizes))]
    be_total = sum(kv.gpu_slots(b) + kv.host_slots(b) for b in be_names)
    held = 0
    for _ in range(2):
        n = data.draw(st.integers(0, kv.rt_capacity("r")))
        reachable = kv.reachable_empty_rt("r")
        assert kv.append_rt("r", n) == max(0, n - reachable)
        held += n
        assert kv.gpu_slots("r") == held
        assert sum(kv.gpu_slots(b) + kv.host_slots(b) for b in be_names) == be_total
        kv.slot_owners()


def _check_kv_ops(ops, kv):
    size = kv.size
    logical = {}              # tokens each live request has written
    ever_ckpt = 0
    for op, i, n in ops:
        name = f"{'r' if op in ('rt', 'release_rt') else 'b'}{i}"
        before = kv.checkpointed_slots
        host_before = {k: kv.host_slots(k) for k in logical}
        if op == "rt":
            reachable = kv.reachable_empty_rt(name)
            if n > kv.rt_capacity(name):
                with pytest.raises(KVFull):
                    kv.append_rt(name, n)
            else:
                got = kv.append_rt(name, n)
                # lazy and exact: overwrite only what the reachable empty slots cannot hold
                assert got == max(0, n - reachable) == kv.checkpointed_slots - before
                logical[name] = logical.get(name, 0) + n
                host_gain = sum(kv.host_slots(k) - host_before.get(k, 0) for k in logical
                                if k.startswith("b"))
                assert host_gain == got
                ever_ckpt += got
        elif op == "be":
            if n > kv.be_capacity(name):
                with pytest.raises(KVFull):
                    kv.append_be(name, n)
            else:
                kv.append_be(name, n)
                logical[name] = logical.get(name, 0) + n
            assert kv.checkpointed_slots == before
        elif op == "swap":
            h = kv.host_slots(name)
            swapped_before = kv.swapped_in_slots
            if h > kv.be_capacity(name):
                with pytest.raises(KVFull):
                    kv.swap_in(name)
            else:
                assert kv.swap_in(name) == h
                assert kv.swapped_in_slots - swapped_before == h
        else:
            kv.release(name)
            logical.pop(name, None)
        owners = kv.slot_owners()     # raises if RT and BE regions overlap
        assert np.all(kv.rt_fill + kv.be_fill <= size)
        # every written token is on the device or checkpointed, never lost or duplicated
        for k, tokens in logical.items():
            assert kv.gpu_slots(k) + kv.host_slots(k) == tokens
            if k.startswith("r"):
                assert kv.host_slots(k) == 0
        assert int((owners >= 0).sum()) == sum(kv.gpu_slots(k) for k in logical)
    assert kv.checkpointed_slots == ever_ckpt


# ---- robot mapping ------------------------------------------------------------------------

def test_classify_robot_work():
    assert classify_robot_work(urgent=True, slack_s=100.0) == RT
    assert classify_robot_work(urgent=False, kind="chat") == BE
    assert classify_robot_work(urgent=False, kind="background", slack_s=-1) == BE
    assert classify_robot_work(urgent=False, slack_s=10.0, be_slack_s=5.0) == BE
    assert classify_robot_work(urgent=False, slack_s=1.0, be_slack_s=5.0) == RT
    with pytest.raises(ValueError):
        classify_robot_work(urgent=False, kind="arm")


def test_segment_request_slack_is_deadline_based():
    r = segment_request("t1/s2", now_s=10.0, reference_s=9.5, deadline_s=11.0, tokens_left=5,
                        prefill=False, new_tokens=1, context_tokens=3000)
    # deadline - now - (k - 1) * T_avg
    assert r.slack(0.05) == pytest.approx(11.0 - 10.0 - 4 * 0.05)


def test_split_queue():
    view = QueueView.from_rows([
        dict(arrival_s=0, reference_s=0, ert_s=0.2, slope=6.67, initial_utility=2, is_urgent=True),
        dict(arrival_s=0, reference_s=0, ert_s=30.0, slope=2, initial_utility=1),
        dict(arrival_s=0, reference_s=0, ert_s=1.0, slope=2, initial_utility=1),
        dict(arrival_s=0, reference_s=0, ert_s=30.0, slope=2, initial_utility=1),
    ])
    rt, be = split_queue(view, 0.0, [40, 40, 40, 40], t_avg_s=0.025, be_slack_s=5.0,
                         kinds=["segment", "segment", "segment", "chat"])
    assert rt.tolist() == [0, 2] and be.tolist() == [1, 3]


# ---- simulator smoke ----------------------------------------------------------------------

def test_hybrid_sim_bros_protects_rt():
    # A 64-request BE wave lands with RT chat at 3 req/s: FCFS queues the RT prompts behind it.
    w = HybridWorkload(rt_rate=3.0, duration_s=6.0, be_batch=64, seed=1)
    fcfs = simulate_hybrid("fcfs", w)
    bros = simulate_hybrid("bros", w)
    assert fcfs.rt_done == fcfs.rt_total and bros.rt_done == bros.rt_total
    assert bros.ttft_attain >= fcfs.ttft_attain + 0.5
    assert bros.be_done > 0


@settings(max_examples=200, deadline=None)
@given(prefill=st.booleans(), new=st.integers(0, 4096), context=st.integers(0, 8192),
       host=st.integers(0, 512))
def test_pricing_a_request_alone_equals_push_value_pop(prefill, new, context, host):
    """`alone` (the selector prices every RT request by itself) gives exactly what pushing it
    onto an empty accumulator gives, bit for bit, and leaves the running sums untouched."""
    from timelyllm_ros.papers.bros.cost_model import cost_accumulator
    from timelyllm_ros.papers.bros.requests import BrosRequest

    model = BrosCostModel.from_engine_profile(EngineProfile())
    r = BrosRequest("r", prefill=prefill, new_tokens=new, context_tokens=context,
                    host_slots=host)
    acc = cost_accumulator(model)
    acc.push(r)
    expected = acc.value()
    acc.pop(r)
    assert acc.alone(r) == expected
    assert acc.value() == 0.0 or acc.value() == model.swap_s(0)
    stub = cost_accumulator(lambda batch: 0.001 * len(batch))
    assert stub.alone(r) == 0.001 and stub.value() == 0.0
