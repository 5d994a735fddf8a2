"""The seed papers' policies (001-004) on the segment scheduler and the simulated engine.

Every policy runs the same SegmentScheduler code path; these tests pin the extension points
(size columns, candidate-aware admission, gate, pause handling) and the simulated engine's
preserve / discard / swap costs. Helpers (fake robots, task specs) come from test_scheduler.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fakes import SKILL_SETS, TRACES, assert_no_leaks, drive, make, spec

from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies import (QueueView, get_policy, initial_row, policy_names,
                                         suspended_row)
from timelyllm_ros.core.engine.base import DISCARD, PRESERVE, SWAP
from timelyllm_ros.core.sched.interface import PauseInfo, Policy, SchedulerContext
from timelyllm_ros.papers.hybrid.policy import HybridPolicy
from timelyllm_ros.papers.lamps.policy import lamps_handling
from timelyllm_ros.papers.mcsf.policy import McsfLookaheadAdmission
from timelyllm_ros.core.sched.interface import AdmissionPass, Candidate, RunningGen
from timelyllm_ros.papers.hybrid import gate as seed_hybrid
from timelyllm_ros.papers.lamps import waste as seed_lamps
from timelyllm_ros.papers.mcsf import unit_model as seed_mcsf
from timelyllm_ros.papers.mcsf.admission import McsfAdmission
from timelyllm_ros.core.tuf import TUF

SEED_POLICIES = ["mcsf", "mcsf-utility", "mcsf-shared", "bros", "hybrid", "hybrid-nogate",
                 "lamps", "timelyllm-mcsf", "timelyllm-lamps"]
NORMAL = TUF(1.0, 2.0, 1.0)
URGENT = TUF(0.2, 6.67, 2.0)
# drone normal, drone urgent, arm, drone normal, drone urgent, drone normal
MIXED = [("d1", 1), ("u6", 6), ("a9", 9), ("d2", 2), ("u7", 7), ("d3", 3)]


def exec_model(seconds: float) -> ExecutionTimeModel:
    return ExecutionTimeModel.from_mapping(
        {"version": 1, "skills": {"default": {"kind": "constant", "seconds": seconds}}})


def assert_no_leaks_engine(eng):
    assert not eng.has_unfinished_requests()
    assert eng.num_paused() == 0 and eng.pinned_blocks() == 0
    kv = eng.kv_usage()
    assert kv.free_blocks == kv.total_blocks


# ------------------------------------------------------------------ names and defaults

def test_seed_policies_are_registered():
    names = policy_names()
    for n in SEED_POLICIES:
        assert n in names
        p = get_policy(n)
        assert p.name == n and p.dispatch == "segment"
    with pytest.raises(TypeError):
        get_policy("hybrid", gate=False)  # identity is fixed by the name
    assert get_policy("lamps", starvation_threshold=5).starvation_threshold == 5
    assert get_policy("bros", be_slack_s=2.0).be_slack_s == 2.0


def test_original_policies_use_no_extension_point():
    ctx = SchedulerContext("sim", 16, 100, 10)
    for n in ("vllm", "vllm-stream", "fcfs-seg", "edf-seg", "timelyllm"):
        p = get_policy(n)
        assert p.make_admission(ctx) is None and p.make_gate(ctx) is None
        for hook in ("on_admitted", "on_step", "on_task_end", "pause_handling"):
            assert getattr(type(p), hook) is getattr(Policy, hook), (n, hook)


# ------------------------------------------------------------------ every policy, end to end

@pytest.mark.parametrize("name", SEED_POLICIES)
def test_policy_runs_mixed_workload_without_leaks(name):
    sch, eng, lis = make(name)
    for tid, trace in MIXED:
        sch.submit(spec(tid, trace, eng))
    drive(sch, eng, lis)
    for tid, trace in MIXED:
        task = sch.tasks[tid]
        assert task.state == "done", (tid, task.lifecycle.reason)
        assert "".join(s.text for t, s in lis.segments if t == tid) == TRACES[trace].plan
        assert task.resumes == len(task.segments) - 1 > 0
    assert_no_leaks(sch, eng)
    assert_no_leaks_engine(eng)
    assert sum(sch.pause_counts.values()) == sum(sch.tasks[t].resumes for t, _ in MIXED)
    if name in ("lamps", "timelyllm-lamps"):
        assert sch.pause_counts[DISCARD] < sum(sch.pause_counts.values())
    else:
        assert sch.pause_counts[PRESERVE] == sch.pause_counts[SWAP] == 0


@pytest.mark.parametrize("name", ["lamps", "mcsf", "bros"])
def test_policy_with_batch_cap_and_resume_lead(name):
    sch, eng, lis = make(name, batch_cap=1, resume_lead_s=0.2)
    most = 0
    for tid, trace in MIXED[:4]:
        sch.submit(spec(tid, trace, eng))

    def watch(s):
        nonlocal most
        most = max(most, len(s.running_request_ids()))
        return False
    drive(sch, eng, lis, until=watch)
    assert most == 1
    assert all(sch.tasks[t].state == "done" for t, _ in MIXED[:4])
    assert_no_leaks(sch, eng)
    assert_no_leaks_engine(eng)


def test_queue_size_columns_are_filled():
    sch, eng, lis = make("mcsf")
    task = sch.submit(spec("d1", 1, eng))
    row = sch.state.queue.get(task.queue_slot)
    drone = SKILL_SETS["drone"]
    assert row["task_seq"] == task.submit_index
    assert row["context_tokens"] == len(task.prompt_ids)
    assert row["bound_tokens"] == drone.max_segment_tokens
    # The skill set's fixed prompt was warmed: only the instruction's blocks are to prefill.
    assert 0 < row["prefill_tokens"] < len(task.prompt_ids) // 2
    assert row["pause_s"] == 0.0  # no segment time known yet
    drive(sch, eng, lis, until=lambda s: s.tasks["d1"].state == "suspended")
    row = sch.state.queue.get(task.queue_slot)
    assert row["context_tokens"] == len(task.prompt_ids) + len(task.generated.token_ids)
    assert row["segment_index"] == 1 and row["prefill_tokens"] <= 16
    assert row["pause_s"] == pytest.approx(task.segments[0].estimated_execution_s)


# ------------------------------------------------------------------ 001 MC-SF

def test_mcsf_order_is_seed_sf_key_and_utility_key():
    rows = [initial_row(NORMAL, 3.0, bound_tokens=24, task_seq=0),
            initial_row(URGENT, 4.0, is_urgent=True, bound_tokens=10, task_seq=1),
            initial_row(NORMAL, 1.0, bound_tokens=10, task_seq=2),
            initial_row(URGENT, 2.0, is_urgent=True, bound_tokens=60, task_seq=3)]
    view = QueueView.from_rows(rows)
    reqs = [seed_mcsf.Request(i, r["arrival_s"], 1, r["bound_tokens"],
                              weight=r["initial_utility"] * r["slope"])
            for i, r in enumerate(rows)]

    def served(policy):
        pr = get_policy(policy).priorities(view, 5.0)
        return list(np.lexsort((view.arrival_s, -pr)))
    assert served("mcsf") == [r.rid for r in sorted(reqs, key=seed_mcsf.sf_key)] == [2, 1, 0, 3]
    assert served("mcsf-utility") == [r.rid for r in sorted(reqs, key=seed_mcsf.utility_key)]
    assert served("mcsf-utility")[0] == 1  # urgent and short


def test_mcsf_lookahead_admission_matches_seed():
    adm = McsfLookaheadAdmission(kv_capacity_tokens=160, block_size=16)  # 10 blocks
    batch = [RunningGen("a", 40, 2, 10, 1.0, False)]   # 40 + 8 more tokens -> 3 blocks at peak

    def cand(ctx, bound, need=1):
        return Candidate("c", 9, ctx, bound, 1, need, 1.0, False, 0)
    ok, _ = adm.may_admit_candidate(batch, cand(96, 10), free_kv_blocks=100)  # 7 blocks at peak
    assert ok
    ok, why = adm.may_admit_candidate(batch, cand(112, 10), free_kv_blocks=100)  # 8 + 3 > 10
    assert not ok and "look-ahead" in why
    # The running request completes before the candidate peaks: its blocks are free by then.
    ok, _ = adm.may_admit_candidate([RunningGen("a", 40, 9, 10, 1.0, False)], cand(112, 30), 100)
    assert ok == McsfAdmission(160, 16).may_admit_lookahead([(40, 1)], (112, 30))[0]
    ok, why = adm.may_admit_candidate(batch, cand(16, 1, need=5), free_kv_blocks=4)
    assert not ok and "kv blocks" in why


def test_mcsf_lookahead_counts_shared_prefix_once():
    literal = McsfLookaheadAdmission(320, 16)
    shared = McsfLookaheadAdmission(320, 16, share_prefix=True)  # 20 blocks
    # Three generations of one skill set with a 160-token (10-block) shared prompt prefix.
    batch = [RunningGen(k, 180, 0, 10, 1.0, False, "drone", 160) for k in "ab"]
    c = Candidate("c", 9, 180, 10, 20, 2, 1.0, False, 0, "drone", 160)
    assert not literal.may_admit_candidate(batch, c, 100)[0]  # 3 x 12 blocks > 20
    assert shared.may_admit_candidate(batch, c, 100)[0]       # 10 + 3 x 2 blocks <= 20


@pytest.mark.parametrize("name", ["mcsf", "timelyllm-mcsf"])
def test_mcsf_never_exceeds_kv_capacity_on_tight_engine(name):
    # ~27-block prompts, 90 blocks: at most three generations fit, counted without sharing.
    engine = SimulatedEngine(EngineProfile(kv_total_blocks=90))
    sch, eng, lis = make(name, engine=engine)
    for i, (tid, trace) in enumerate(MIXED * 2):
        sch.submit(spec(f"{tid}-{i}", trace, eng))
    bs = eng.kv_usage().block_size
    peaks, preempted = [], []

    def watch(s):
        # What MC-SF guarantees: the running batch fits the KV even with no block shared,
        # and the engine never has to preempt.
        held = sum(-(-(len(t.prompt_ids) + len(t.generated.token_ids)) // bs)
                   for t in s.state.running.values())
        peaks.append(held)
        preempted.extend(eng.last_step_timing().extra.get("preempted", []))
        return False
    drive(sch, eng, lis, until=watch)
    assert all(t.state == "done" for t in sch.tasks.values())
    assert max(peaks) <= eng.kv_usage().total_blocks
    assert max(peaks) > eng.kv_usage().total_blocks // 2  # the KV was actually contended
    assert preempted == []
    assert_no_leaks(sch, eng)


# ------------------------------------------------------------------ 002 BROS

def _pass(view, running=(), now=0.0, free=10_000):
    order = np.arange(len(view))
    return AdmissionPass(now, view, order, [f"k{i}" for i in order], list(running), free, 16)


def test_bros_classifies_urgent_as_rt_and_orders_rt_first():
    view = QueueView.from_rows([
        # 0: normal first segment, ERT 1 s -> slack < be_slack_s -> RT
        initial_row(NORMAL, 0.0, bound_tokens=10, context_tokens=500, prefill_tokens=40),
        # 1: urgent first segment -> RT whatever its slack
        initial_row(URGENT, 0.0, is_urgent=True, bound_tokens=10, context_tokens=500,
                    prefill_tokens=40),
        # 2: suspended normal generation whose robot is busy for 20 s -> BE
        suspended_row(NORMAL, 0.0, 20.0, 1, enqueued_s=0.0, bound_tokens=10,
                      context_tokens=520, prefill_tokens=8),
        # 3: suspended urgent generation with the same slack -> still RT
        suspended_row(URGENT, 0.0, 20.0, 1, enqueued_s=0.0, is_urgent=True, bound_tokens=10,
                      context_tokens=520, prefill_tokens=8),
    ])
    policy = get_policy("bros")
    adm = policy.make_admission(SchedulerContext("sim", 16, 2560, 10, 256))
    pr = policy.priorities(view, 0.0)
    assert set(np.argsort(-pr)[:3]) == {0, 1, 3} and np.argmax(-pr) == 2  # BE last
    assert pr[1] > pr[0]  # urgent (0.2 s) has less slack than normal (1 s)
    adm.begin_pass(_pass(view))
    sel = adm.last_selection
    assert {r.req_id for r in sel.rt} | {r.req_id for r in sel.rt_queue} == {"k0", "k1", "k3"}
    assert [r.req_id for r in sel.be] + [r.req_id for r in sel.be_queue] == ["k2"]
    assert adm.allowed == {"k0", "k1", "k2", "k3"}  # an idle engine takes them all
    # A running urgent generation is RT too.
    adm.begin_pass(_pass(view, [RunningGen("r", 500, 3, 10, 0.15, True)]))
    assert ("run", "r") in {r.req_id for r in adm.last_selection.rt}


def test_bros_hit_resets_batch_size_and_refuses():
    view = QueueView.from_rows([
        initial_row(NORMAL, 0.0, bound_tokens=10, context_tokens=3000, prefill_tokens=3000,
                    task_seq=i) for i in range(3)])
    policy = get_policy("bros", b_base=4)
    adm = policy.make_admission(SchedulerContext("sim", 16, 2560, 10, 256))
    adm.begin_pass(_pass(view, now=0.0))
    # RT (slack 1 - 9 * T_avg = 0.775 s < be_slack_s). A cold 3000-token prefill costs ~0.34 s:
    # two fit in Tres, the third would make the iteration ~0.98 s > Tres -> HIT.
    assert adm.allowed == {"k0", "k1"} and adm.last_selection.hit
    sched = adm.scheduler
    assert sched.hits == 1 and sched.batch.current == 4
    # Without a HIT the limit doubles, capped by the engine's max_num_seqs.
    for _ in range(10):
        adm.begin_pass(_pass(QueueView.from_rows([initial_row(NORMAL, 0.0, bound_tokens=10,
                                                              context_tokens=100,
                                                              prefill_tokens=10)])))
    assert sched.batch.current == 256


# ------------------------------------------------------------------ 003 hybrid gate

class RecordingGate(seed_hybrid.PrefillDecodeGate):
    def __init__(self, tm):
        super().__init__(tm)
        self.log = []

    def decide(self, waiting_prompt_tokens, decoding):
        c_p = self.prefill_cost(waiting_prompt_tokens) if len(waiting_prompt_tokens) else None
        d = super().decide(waiting_prompt_tokens, decoding)
        self.log.append((c_p, self.c_d, decoding, d))
        return d


def test_hybrid_gate_holds_admissions_per_gate_sequence():
    # Cheap marginal decode (0.25 ms per sequence and round), so C_d needs a few rounds to
    # outgrow a prefill of a resumed generation (2 ms + 0.106 ms per token).
    policy = HybridPolicy(name="hybrid-test", gate=True)
    gates = []

    def make_gate(ctx):
        from timelyllm_ros.papers.common import engine_profile as _profile
        from timelyllm_ros.papers.hybrid.policy import time_model_of
        g = RecordingGate(time_model_of(_profile(ctx)))
        gates.append(g)
        return g
    policy.make_gate = make_gate
    sch, eng, lis = make("fcfs-seg")
    from timelyllm_ros.core.sched.scheduler import SegmentScheduler
    sch = SegmentScheduler(eng, policy, sch.skill_sets, sch.exec_model, lis, sch.config)
    for tid, trace in MIXED:
        sch.submit(spec(tid, trace, eng))
    history = []

    def watch(s):
        history.append((s.queue_length(), len(s.running_request_ids())))
        return False
    drive(sch, eng, lis, until=watch)
    assert all(t.state == "done" for t in sch.tasks.values())
    assert_no_leaks(sch, eng)
    gate = gates[0]
    assert sch.gate_holds == sum(1 for *_, d in gate.log if d == "decode") > 0
    for c_p, c_d, decoding, d in gate.log:
        if decoding == 0:
            assert d == "prefill"
        else:
            assert d == ("decode" if c_p >= c_d else "prefill")
    # The paper's sequence: consecutive holds while C_d grows, then a prefill once C_d > C_p.
    seq = [d for *_, dec, d in gate.log if dec > 0]
    runs = "".join("d" if d == "decode" else "P" for d in seq)
    assert "ddP" in runs


def test_hybrid_orders_longest_first_and_nogate_has_no_gate():
    view = QueueView.from_rows([
        initial_row(NORMAL, 0.0, context_tokens=100, bound_tokens=10),
        initial_row(NORMAL, 1.0, context_tokens=400, bound_tokens=24),
        initial_row(NORMAL, 2.0, context_tokens=300, bound_tokens=10)])
    assert list(np.argsort(-get_policy("hybrid").priorities(view, 0.0))) == [1, 2, 0]
    ctx = SchedulerContext("sim", 16, 100, 10, profile=EngineProfile())
    assert get_policy("hybrid-nogate").make_gate(ctx) is None
    assert isinstance(get_policy("hybrid").make_gate(ctx), seed_hybrid.PrefillDecodeGate)


# ------------------------------------------------------------------ 004 LAMPS

def _lamps_run(seconds, link=4e9, policy="lamps"):
    # Resume lead 0: a suspended generation waits for its robot, so the pause really lasts the
    # segment's execution (without it an idle engine resumes it at the next step).
    engine = SimulatedEngine(host_link_bytes_per_s=link)
    sch, eng, lis = make(policy, engine=engine, exec_model=exec_model(seconds),
                         resume_lead_s=0.0)
    seen = []
    orig = sch.policy.pause_handling

    def record(pause):
        h = orig(pause)
        seen.append((pause, h))
        return h
    sch.policy.pause_handling = record
    sch.state.hooks = dataclasses.replace(sch.state.hooks, pause=True)
    # Resumed requests: prompt length, and the prompt tokens the engine found computed.
    resumed, cached = {}, {}
    orig_resume, orig_add, orig_step = eng.resume_request, eng.add_request, eng.step

    def resume(old, request):
        resumed[request.request_id] = len(request.prompt_token_ids)
        return orig_resume(old, request)

    def add(request):
        if not request.request_id.endswith("#0") and "#" in request.request_id:
            resumed[request.request_id] = len(request.prompt_token_ids)
        return orig_add(request)

    def step():
        outs = orig_step()
        for o in outs:
            if o.request_id in resumed and o.num_cached_tokens is not None:
                cached[o.request_id] = o.num_cached_tokens
        return outs
    eng.resume_request, eng.add_request, eng.step = resume, add, step
    sch._resumed, sch._cached = resumed, cached
    pinned = []
    for tid, trace in MIXED[:4]:
        sch.submit(spec(tid, trace, eng))
    drive(sch, eng, lis, until=lambda s: pinned.append(eng.pinned_blocks()) and False)
    assert all(t.state == "done" for t in sch.tasks.values())
    assert_no_leaks(sch, eng)
    assert_no_leaks_engine(eng)
    return sch, eng, seen, pinned


def test_lamps_preserves_short_pauses_in_scheduler_and_engine():
    sch, eng, seen, pinned = _lamps_run(0.001)
    assert seen and all(h == PRESERVE for _, h in seen)
    for pause, h in seen:
        ctx = pause.context
        assert pause.pause_s < 0.05
        t_fwd, t_swap = seed_lamps.engine_time_fns(EngineProfile(), host_link_bytes_per_s=4e9)
        assert pause.pause_s < seed_lamps.preserve_limit_s(
            c_i=pause.context_tokens, c_other=pause.other_tokens, c_batch=pause.batch_tokens,
            t_fwd=t_fwd, t_swap=t_swap)
        assert ctx.host_link_bytes_per_s == 4e9 and ctx.supports_pause_handling
    st = eng.pause_stats
    assert sch.pause_counts[PRESERVE] == st[PRESERVE] == len(seen)
    assert st[SWAP] == st["swap_out_s"] == st["swap_in_s"] == 0
    # Blocks stayed allocated during the pauses (memory cost), and were released by the end.
    assert max(pinned) > 0 and st["preserved_block_s"] > 0 and eng.pinned_blocks() == 0
    # No recompute: each resumed generation found all its context but the last token.
    assert len(sch._resumed) == len(seen)
    assert all(sch._cached[rid] == n - 1 for rid, n in sch._resumed.items())


def test_lamps_swaps_or_discards_long_pauses_and_engine_charges_copies():
    sch, eng, seen, pinned = _lamps_run(5.0)
    assert seen and all(h != PRESERVE for _, h in seen)
    for pause, h in seen:
        assert pause.pause_s > 4.9
        assert h == lamps_handling(pause)
    st = eng.pause_stats
    assert sch.pause_counts[SWAP] == st[SWAP] == len(seen) and max(pinned) == 0
    # Copies are priced at the documented link: tokens * 128 KiB / 4 GB/s.
    assert st["swap_out_tokens"] > 0
    assert st["swap_out_s"] == pytest.approx(st["swap_out_tokens"] * 131072 / 4e9)
    assert st["swap_in_s"] == pytest.approx(st["swap_in_tokens"] * 131072 / 4e9)
    # What the prefix cache does not hold comes back from the host, not from a prefill.
    assert all(sch._cached[rid] == n - 1 for rid, n in sch._resumed.items())


def test_lamps_discards_long_pauses_when_recompute_beats_the_link():
    # A slow link (0.5 GB/s): a round-trip copy of C tokens costs more than re-prefilling them.
    sch, eng, seen, _ = _lamps_run(5.0, link=5e8)
    assert seen and all(h == DISCARD for _, h in seen)
    assert sch.pause_counts[DISCARD] == len(seen) and eng.pause_stats[SWAP] == 0
    # Discarded: the partial last block is recomputed (only full blocks are prefix-cached).
    assert any(sch._cached[rid] < n - 1 for rid, n in sch._resumed.items())


def test_pause_handling_falls_back_to_discard_without_engine_support():
    class NoPauseEngine(SimulatedEngine):
        """An engine that declares no pause handling (like the real vLLM adapter)."""

        name = "no-pause"

        def capabilities(self):
            return dataclasses.replace(super().capabilities(), pause_handling=False)

    engine = NoPauseEngine(host_link_bytes_per_s=4e9)
    sch, eng, lis = make("lamps", engine=engine, exec_model=exec_model(0.001))
    assert not sch.context.supports_pause_handling
    for tid, trace in MIXED[:3]:
        sch.submit(spec(tid, trace, eng))
    drive(sch, eng, lis)
    assert sch.pause_counts[PRESERVE] == sch.pause_counts[SWAP] == 0
    assert sch.pause_counts[DISCARD] > 0
    assert_no_leaks(sch, eng)


def test_lamps_ranking_uses_memory_time_score_and_starvation():
    policy = get_policy("lamps", refresh_every=1, starvation_threshold=3)
    rows = [initial_row(NORMAL, 0.0, task_seq=0, context_tokens=3000, bound_tokens=24),
            initial_row(NORMAL, 0.0, task_seq=1, context_tokens=500, bound_tokens=10)]
    view = QueueView.from_rows(rows)
    pr = policy.priorities(view, 0.0)
    assert pr[1] > pr[0]  # less memory over time first
    # Keep admitting fresh small generations; the big one is promoted after 3 passes.
    for k in range(3):
        policy.on_admitted([1 + k], 0.0)
        view = QueueView.from_rows([rows[0], initial_row(NORMAL, 0.0, task_seq=2 + k,
                                                         context_tokens=500, bound_tokens=10)])
        pr = policy.priorities(view, 0.0)
    assert policy.queue.is_promoted(0) and pr[0] > pr[1]
    policy.on_task_end(0)
    assert 0 not in policy.queue


# ------------------------------------------------------------------ simulated engine pauses

def _engine_with_running(kv_blocks=2560, link=25e9):
    eng = SimulatedEngine(EngineProfile(kv_total_blocks=kv_blocks), host_link_bytes_per_s=link)
    prompt = eng.tokenize("shared system prompt " * 30)  # 90 tokens
    eng.add_request(EngineRequest("a", prompt, 64, scripted_text=" x" * 40))
    for _ in range(12):
        eng.step()
    return eng, prompt


def _resume_ids(eng, rid):
    seq = eng._paused[rid].seq
    return list(seq.tokens)


def test_engine_preserve_keeps_blocks_and_recomputes_one_token():
    eng, prompt = _engine_with_running()
    free_running = eng.kv_usage().free_blocks
    held = len(eng._by_id["a"].blocks)
    eng.suspend_request("a", PRESERVE)
    assert eng.kv_usage().free_blocks == free_running  # pinned: not free, not evictable
    assert eng.pinned_blocks() == held and eng.paused_handling("a") == PRESERVE
    ids = _resume_ids(eng, "a")
    eng.advance_idle(eng.now() + 2.0)
    eng.resume_request("a", EngineRequest("a#1", ids, 16, scripted_text=" y" * 3))
    assert eng.num_paused() == 0
    out = eng.step()
    t = eng.last_step_timing()
    assert t.prefill_tokens == 1 and t.extra["swap_s"] == 0
    assert out[0].num_cached_tokens == len(ids) - 1
    assert t.duration_s == pytest.approx(eng.profile.step_s(1, 1, len(ids)))
    assert eng.pause_stats["preserved_block_s"] == pytest.approx(held * 2.0)
    while eng.has_unfinished_requests():
        eng.step()
    assert_no_leaks_engine(eng)


def test_engine_swap_frees_blocks_and_charges_both_copies():
    eng, prompt = _engine_with_running()
    seq = eng._by_id["a"]
    computed = seq.num_computed
    free_running = eng.kv_usage().free_blocks
    eng.suspend_request("a", SWAP)
    assert eng.kv_usage().free_blocks == free_running + len(eng._paused["a"].seq.blocks or []) \
        or eng.kv_usage().free_blocks > free_running
    ids = _resume_ids(eng, "a")
    # Evict the prefix cache entirely so the whole context must come back from the host.
    eng._pool.cached.clear()
    for b in range(eng._pool.num_blocks):
        eng._pool.hash_of[b] = None
    eng.resume_request("a", EngineRequest("a#1", ids, 16, scripted_text=" y" * 3))
    eng.step()
    t = eng.last_step_timing()
    per_token = 131072 / 25e9
    swap_in = min(computed, len(ids) - 1)
    assert t.prefill_tokens == len(ids) - swap_in == 1
    # Swap-out (pending from the suspension) and swap-in are both charged to this step.
    assert t.extra["swap_s"] == pytest.approx((computed + swap_in) * per_token)
    assert t.duration_s == pytest.approx(eng.profile.step_s(1, 1, len(ids)) + t.extra["swap_s"])
    assert eng.pause_stats["swap_in_tokens"] == swap_in
    while eng.has_unfinished_requests():
        eng.step()
    assert_no_leaks_engine(eng)


def test_engine_swap_resume_served_by_prefix_cache_copies_only_the_tail():
    eng, prompt = _engine_with_running()
    computed = eng._by_id["a"].num_computed
    eng.suspend_request("a", SWAP)
    ids = _resume_ids(eng, "a")
    eng.resume_request("a", EngineRequest("a#1", ids, 16, scripted_text=" y"))
    eng.step()
    bs = eng.kv_usage().block_size
    cached_full = (len(ids) - 1) // bs * bs
    assert eng.pause_stats["swap_in_tokens"] == min(computed, len(ids) - 1) - cached_full


def test_engine_discard_is_abort_and_recomputes_the_uncached_tail():
    eng, prompt = _engine_with_running()
    eng.suspend_request("a", DISCARD)
    assert eng.num_paused() == 0 and eng.pause_stats[DISCARD] == 1
    kv = eng.kv_usage()
    assert kv.free_blocks == kv.total_blocks  # freed to the evictable cache


def test_engine_revokes_preserved_pause_before_preempting_running():
    # 12 blocks: "a" (90 + 12 tokens, 7 blocks) is preserved; "b" needs 7 more of its own.
    eng, prompt = _engine_with_running(kv_blocks=12)
    eng.suspend_request("a", PRESERVE)
    other = eng.tokenize("a different prompt " * 30)
    eng.add_request(EngineRequest("b", other, 64, scripted_text=" z" * 40))
    for _ in range(40):
        eng.step()
    assert eng.pause_stats["preserve_revoked"] == 1 and eng.pinned_blocks() == 0
    assert eng.paused_handling("a") == DISCARD
    eng.abort_request("a")
    while eng.has_unfinished_requests():
        eng.step()
    assert_no_leaks_engine(eng)


def test_lamps_handling_thresholds_follow_the_seed_selector():
    ctx = SchedulerContext("sim", 16, 2560, 10, profile=EngineProfile(),
                           supports_pause_handling=True)

    def pause(s, c=3000, other=12000):
        return PauseInfo("t", c, other, s, 0.0, 1, False, ctx)
    t_fwd, t_swap = seed_lamps.engine_time_fns(EngineProfile())
    limit = seed_lamps.preserve_limit_s(c_i=3000, c_other=12000, c_batch=15000, t_fwd=t_fwd,
                                        t_swap=t_swap)
    assert 0.1 < limit < 0.2  # 1.05e-5 s x C_batch (docs/seeds-002-004.md)
    assert lamps_handling(pause(limit * 0.9)) == PRESERVE
    assert lamps_handling(pause(limit * 1.1)) == SWAP
    assert lamps_handling(pause(3.0)) == SWAP
