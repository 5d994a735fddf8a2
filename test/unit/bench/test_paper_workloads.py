"""The seed papers' own workloads as bench scenarios: their distributions, the harness features
they need (closed loop, fixed tool durations, per-request output budgets) and the bench CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from timelyllm_ros.cli import bench as bench_cli
from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.results import task_type
from timelyllm_ros.bench.paper_metrics import format_paper_table, paper_metrics
from timelyllm_ros.bench.paper_workloads import (build_scenario, scenario_names, seed001_chat,
                                                 seed002_rtbe, seed003_gsm8k, seed004_api,
                                                 token_count)
from timelyllm_ros.core.skills import get_language
from timelyllm_ros.core.skills.base import SkillSyntaxError


def _run(scenario, policy):
    return run_policy(scenario.events, policy, scenario.workload,
                      scenario.configure(BenchConfig()), **scenario.run_kwargs())


# ---------------------------------------------------------------- the tool-call language

def test_tool_call_language_cuts_after_each_call_and_names_the_tool():
    lang = get_language("tool-call")
    text = "Look it up <call:qa> then compute <call:math> The answer is 4."
    first = lang.next_boundary(text, 0)
    assert text[:first] == "Look it up <call:qa>"
    second = lang.next_boundary(text, first)
    assert text[first:second] == " then compute <call:math>"
    assert lang.next_boundary(text, second) is None
    assert lang.final_segment_end(text, second) == len(text)
    assert [c.name for c in lang.parse(text[:first]).calls] == ["qa"]
    assert lang.parse(text[second:]).calls == ()  # the final answer executes nothing


def test_tool_call_language_waits_for_the_closing_bracket_and_rejects_garbage():
    lang = get_language("tool-call")
    assert lang.next_boundary("text <call:q", 0) is None
    with pytest.raises(SkillSyntaxError, match="unterminated or malformed"):
        lang.parse("text <call:9bad>")
    with pytest.raises(SkillSyntaxError, match="one tool call"):
        lang.parse("a <call:qa> b <call:qa>")


# ---------------------------------------------------------------- the scenarios

def test_scenarios_are_deterministic_and_registered():
    assert scenario_names() == ["seed001-chat", "seed002-rtbe", "seed003-gsm8k", "seed004-api"]
    a = seed004_api(n=20)
    b = seed004_api(n=20)
    assert [t.plan for t in a.traces.values()] == [t.plan for t in b.traces.values()]
    assert a.call_durations == b.call_durations
    c = seed004_api(n=20, seed=7)
    assert [t.plan for t in c.traces.values()] != [t.plan for t in a.traces.values()]
    with pytest.raises(KeyError, match="known: seed001-chat"):
        build_scenario("seed009-nope")


def test_seed001_lengths_follow_lmsys_moments_and_budget_is_exact():
    sc = seed001_chat(duration_s=200.0, rate_per_s=10.0)
    outputs = np.array([token_count(t.plan) for t in sc.traces.values()])
    # Lognormal, sigma 1, mean 214.5, capped at 1024: the sample mean lands near it.
    assert 170 < outputs.mean() < 250
    assert outputs.max() <= 1024
    assert all(t.max_plan_tokens == token_count(t.plan) for t in sc.traces.values())
    assert sc.profile.kv_block_size * sc.profile.kv_total_blocks >= 16_492
    gaps = np.diff([e.time_s for e in sc.events])
    assert abs(gaps.mean() - 0.1) < 0.02  # Poisson at 10/s


def test_seed003_is_one_batch_on_the_papers_time_model():
    sc = seed003_gsm8k(n=60)
    assert len(sc.events) == 1 and len(sc.events[0].tasks) == 60
    assert sc.max_num_seqs == 200
    # The digest's checks of the paper's time model.
    assert sc.profile.decode_step_s(200, 0) == pytest.approx(0.071)
    assert sc.profile.prefill_s(5000) == pytest.approx(0.675)


def test_seed004_tool_durations_reach_the_robots_and_predictions_use_type_means():
    sc = seed004_api(n=6, rate_per_s=1.0)
    model = sc.exec_model()
    from timelyllm_ros.core.skills.base import SkillCall
    assert model.estimate_min(SkillCall("qa")) == pytest.approx(0.69)
    run = _run(sc, "fcfs-seg")
    assert all(t.state == "done" for t in run.tasks)
    for t in run.tasks:
        num = int(t.task_id[1:])
        tool_segments = [s for s in t.segments if not s.is_last]
        for i, seg in enumerate(tool_segments):
            assert seg.finished_s - seg.started_s == pytest.approx(sc.call_durations[(num, i)])


def test_seed002_closed_loop_releases_a_batch_only_after_the_previous_one():
    sc = seed002_rtbe(duration_s=30.0, be_batch=8, be_batches=50)
    run = _run(sc, "fcfs-seg")
    be = [t for t in run.tasks if t.task_type == "chat-be"]
    batches = sorted({t.event_id for t in be})
    assert len(batches) >= 2
    for prev, nxt in zip(batches, batches[1:]):
        ended = max(t.completion_s for t in be if t.event_id == prev)
        started = min(t.arrival_s for t in be if t.event_id == nxt)
        # Released when the last task's report is handled: between engine steps (~25 ms).
        assert ended <= started < ended + 0.1
    # Nothing is released past the workload's horizon, and every submitted task ended.
    assert max(t.arrival_s for t in be) <= 30.0
    assert all(t.state == "done" for t in run.tasks)
    rt = [t for t in run.tasks if t.task_type == "chat-rt"]
    assert rt and all(len(t.segments) >= 1 for t in rt)
    assert task_type("chat", "rt/17") == "chat-rt"


def test_bros_serves_rt_chat_better_than_fcfs_on_its_own_workload():
    sc = seed002_rtbe(duration_s=30.0)
    fcfs = paper_metrics(_run(sc, "fcfs-seg").tasks)
    bros = paper_metrics(_run(sc, "bros").tasks)
    assert bros["by_type"]["chat-rt"]["first_segment_miss_rate"] < \
        fcfs["by_type"]["chat-rt"]["first_segment_miss_rate"]
    assert bros["be_tokens_per_s"] > 0


def test_mcsf_lowers_latency_on_its_own_workload():
    sc = seed001_chat(duration_s=20.0)
    fcfs = paper_metrics(_run(sc, "fcfs-seg").tasks)
    mcsf = paper_metrics(_run(sc, "mcsf").tasks)
    assert mcsf["latency_mean_s"] < fcfs["latency_mean_s"]
    table = format_paper_table({"fcfs-seg": fcfs, "mcsf": mcsf})
    assert "makespan_s" in table and "mcsf" in table


def test_per_task_budget_is_the_bound_and_bad_budgets_are_rejected():
    from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
    from timelyllm_ros.core.exec_model import ExecutionTimeModel
    from timelyllm_ros.core.policies.registry import get_policy
    from timelyllm_ros.core.sched.scheduler import SegmentScheduler
    from timelyllm_ros.core.sched.interface import TaskRejected
    from timelyllm_ros.core.task import TaskSpec
    from timelyllm_ros.core.tuf import TUF

    sc = seed001_chat(duration_s=2.0)

    class Sink:
        def on_segment(self, segment):
            pass

        def on_status(self, snapshot):
            pass

    sched = SegmentScheduler(SimulatedEngine(sc.profile), get_policy("mcsf"), sc.skill_sets,
                             ExecutionTimeModel.from_mapping(sc.exec_model_spec), Sink())
    tuf = TUF(10.0, 0.2, 1.0)
    sched.submit(TaskSpec("ok", "chat_0", "chat-reply", "hello there", tuf, 0.0,
                          scripted_plan="One two three.", max_plan_tokens=4))
    assert int(sched.state.queue.view().bound_tokens[0]) == 4
    with pytest.raises(TaskRejected, match="max_plan_tokens"):
        sched.submit(TaskSpec("bad", "chat_1", "chat-reply", "hello", tuf, 0.0,
                              max_plan_tokens=0))


# ---------------------------------------------------------------- the bench CLI

def test_cli_runs_a_paper_workload_and_skips_policies_that_cannot_pause(tmp_path, capsys,
                                                                          monkeypatch):
    from timelyllm_ros.bench import paper_workloads
    small = dict(paper_workloads.SCENARIOS)
    small["seed004-api"] = lambda seed=None: seed004_api(n=10, **({} if seed is None
                                                                    else {"seed": seed}))
    monkeypatch.setattr(paper_workloads, "SCENARIOS", small)
    out = tmp_path / "r.json"
    rc = bench_cli.main(["--workload", "seed004-api", "--policies", "vllm,fcfs-seg,lamps",
                         "--json", str(out), "--no-progress"])
    assert rc == 0
    captured = capsys.readouterr()
    assert "skipping vllm" in captured.err
    assert "004 LAMPS's own figures" in captured.out
    doc = json.loads(out.read_text())
    assert set(doc["paper_metrics"]) == {"fcfs-seg", "lamps"}
    assert doc["paper_metrics"]["lamps"]["done"] == 10
    assert math.isfinite(doc["paper_metrics"]["lamps"]["latency_mean_s"])


def test_cli_kv_blocks_overrides_the_profile_kv(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert bench_cli.main(["--workload", "WID1", "--duration-s", "20", "--policies", "fcfs-seg",
                           "--kv-blocks", "300", "--json", str(out), "--no-progress"]) == 0
    bench = json.loads(out.read_text())["workload"]["bench"]
    assert bench["kv_blocks"] == 300 and bench["max_num_batched_tokens"] == 8192
    assert bench_cli.main(["--workload", "WID1", "--kv-blocks", "0", "--no-progress"]) == 2
    assert "--kv-blocks: kv_total_blocks: must be >= 1" in capsys.readouterr().err
    assert bench_cli.main(["--workload", "WID1", "--kv-blocks", "300", "--engine", "vllm",
                           "--model", "x", "--no-progress"]) == 2
    assert "--kv-blocks" in capsys.readouterr().err


def test_cli_rejects_paper_workloads_on_the_real_engine_and_fixed_size_durations(capsys):
    assert bench_cli.main(["--workload", "seed003-gsm8k", "--engine", "vllm", "--model", "x",
                           "--no-progress"]) == 2
    assert "simulated engine only" in capsys.readouterr().err
    assert bench_cli.main(["--workload", "seed003-gsm8k", "--duration-s", "5",
                           "--no-progress"]) == 2
    assert "fixed request count" in capsys.readouterr().err
