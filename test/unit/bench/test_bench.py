"""Bench harness, metrics, CLI and plots (simulated engine, virtual time)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from timelyllm_ros.core.sched.interface import SegmentDispatch

from timelyllm_ros.cli import bench as cli
from timelyllm_ros.bench.config import PAPER_PROMPT_TOKENS, BenchConfig
from timelyllm_ros.bench.engines import EnginePool, build_engine
from timelyllm_ros.bench.progress import ReplayProgress
from timelyllm_ros.bench.prompts import pad_skill_sets
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.results import TaskResult, task_type
from timelyllm_ros.bench.simulated_robots import SimulatedRobots
from timelyllm_ros.bench.workloads import shorten
from timelyllm_ros.bench.metrics import (METRIC_KEYS, compute_metrics, format_table, json_safe,
                                         results_json)
from timelyllm_ros.core.engine.sim.tokenizer import PieceTokenizer
from timelyllm_ros.core.engine.vllm_engine_config import VllmEngineConfig
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.skills.skillset import load_skillsets
from timelyllm_ros.core.tuf import default_config_dir
from timelyllm_ros.core.skills.base import SkillCall

from timelyllm_ros.lrtrace.workload import compose, load_workload


@pytest.fixture(scope="module")
def small():
    """WID1's first 45 s (mixed normal/urgent drone tasks), seed 1."""
    workload = shorten(load_workload("WID1"), 45.0)
    events = compose(workload)
    assert events, "the shortened workload must contain events"
    return workload, events


@pytest.fixture(scope="module")
def small_runs(small):
    workload, events = small
    return {p: run_policy(events, p, workload, BenchConfig.paper()) for p in ("vllm", "timelyllm")}


# ------------------------------------------------------------------ end to end

def test_timelyllm_beats_vllm_on_utility(small_runs):
    for run in small_runs.values():
        assert run.tasks and all(t.state == "done" for t in run.tasks)
    m = {p: compute_metrics(r.tasks)["overall"] for p, r in small_runs.items()}
    assert m["timelyllm"]["utility_mean"] > m["vllm"]["utility_mean"]
    assert m["timelyllm"]["waiting_time_mean_s"] < m["vllm"]["waiting_time_mean_s"]
    # Normal tasks keep at least vLLM's utility.
    by = {p: compute_metrics(r.tasks)["by_type"] for p, r in small_runs.items()}
    assert by["timelyllm"]["drone-normal"]["utility_mean"] >= \
        by["vllm"]["drone-normal"]["utility_mean"] - 1e-9


def test_defaults_are_the_modern_configuration(small):
    workload, events = small
    cfg = BenchConfig()
    assert cfg.prompt_tokens is None and cfg.baseline_prefix_cache is True
    run = run_policy(events[:3], "vllm-stream", workload, cfg)
    assert run.config["engine_prefix_cache"] is True
    assert run.config["prompt_tokens_min"] < 500  # the drone skill set's own prompt


def test_paper_config_is_the_papers_configuration(small_runs):
    vllm, tl = small_runs["vllm"].config, small_runs["timelyllm"].config
    # 2884-token prompts; the baseline without prefix caching, TimelyLLM with it; TimelyLLM uses
    # its own latency-guided admission (no cap).
    assert vllm["prompt_tokens"] == tl["prompt_tokens"] == PAPER_PROMPT_TOKENS
    assert vllm["prompt_tokens_min"] == tl["prompt_tokens_min"] == PAPER_PROMPT_TOKENS
    assert vllm["engine_prefix_cache"] is False and tl["engine_prefix_cache"] is True
    assert tl["policy_batch_cap"] is None and tl["segmented_batch_cap"] is None


def test_short_prompt_and_baseline_cache_on(small):
    workload, events = small
    events = events[:3]
    cfg = BenchConfig(prompt_tokens=None, baseline_prefix_cache=True)
    run = run_policy(events, "vllm", workload, cfg)
    assert run.config["engine_prefix_cache"] is True
    assert 400 < run.config["prompt_tokens_min"] < 500  # the drone skill set's own prompt
    long = run_policy(events, "vllm", workload, replace(cfg, prompt_tokens=PAPER_PROMPT_TOKENS))
    # The fixed preamble is shared and cached: response times grow only by the longer context.
    short_rt = np.mean([t.response_time_s for t in run.tasks])
    long_rt = np.mean([t.response_time_s for t in long.tasks])
    assert short_rt < long_rt < short_rt + 0.3


