"""MC-SF's vLLM-like baselines (seed 001) as bench policies on the clearing simulated engine.

Engine: clear on overflow (all, or each with probability beta), lost progress regenerated
silently, cleared work not served back from the prefix cache. Policies: alpha-protection
admission in arrival order, simulation-only engine check, parameters. Bench: WID1 end to end,
and a tight KV where alpha-greedy livelocks (the paper's T4 loop) while beta-clearing finishes.
"""

from __future__ import annotations

import dataclasses

import pytest

from timelyllm_ros.core.engine.factory import EngineSpec, build_engine

from fakes import SKILL_SETS, make, spec

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.workloads import shorten
from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.papers.mcsf.engine import ClearingSimulatedEngine
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies import get_policy, policy_names
from timelyllm_ros.papers.mcsf.baselines import (AlphaProtectionAdmission,
                                                                       batch_kv_tokens)
from timelyllm_ros.core.sched.interface import Candidate, RunningGen
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.lrtrace.workload import compose, load_traces, load_workload

BASELINES = ["mcsf-alpha-greedy", "mcsf-alpha-beta"]
# 4-token blocks so that a few short requests can overflow the KV.
SMALL_BLOCKS = dict(kv_block_size=4)
A_SCRIPT, B_SCRIPT = " y" * 24, " w" * 8


def _staggered_pair(engine, b_joins_at=12):
    """A (4-token prompt, 24 tokens) alone, then B (12-token prompt, 8 tokens): with 10 blocks of
    4 tokens they overflow together at step 17, yet fit when both restart from their prompts."""
    tok = engine.tokenize
    engine.add_request(EngineRequest("A", tok("p" + " x" * 3), 100, scripted_text=A_SCRIPT))
    outputs, cleared_steps, used = [], [], []
    step = 0
    while engine.has_unfinished_requests():
        if step == b_joins_at:
            engine.add_request(EngineRequest("B", tok("q" + " z" * 11), 100,
                                             scripted_text=B_SCRIPT))
        outputs.append(engine.step())
        extra = engine.last_step_timing().extra
        if extra.get("cleared"):
            cleared_steps.append((step, extra["cleared"]))
        kv = engine.kv_usage()
        used.append(kv.total_blocks - kv.free_blocks)
        step += 1
        assert step < 500
    return outputs, cleared_steps, used


def _text(outputs):
    text = {}
    for step in outputs:
        for out in step:
            text[out.request_id] = text.get(out.request_id, "") + out.new_text
    return text


def _assert_kv_all_free(engine):
    kv = engine.kv_usage()
    assert kv.free_blocks == kv.total_blocks
    assert not engine.has_unfinished_requests()
    assert all(r == 0 for r in engine._pool.ref)


# ------------------------------------------------------------------ engine

def test_clear_all_empties_batch_and_emits_each_token_once_in_order():
    engine = ClearingSimulatedEngine(EngineProfile(kv_total_blocks=10, **SMALL_BLOCKS))
    outputs, cleared_steps, used = _staggered_pair(engine)
    assert cleared_steps == [(17, ["A", "B"])]
    # The clearing step ran nothing: the batch was emptied.
    assert outputs[17] == []
    text = _text(outputs)
    assert text == {"A": A_SCRIPT, "B": B_SCRIPT}
    for rid in ("A", "B"):
        emitted = [o for step in outputs for o in step if o.request_id == rid]
        assert all(len(o.new_token_ids) == 1 for o in emitted)  # nothing empty, nothing twice
        assert [o.finished for o in emitted] == [False] * (len(emitted) - 1) + [True]
    # A had emitted 17 tokens, B 5 when they were cleared: all regenerated.
    assert engine.clear_stats == {"overflow_events": 1, "requests_cleared": 2,
                                  "tokens_regenerated": 22, "lost_rounds": 0, "lost_s": 0.0}
    assert max(used) <= 10
    _assert_kv_all_free(engine)


