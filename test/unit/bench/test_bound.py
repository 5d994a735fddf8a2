"""The upper bound (bench/bound.py): each task's first segment served alone on a warm engine."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from timelyllm_ros.bench.bound import (add_bound, alone_latency_s, first_segment_tokens,
                                       fraction_of_bound, upper_bound)
from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.metrics import compute_metrics, format_table, results_json
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.workloads import shorten
from timelyllm_ros.cli import bench as cli
from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import NoPrefixCacheEngine, SimulatedEngine
from timelyllm_ros.core.skills.skillset import load_skillsets
from timelyllm_ros.core.tuf import default_config_dir
from timelyllm_ros.lrtrace.workload import Event, TaskSpec, compose, load_workload

SKILL_SETS = load_skillsets(default_config_dir() / "skillsets")


def _lone_engine_time(engine: SimulatedEngine, prompt: list[int], tokens: int) -> float:
    """Engine clock from submission of a lone request until its `tokens`-th token is out."""
    start = engine.now()
    engine.add_request(EngineRequest(f"r{start}", prompt, max_tokens=tokens,
                                     scripted_text=" word" * tokens))
    out = 0
    while out < tokens:
        out += sum(len(o.new_token_ids) for o in engine.step())
    assert not engine.has_unfinished_requests()
    return engine.now() - start


@pytest.mark.parametrize("prompt_tokens, budget, tokens", [
    (421, 8192, 1), (421, 8192, 5), (2884, 8192, 24), (5000, 2048, 3), (700, 256, 2)])
def test_alone_latency_is_what_the_simulated_engine_charges(prompt_tokens, budget, tokens):
    profile = dataclasses.replace(EngineProfile(), max_num_batched_tokens=budget)
    prompt = list(range(1000, 1000 + prompt_tokens))
    cold = _lone_engine_time(NoPrefixCacheEngine(profile), prompt, tokens)
    assert alone_latency_s(profile, prompt_tokens, 0, tokens) == pytest.approx(cold, abs=1e-12)
    # Warm: the prompt's first blocks cached by an earlier request of the same prefix.
    engine = SimulatedEngine(profile)
    _lone_engine_time(engine, prompt[:prompt_tokens // 2], 1)
    cached = (prompt_tokens // 2) // profile.kv_block_size * profile.kv_block_size
    warm = _lone_engine_time(engine, prompt, tokens)
    assert alone_latency_s(profile, prompt_tokens, cached, tokens) == \
        pytest.approx(warm, abs=1e-12)
    assert warm <= cold


def test_first_segment_is_the_first_statement_or_the_whole_plan():
    engine = SimulatedEngine()
    drone = SKILL_SETS["drone"]
    plan = "mf,50;tc,90;mf,20;"
    n = first_segment_tokens(engine, drone, plan, 100)
    assert engine.decode(engine.tokenize(plan)[:n]) == "mf,50;"
    # One statement without its terminator: the whole plan, dispatched when generation ends.
    assert first_segment_tokens(engine, drone, "mf,50", 100) == len(engine.tokenize("mf,50"))
    # The task's token budget cuts the plan: what was generated goes out when it ends.
    assert first_segment_tokens(engine, drone, plan, 3) == 3
    assert first_segment_tokens(engine, drone, "", 100) == 0


@pytest.mark.parametrize("prompt_tokens", [None, 2884])
@pytest.mark.parametrize("trace_id, level", [(1, "normal"), (6, "urgent"), (9, "normal")])
def test_a_lone_task_gets_exactly_its_bound(prompt_tokens, trace_id, level):
    """One task on an idle engine is served exactly as the bound says, by every policy that
    dispatches its first statement at once and keeps the prefix cache."""
    workload = load_workload("WID1")
    events = [Event(3.0, 0, (TaskSpec(0, "robot_1", trace_id, level),))]
    config = BenchConfig(prompt_tokens=prompt_tokens, baseline_prefix_cache=True)
    (bound,) = upper_bound(events, workload, config)
    assert bound.uncached_tokens < bound.prompt_tokens  # the shared prefix is cached
    for policy in ("vllm-stream", "vllm-priority", "fcfs-seg"):
        (task,) = run_policy(events, policy, workload, config).tasks
        assert task.response_time_s == pytest.approx(bound.response_time_s, abs=1e-9)
        assert task.utility == pytest.approx(bound.utility, abs=1e-9)


@pytest.fixture(scope="module")
def loaded():
    """WID1's first 40 s at 8x its event rate: the engine is shared by many tasks."""
    workload = shorten(dataclasses.replace(load_workload("WID1"), eps=2.0), 40.0)
    events = compose(workload)
    config = BenchConfig(prompt_tokens=None, baseline_prefix_cache=True)
    runs = {p: run_policy(events, p, workload, config) for p in ("vllm-stream", "vllm")}
    return workload, events, config, runs