def test_pad_skill_sets():
    sets = load_skillsets(default_config_dir() / "skillsets")
    instructions = {"drone": ["find a bottle", "fly up and look around for a red ball please"]}
    padded = pad_skill_sets(sets, 2884, instructions)
    tok = PieceTokenizer()

    def length(ss, text):
        return len(tok.tokenize("\n".join(m["content"] for m in ss.render_messages(text)) + "\n"))

    drone = padded["drone"]
    assert length(drone, "find a bottle") == 2884  # the shortest prompt has exactly N tokens
    assert length(drone, instructions["drone"][1]) > 2884
    # A fixed preamble in front of the original prompt: shared by every task of the set.
    assert drone.system_prompt.endswith(sets["drone"].system_prompt)
    assert padded["arm"] is sets["arm"] and padded["chat"] is sets["chat"]  # no instructions
    assert pad_skill_sets(sets, None, instructions) == sets
    assert pad_skill_sets(sets, 10, instructions)["drone"] is sets["drone"]  # already longer


def test_engine_pool_rebuilds_only_on_cache_or_scheduling_change():
    built = []

    class Fake:
        def __init__(self, cache, policy):
            self.cache, self.closed = cache, False
            self.scheduling = policy.engine_scheduling if policy else "fcfs"
            built.append(self)

        def shutdown(self):
            self.closed = True

    pool = EnginePool(BenchConfig(), build=lambda cfg, prefix_cache, policy: Fake(prefix_cache,
                                                                                   policy))
    a = pool.get(False)
    assert pool.get(False) is a and len(built) == 1
    b = pool.get(True)
    assert a.closed and b.cache is True and len(built) == 2
    # Same cache setting and scheduling: kept; a policy that wants vLLM's priority scheduling
    # (the BROS family) gets an engine built for it.
    assert pool.get(True, get_policy("timelyllm")) is b and len(built) == 2
    c = pool.get(True, get_policy("bros"))
    assert b.closed and c.scheduling == "priority" and len(built) == 3
    pool.shutdown()
    assert c.closed


def test_real_engine_gets_the_policys_scheduling(monkeypatch):
    from timelyllm_ros.core.engine import vllm_engine
    monkeypatch.setattr(vllm_engine, "VllmEngine", lambda config, **_: config)
    cfg = BenchConfig(engine="vllm", model="some/model")
    assert build_engine(cfg, policy=get_policy("bros")).scheduling_policy == "priority"
    assert build_engine(cfg, policy=get_policy("timelyllm")).scheduling_policy == "fcfs"
    override = BenchConfig(engine="vllm", model="m", vllm_config={"scheduling_policy": "fcfs"})
    assert build_engine(override, policy=get_policy("bros")).scheduling_policy == "fcfs"
    with pytest.raises(ValueError, match="scheduling_policy"):
        VllmEngineConfig(model="m", scheduling_policy="lifo")


def test_real_engine_gets_an_explicit_profile_only(monkeypatch):
    from timelyllm_ros.core.engine import vllm_engine
    profiles = []
    monkeypatch.setattr(vllm_engine, "VllmEngine",
                        lambda config, profile=None, **_: profiles.append(profile) or config)
    fp32 = "config/engine_profiles/vllm-cpu-smollm2-135m-fp32.yaml"
    build_engine(BenchConfig(engine="vllm", model="m", profile=fp32))
    build_engine(BenchConfig(engine="vllm", model="m"))
    # The measured profile reaches the engine (and so the policies' SchedulerContext); without
    # one the real engine gets none, not the simulated default.
    assert profiles[0] is not None and profiles[0].name == "vllm-cpu-smollm2-135m-fp32"
    assert profiles[1] is None


def test_real_engine_baseline_without_prefix_cache(monkeypatch):
    from timelyllm_ros.core.engine import vllm_engine
    seen = []
    monkeypatch.setattr(vllm_engine, "VllmEngine",
                        lambda config, **_: seen.append(config) or config)
    cfg = BenchConfig(engine="vllm", model="some/model")
    assert build_engine(cfg, prefix_cache=False).enable_prefix_caching is False
    assert build_engine(cfg).enable_prefix_caching is True
    assert cfg.effective_prompt_tokens is None  # prompts are padded on the simulated engine only
    assert VllmEngineConfig.from_mapping(
        {"model": "m", "enable_prefix_caching": False}).enable_prefix_caching is False


def test_same_seed_same_results(small, small_runs):
    workload, events = small
    again = run_policy(events, "timelyllm", workload, BenchConfig.paper())
    first = small_runs["timelyllm"]

    def key(run):
        return [(t.task_id, t.response_time_s, t.utility, t.waiting_time_s, t.completion_s)
                for t in run.tasks]

    assert key(again) == key(first)
    assert compute_metrics(again.tasks)["overall"] == compute_metrics(first.tasks)["overall"]