def test_regeneration_costs_decode_steps():
    profile = EngineProfile(kv_total_blocks=10, **SMALL_BLOCKS)
    roomy = ClearingSimulatedEngine(dataclasses.replace(profile, kv_total_blocks=100))
    uncleared, none_cleared, _ = _staggered_pair(roomy)
    assert none_cleared == [] and roomy.clear_stats["requests_cleared"] == 0
    cleared_engine = ClearingSimulatedEngine(profile)
    cleared, _, _ = _staggered_pair(cleared_engine)
    # A regenerates its 17 tokens (B its 5 alongside) and the clearing step itself ran nothing.
    assert len(cleared) - len(uncleared) == 17 + 1
    step_s = profile.decode_step_s(1, 40)
    extra_s = cleared_engine.now() - roomy.now()
    assert 15 * step_s < extra_s < 20 * step_s
    # vLLM-like preemption by recompute keeps the progress, so it is cheaper than clearing.
    preempting = SimulatedEngine(profile)
    _staggered_pair(preempting)
    assert roomy.now() <= preempting.now() < cleared_engine.now()


def test_cleared_request_recomputes_its_prompt_instead_of_hitting_its_own_blocks():
    engine = ClearingSimulatedEngine(EngineProfile(kv_total_blocks=10, **SMALL_BLOCKS))
    tok = engine.tokenize
    a_prompt, b_prompt = tok("p" + " x" * 3), tok("q" + " z" * 11)
    engine.add_request(EngineRequest("A", a_prompt, 100, scripted_text=A_SCRIPT))
    for step in range(19):
        if step == 12:
            engine.add_request(EngineRequest("B", b_prompt, 100, scripted_text=B_SCRIPT))
        engine.step()
    timing = engine.last_step_timing()  # step 18: readmission after the clear in step 17
    assert timing.extra["admitted"] == ["A", "B"]
    assert timing.prefill_tokens == len(a_prompt) + len(b_prompt)
    assert timing.extra["cached_tokens"] == 0


def test_beta_clearing_is_deterministic_per_seed_and_clears_subsets():
    def run(seed):
        engine = ClearingSimulatedEngine(EngineProfile(kv_total_blocks=14, **SMALL_BLOCKS),
                                         beta=0.5, seed=seed)
        tok = engine.tokenize
        events, text, peak = [], {}, 0
        step = 0
        while step < 24 or engine.has_unfinished_requests():
            if step % 4 == 0 and step < 24:
                i = step // 4
                engine.add_request(EngineRequest(f"r{i}", tok(f"p{i}" + " x" * 5), 100,
                                                 scripted_text=" y" * (10 + 3 * i)))
            for out in engine.step():
                text[out.request_id] = text.get(out.request_id, "") + out.new_text
            timing = engine.last_step_timing()
            if timing.extra["cleared"]:
                events.append((step, tuple(timing.extra["cleared"]), timing.batch_size))
            kv = engine.kv_usage()
            peak = max(peak, kv.total_blocks - kv.free_blocks)
            step += 1
            assert step < 2000, "beta-clearing did not resolve the overflow"
        assert text == {f"r{i}": " y" * (10 + 3 * i) for i in range(6)}
        assert peak <= 14
        _assert_kv_all_free(engine)
        return events, engine.now(), dict(engine.clear_stats)

    first = run(3)
    assert run(3) == first
    assert run(4) != first
    events, _, stats = first
    assert stats["overflow_events"] == len(events) > 0
    # Some overflow was resolved by clearing only part of the batch: survivors kept decoding.
    assert any(survivors > 0 for _, _, survivors in events)
    assert stats["requests_cleared"] == sum(len(c) for _, c, _ in events)
    assert stats["tokens_regenerated"] > 0


def test_lost_round_when_a_draw_clears_too_little_costs_time_and_retries():
    # With a tiny beta most draws clear nobody: each such round is lost (the paper's rule).
    engine = ClearingSimulatedEngine(EngineProfile(kv_total_blocks=10, **SMALL_BLOCKS),
                                     beta=0.05, seed=0)
    outputs, cleared_steps, _ = _staggered_pair(engine)
    assert _text(outputs) == {"A": A_SCRIPT, "B": B_SCRIPT}
    assert engine.clear_stats["lost_rounds"] > 0
    assert engine.clear_stats["lost_s"] == pytest.approx(
        engine.clear_stats["lost_rounds"] * EngineProfile().decode_step_s(2, 0), rel=0.03)
    _assert_kv_all_free(engine)