def test_no_policy_beats_the_bound(loaded):
    workload, events, config, runs = loaded
    bound = {b.task_id: b for b in upper_bound(events, workload, config)}
    assert len(bound) == sum(len(e.tasks) for e in events)
    for run in runs.values():
        for task in run.tasks:
            b = bound[task.task_id]
            assert b.task_type == task.task_type and b.ert_s == task.ert_s
            # A few ms of prefill can be saved when a task's whole prompt was cached by an
            # identical earlier one; nothing else is faster than being alone.
            assert task.response_time_s >= b.alone_response_time_s - 0.005
            assert task.utility <= b.alone_utility + 1e-9
            # The burst bound holds for an event's tasks together, not for each of them.
            assert b.utility <= b.alone_utility + 1e-12
        for event in events:
            ids = [f"t{s.task_id:05d}" for s in event.tasks]
            got = {t.task_id: t.utility for t in run.tasks}
            assert sum(got[i] for i in ids) <= sum(bound[i].utility for i in ids) + 1e-9


def test_bound_block_and_fraction(loaded):
    workload, events, config, runs = loaded
    doc = add_bound(results_json(runs, {}), upper_bound(events, workload, config))
    b = doc["bound"]
    assert b["tasks"] == sum(len(e.tasks) for e in events)
    assert set(b["by_type"]) == {"drone-normal", "drone-urgent"}
    assert math.isnan(b["overall"]["waiting_time_mean_s"])
    alone = doc["bound_alone"]
    assert alone["tasks"] == b["tasks"]
    assert b["overall"]["utility_mean"] <= alone["overall"]["utility_mean"] + 1e-12
    for name, m in doc["policies"].items():
        assert m["utility_fraction_of_bound"] == pytest.approx(
            m["overall"]["utility_mean"] / b["overall"]["utility_mean"])
        assert m["utility_fraction_of_bound"] <= 1.0 + 1e-9
    # Whole-plan dispatch answers later than streaming, so it is further from the bound.
    assert doc["policies"]["vllm"]["utility_fraction_of_bound"] < \
        doc["policies"]["vllm-stream"]["utility_fraction_of_bound"]
    table = format_table(doc)
    assert table.splitlines()[0].split()[-1] == "of_bound"
    assert any(line.startswith("bound ") for line in table.splitlines())
    # The bound's metrics are the paper's metrics over its tasks.
    assert b["overall"] == pytest.approx(
        compute_metrics(upper_bound(events, workload, config))["overall"], nan_ok=True)


def test_fraction_needs_a_positive_bound():
    assert fraction_of_bound(1.0, 2.0) == 0.5
    assert math.isnan(fraction_of_bound(1.0, 0.0))
    assert math.isnan(fraction_of_bound(1.0, -1.0))
    assert math.isnan(fraction_of_bound(None, 1.0))
    assert math.isnan(fraction_of_bound(float("nan"), 1.0))


def test_cli_bound_row_and_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["--workload", "WID1", "--duration-s", "20", "--policies", "vllm-stream,vllm-priority",
            "--prompt-tokens", "none", "--baseline-prefix-cache", "on", "--no-progress",
            "--json", str(out)]
    assert cli.main([*argv, "--bound"]) == 0
    doc = json.loads(out.read_text())
    assert doc["bound"]["tasks"] == doc["workload"]["tasks"]
    for m in doc["policies"].values():
        assert 0 < m["utility_fraction_of_bound"] <= 1.0
    assert "\nbound " in capsys.readouterr().out
    # Without --bound the document is what it was.
    assert cli.main(argv) == 0
    doc = json.loads(out.read_text())
    assert "bound" not in doc
    assert all("utility_fraction_of_bound" not in m for m in doc["policies"].values())


def test_a_tasks_own_context_is_prefilled_in_its_bound():
    """A task's own context (`TaskSpec.context`, appended to its instruction) is not in the
    shared prefix: its bound pays for it, exactly as a lone replay does."""
    if "context" not in {f.name for f in dataclasses.fields(TaskSpec)}:
        pytest.skip("this checkout's workloads have no per-task context")
    workload = load_workload("WID1")
    context = " scene" * 300
    config = BenchConfig(prompt_tokens=None, baseline_prefix_cache=True)
    plain = [Event(3.0, 0, (TaskSpec(0, "robot_1", 1, "normal"),))]
    with_context = [Event(3.0, 0, (TaskSpec(0, "robot_1", 1, "normal", context=context),))]
    (a,), (b,) = upper_bound(plain, workload, config), upper_bound(with_context, workload, config)
    assert b.uncached_tokens >= a.uncached_tokens + 300 - config.load_profile().kv_block_size
    assert b.response_time_s > a.response_time_s
    (task,) = run_policy(with_context, "vllm-stream", workload, config).tasks
    assert task.response_time_s == pytest.approx(b.response_time_s, abs=1e-9)