def test_robot_durations_do_not_depend_on_policy(small_runs):
    # Same seed => every task's robot execution time is identical under both policies.
    a = {t.task_id: t.execution_s for t in small_runs["vllm"].tasks}
    b = {t.task_id: t.execution_s for t in small_runs["timelyllm"].tasks}
    assert a.keys() == b.keys()
    for tid in a:
        assert a[tid] == pytest.approx(b[tid], abs=1e-9)


def test_other_seed_other_durations(small):
    workload, events = small
    r1 = run_policy(events, "vllm", workload, BenchConfig(seed=1))
    r2 = run_policy(events, "vllm", workload, BenchConfig(seed=2))
    assert [t.execution_s for t in r1.tasks] != [t.execution_s for t in r2.tasks]


def test_waiting_time_excludes_robot_busy_with_other_tasks(small):
    workload, events = small
    queued = run_policy(events, "vllm", workload, BenchConfig(robots="queue"))
    parallel = run_policy(events, "vllm", workload, BenchConfig(robots="parallel"))
    assert all(t.robot_blocked_s == 0 for t in parallel.tasks)
    for q in queued.tasks:
        assert q.robot_blocked_s >= 0
        assert q.waiting_time_s == pytest.approx(q.sched_waiting_time_s - q.robot_blocked_s)
        # Whole-plan dispatch: the LLM-caused wait is the response time.
        assert q.waiting_time_s == pytest.approx(q.response_time_s, abs=1e-6)


# ------------------------------------------------------------------ robots

def _seg(task_id, seq, calls, dispatched, last):
    return SegmentDispatch(task_id=task_id, robot_id="", skill_set="drone", sequence=seq, text="",
                           calls=tuple(calls), is_last=last, estimated_execution_s=0.0,
                           dispatched_s=dispatched, estimated_done_s=dispatched)


def test_busy_robot_queues_the_next_task():
    reports = []
    exec_model = ExecutionTimeModel.from_mapping({"skills": {
        "default": {"kind": "constant", "seconds": 1.0},
        "wait": {"kind": "constant", "seconds": 2.0}}})
    robots = SimulatedRobots(exec_model, seed=0, latency_s=0.01, mode="queue",
                             schedule_report=lambda *a: reports.append(a))
    robots.add_task("a", 0, "drone_00")
    robots.add_task("b", 1, "drone_00")
    call = SkillCall("wait", ())
    robots.dispatch(_seg("b", 0, [call], 0.0, True))  # b's plan arrives first ...
    assert reports == []  # ... but the robot is a's until a is finished
    robots.dispatch(_seg("a", 0, [call], 0.5, False))
    robots.dispatch(_seg("a", 1, [call], 0.6, True))
    at, tid, seq, start, finish = zip(*reports)
    assert tid == ("a", "a", "b")
    assert start == pytest.approx((0.51, 2.51, 4.51))
    assert finish == pytest.approx((2.51, 4.51, 6.51))
    assert at == pytest.approx((2.52, 4.52, 6.52))
    assert robots.blocked_s("b") == pytest.approx(4.51 - 0.01)
    assert robots.blocked_s("a") == 0.0


def test_dropped_task_frees_its_robot():
    reports = []
    exec_model = ExecutionTimeModel.from_mapping({"skills": {
        "default": {"kind": "constant", "seconds": 1.0}}})
    robots = SimulatedRobots(exec_model, 0, 0.0, "queue", lambda *a: reports.append(a))
    robots.add_task("a", 0, "r")
    robots.add_task("b", 1, "r")
    robots.dispatch(_seg("b", 0, [SkillCall("x", ())], 0.0, True))
    robots.drop("a")
    assert [r[1] for r in reports] == ["b"]


def test_call_durations_are_keyed_by_task_and_call():
    exec_model = ExecutionTimeModel.from_yaml()
    robots = SimulatedRobots(exec_model, 7, 0.0, "queue", lambda *a: None)
    call = SkillCall("move_forward", ("100",))
    d = robots.call_duration(3, 1, call)
    assert d == robots.call_duration(3, 1, call)
    assert d != robots.call_duration(3, 2, call)


# ------------------------------------------------------------------ metrics

def _task(tt, utility, rt, wait, ert):
    return TaskResult(task_id=f"t{utility}{rt}", trace_id=1, category="drone", tuf_level="normal",
                      task_type=tt, robot_id="r", arrival_s=0.0, ert_s=ert, utility=utility,
                      response_time_s=rt, waiting_time_s=wait)