def test_engine_validates_beta():
    for bad in (0, 0.0, -0.5, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="beta"):
            ClearingSimulatedEngine(beta=bad)
    assert ClearingSimulatedEngine(beta=1.0).name == "sim-clearing"


# ------------------------------------------------------------------ policies

def test_policies_registered_with_paper_defaults_and_own_engine():
    names = policy_names()
    greedy, beta = get_policy("mcsf-alpha-greedy"), get_policy("mcsf-alpha-beta")
    assert set(BASELINES) <= set(names)
    assert (greedy.alpha, greedy.beta) == (0.25, None)
    assert (beta.alpha, beta.beta) == (0.1, 0.1)
    for p in (greedy, beta):
        assert p.dispatch == "segment" and p.requires_engine == "sim-clearing"
        engine = build_engine(EngineSpec(profile=EngineProfile(), max_num_seqs=8),
                              p.engine_needs())
        assert isinstance(engine, ClearingSimulatedEngine) and engine.max_num_seqs == 8
        assert engine.beta == p.beta
    with pytest.raises(TypeError):
        get_policy("mcsf-alpha-greedy", beta=0.5)  # greedy clears everything, by name


@pytest.mark.parametrize("name,params,word", [
    ("mcsf-alpha-greedy", {"alpha": 1.0}, "alpha"),
    ("mcsf-alpha-greedy", {"alpha": -0.1}, "alpha"),
    ("mcsf-alpha-greedy", {"alpha": float("nan")}, "alpha"),
    ("mcsf-alpha-beta", {"alpha": 2}, "alpha"),
    ("mcsf-alpha-beta", {"beta": 0.0}, "beta"),
    ("mcsf-alpha-beta", {"beta": 1.01}, "beta"),
    ("mcsf-alpha-beta", {"beta": None}, "beta"),
    ("mcsf-alpha-beta", {"seed": 1.5}, "seed"),
])
def test_parameter_validation_names_the_parameter(name, params, word):
    with pytest.raises(ValueError, match=rf"{name}.*{word}"):
        get_policy(name, **params)


@pytest.mark.parametrize("name", BASELINES)
def test_policy_refuses_any_other_engine(name):
    with pytest.raises(ValueError, match=rf"{name}.*sim-clearing"):
        SegmentScheduler(SimulatedEngine(), get_policy(name), SKILL_SETS,
                         ExecutionTimeModel.from_mapping(
                             {"version": 1, "skills": {"default": {"kind": "constant",
                                                                   "seconds": 1.0}}}),
                         listener=None, config=SchedulerConfig())


def _gen(context, shared, skill="drone"):
    return RunningGen("k", context, 0, 10, 0.0, False, skill, shared)


def _cand(context, shared, skill="drone"):
    return Candidate("c", 0, context, 10, context - shared, 1, 0.0, False, 0, skill, shared)


def test_alpha_admission_counts_usage_plus_s_against_protected_budget():
    # M = 100 blocks of 16 = 1600 tokens; alpha 0.25 leaves 1200.
    adm = AlphaProtectionAdmission(0.25, 1600, 16)
    assert adm.budget_tokens == 1200
    batch = [_gen(500, 416), _gen(500, 416)]
    # The shared prefix (26 blocks) once, and 84 own tokens -> 6 blocks per generation.
    assert batch_kv_tokens(batch, 16) == (26 + 6 + 6) * 16 == 608
    assert adm.usage_and_size(batch, _cand(500, 416)) == (608, 96)
    assert adm.may_admit_candidate(batch, _cand(500, 416), free_kv_blocks=0)[0]
    # Another skill set brings its own prefix: 608 + 640 + 64 = 1312 > 1200.
    ok, why = adm.may_admit_candidate(batch, _cand(700, 640, "arm"), free_kv_blocks=10_000)
    assert not ok and "usage 608 + s 704 >" in why
    # Exactly at the budget is admitted, one block more is not.
    assert adm.may_admit_candidate([], _cand(1200, 0), 0)[0]
    assert not adm.may_admit_candidate([], _cand(1201, 0), 0)[0]
    assert adm.skip_refused is False and adm.refusals == 2


def test_scheduler_admits_in_arrival_order_until_the_first_refusal():
    # ~26 shared + 2 own blocks per drone generation; 40 blocks, alpha 0.25 -> 30 blocks budget.
    engine = ClearingSimulatedEngine(EngineProfile(kv_total_blocks=40))
    sch, eng, lis = make("mcsf-alpha-greedy", engine=engine)
    eng.advance_idle(eng.now() + 1.0)
    arrivals = {"late": 0.9, "first": 0.1, "third": 0.5, "second": 0.3}
    for tid, at in arrivals.items():
        sch.submit(dataclasses.replace(spec(tid, 1, eng), arrival_s=eng.now() - 1.0 + at))
    sch.tick()
    running = [sch.state.running[rid].task_id for rid in sch.running_request_ids()]
    by_arrival = sorted(arrivals, key=arrivals.get)
    assert 0 < len(running) < len(by_arrival)
    assert running == by_arrival[:len(running)]
    adm = sch.admission.controller
    refused = sch.tasks[by_arrival[len(running)]]
    cand = _cand(len(refused.prompt_ids), sch.state.shared_of[refused.task_id])
    usage, size = adm.usage_and_size(sch.admission.inputs.batch_state(eng.now()), cand)
    assert usage + size > adm.budget_tokens
    assert adm.refusals == 1


# ------------------------------------------------------------------ bench

def _plans_emitted_once(result):
    traces = load_traces()
    for task in result.tasks:
        assert "".join(s.text for s in task.segments) == traces[task.trace_id].plan, task.task_id


@pytest.mark.parametrize("name", BASELINES)
def test_bench_run_on_wid1_finishes_every_task(name):
    w = shorten(load_workload("WID1"), 40)
    result = run_policy(compose(w), name, w, BenchConfig())
    assert result.tasks and all(t.state == "done" for t in result.tasks)
    _plans_emitted_once(result)


def _tight_run(name, alpha):
    # Skill sets' own prompts (~420 drone tokens, 26 shared blocks) in 38 blocks.
    profile = EngineProfile(kv_total_blocks=38)
    config = BenchConfig(profile=profile, prompt_tokens=None, max_overrun_s=60.0,
                         policy_params={name: {"alpha": alpha}})
    engine = build_engine(EngineSpec(profile=profile), get_policy(name, alpha=alpha).engine_needs())
    w = shorten(load_workload("WID1"), 40)
    try:
        return run_policy(compose(w), name, w, config, engine=engine), engine, None
    except RuntimeError as err:
        return None, engine, err


def test_tight_kv_beta_clearing_clears_and_finishes():
    result, engine, err = _tight_run("mcsf-alpha-beta", 0.05)
    assert err is None
    assert engine.clear_stats["requests_cleared"] > 0
    assert engine.clear_stats["tokens_regenerated"] > 0
    assert all(t.state == "done" for t in result.tasks)
    _plans_emitted_once(result)
    _assert_kv_all_free(engine)


def test_tight_kv_alpha_greedy_livelock_is_reported_not_hung():
    # The paper's T4 loop: clear-all readmits the same set, which overflows at the same point.
    result, engine, err = _tight_run("mcsf-alpha-greedy", 0.05)
    stats = engine.clear_stats
    if err is not None:
        assert "still running" in str(err) and "mcsf-alpha-greedy" in str(err)
        assert stats["overflow_events"] > 100 and stats["requests_cleared"] > stats[
            "overflow_events"]
    else:  # if the loop ever breaks, it must have cleared and still finished everything
        assert stats["requests_cleared"] > 0
        assert all(t.state == "done" for t in result.tasks)
        _plans_emitted_once(result)