def test_metrics_on_hand_made_records():
    tasks = [
        _task("drone-normal", 1.0, 0.5, 0.6, 1.0),
        _task("drone-normal", 0.0, 1.5, 1.5, 1.0),   # missed its ERT
        _task("drone-urgent", 2.0, 0.1, 0.1, 0.2),
        _task("drone-urgent", -1.0, 0.65, 0.7, 0.2),  # missed
        _task("arm", 1.0, 0.2, 0.3, 1.0),
        _task("arm", math.nan, math.nan, math.nan, 1.0),  # no response: not averaged in
    ]
    m = compute_metrics(tasks, fetch_overhead_s=[0.001, 0.003])
    assert list(m["by_type"]) == ["drone-normal", "drone-urgent", "arm"]
    o = m["overall"]
    assert o["utility_mean"] == pytest.approx((1 + 0 + 2 - 1 + 1) / 5)
    assert o["response_time_mean_s"] == pytest.approx((0.5 + 1.5 + 0.1 + 0.65 + 0.2) / 5)
    assert o["waiting_time_mean_s"] == pytest.approx((0.6 + 1.5 + 0.1 + 0.7 + 0.3) / 5)
    assert o["response_time_p99_s"] == pytest.approx(np.percentile([0.5, 1.5, 0.1, 0.65, 0.2], 99))
    assert o["deadline_miss_rate"] == pytest.approx(2 / 5)
    u = m["by_type"]["drone-urgent"]
    assert u["utility_mean"] == pytest.approx(0.5)
    assert u["deadline_miss_rate"] == pytest.approx(0.5)
    assert u["response_time_p99_s"] == pytest.approx(0.1 + 0.99 * 0.55)
    assert m["by_type"]["arm"]["utility_mean"] == pytest.approx(1.0)
    assert m["scheduling_overhead_ms"] == pytest.approx(2.0)
    # ERT exactly met is not a miss.
    assert compute_metrics([_task("arm", 1.0, 1.0, 1.0, 1.0)])["overall"]["deadline_miss_rate"] == 0


def test_task_types():
    assert task_type("drone", "normal") == "drone-normal"
    assert task_type("drone", "urgent") == "drone-urgent"
    assert task_type("arm", "normal") == "arm"
    assert task_type("chat", "chat") == "chat"
    assert task_type("arm", "urgent") == "arm-urgent"


def test_json_schema(small_runs, small):
    workload, _ = small
    doc = json_safe(results_json(small_runs, workload.to_dict()))
    assert set(doc) == {"policies", "workload"}
    for name, m in doc["policies"].items():
        assert set(m) == {"overall", "by_type", "scheduling_overhead_ms"}
        assert set(m["overall"]) == set(METRIC_KEYS)
        assert set(m["by_type"]) == {"drone-normal", "drone-urgent"}
        for bucket in m["by_type"].values():
            assert set(bucket) == set(METRIC_KEYS)
    json.dumps(doc, allow_nan=False)
    table = format_table(doc)
    assert "timelyllm" in table and "drone-urgent" in table


# ------------------------------------------------------------------ CLI and plots

def test_cli_json_and_plots(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = cli.main(["--workload", "WID1", "--duration-s", "25", "--policies", "vllm,timelyllm",
                   "--sweep-batch-cap", "2,8", "--json", str(out), "--plots",
                   str(tmp_path / "plots"), "--no-progress"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"vllm", "timelyllm"}
    assert set(doc["policies"]["timelyllm"]["overall"]) == set(METRIC_KEYS)
    assert doc["workload"]["name"] == "WID1" and doc["workload"]["duration_s"] == 25
    assert doc["sweep"]["batch_cap"] == [2, 8]
    assert len(doc["sweep"]["policies"]["vllm"]["utility_mean"]) == 2
    names = {p.name for p in (tmp_path / "plots").iterdir()}
    assert names == {"fig5_by_type.png", "fig6_timeline.png", "fig8_batch_cap.png",
                     "algorithms.png"}
    assert "timelyllm vs vllm" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--workload", "WID1", "--policies", "vllm,nope"], "unknown policy 'nope'"),
    (["--workload", "WID9"], "unknown workload preset"),
    (["--workload", "no/such/file.yaml"], "no such workload file"),
    (["--workload", "WID1", "--engine", "vllm"], "--model"),
    (["--workload", "WID1", "--engine", "vllm", "--model", "m", "--prompt-tokens", "100"],
     "simulated engine only"),
])
def test_cli_usage_errors(argv, message, capsys):
    assert cli.main([*argv, "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_top_level_cli_knows_bench():
    from timelyllm_ros.cli.main import SUBCOMMANDS, command_module
    assert "bench" in SUBCOMMANDS and command_module("bench") == "timelyllm_ros.cli.bench"


def test_progress_bar_renders():
    import io
    stream = io.StringIO()
    bar = ReplayProgress("x", stream=stream)
    bar(1, 4, 2.0)
    bar(4, 4, 9.0)
    text = stream.getvalue()
    assert text.count("\n") == 1 and "4/4 tasks" in text  # not a TTY: only the final line
