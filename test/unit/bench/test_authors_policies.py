"""The TimelyLLM authors' two systems as bench policies (issue 21 part 3, docs/fidelity.md):
`authors-vllm` and `authors-timelyllm` carry the settings of the authors' experiment 7.4.1
(core/policies/registry.py cites their code), run on a prefix of the authors' drone workload
(lrtrace/authors/, CC BY 4.0, the TimelyLLM authors), and the bench reports the response
percentiles and the response as the authors measure it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.metrics import (deliveries, first_action_bucket, first_action_s,
                                         format_first_action_table)
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.results import SegmentResult, TaskResult
from timelyllm_ros.bench.workloads import load_bench_workload
from timelyllm_ros.cli import bench as bench_cli
from timelyllm_ros.core.policies.registry import DEFAULT_POLICY, get_policy, policy_names
from timelyllm_ros.core.sched.admission import FixedBatchCap, LatencyGuidedAdmission
from timelyllm_ros.core.sched.interface import SchedulerContext
from timelyllm_ros.core.tuf import TUF

REPO = Path(__file__).resolve().parents[3]
DRONE_HIGH = REPO / "lrtrace" / "authors" / "drone-high.yaml"
H100 = REPO / "config" / "engine_profiles" / "llama3-8b-h100.yaml"
# The authors' first event: 13 jobs arriving 1 ms apart from 33.94 s.
FIRST_EVENT_S = 35.0
# The first two events (the second at 41.3 s), for the command-line run.
PREFIX_S = 45.0


def _context() -> SchedulerContext:
    return SchedulerContext(engine_name="sim", kv_block_size=16, kv_total_blocks=1000,
                            max_segment_tokens=24)


@pytest.fixture(scope="module")
def first_event():
    return load_bench_workload(str(DRONE_HIGH), None, FIRST_EVENT_S)


def test_both_policies_are_named_and_carry_the_authors_settings():
    assert {"authors-vllm", "authors-timelyllm"} <= set(policy_names())

    vllm = get_policy("authors-vllm")
    assert (vllm.dispatch, vllm.engine_scheduling, vllm.always_prefix_cache) == ("whole", "fcfs",
                                                                                 True)
    cap = vllm.make_admission(_context())
    assert isinstance(cap, FixedBatchCap) and cap.cap == 8  # their engine's max_num_seqs
    assert cap.may_admit([(0, 1.0)] * 7, 100.0, 100, 1)[0]
    assert not cap.may_admit([(0, 1.0)] * 8, 100.0, 100, 1)[0]

    timely = get_policy("authors-timelyllm")
    assert timely.dispatch == "segment" and timely.suspend_when == "always"
    assert timely.gen_time_s == 0.09 and timely.hopeless == "shed" and timely.always_prefix_cache
    admission = timely.make_admission(_context())
    # lmax 10 whatever the planner's skill sets say (the context's bound here is 24), behind
    # the cap of 8.
    assert isinstance(admission.inner, LatencyGuidedAdmission)
    assert admission.inner.max_segment_tokens == 10
    assert not admission.may_admit([(0, 1.0)] * 8, 100.0, 100, 1)[0]
    assert admission.may_admit([(0, 1.0)] * 7, 100.0, 100, 1)[0]


def _most_running(run) -> int:
    """Most generations running in the engine at once, from every task's generation spans."""
    edges = sorted((t, +1 if start else -1) for task in run.tasks
                   for a, b in task.generation_spans for t, start in ((a, True), (b, False)))
    # (At equal times an end sorts before a start: -1 < +1.)
    return int(np.max(np.cumsum([d for _, d in edges])))


def test_at_most_eight_generations_run_where_plain_vllm_runs_every_request(first_event):
    workload, events, kw = first_event
    assert len(events) == 13
    config = BenchConfig(profile=H100)
    runs = {p: run_policy(events, p, workload, config, **kw)
            for p in ("vllm", "authors-vllm", "authors-timelyllm")}
    for run in runs.values():
        assert all(t.state == "done" for t in run.tasks)
    assert _most_running(runs["vllm"]) == 13
    assert _most_running(runs["authors-vllm"]) == 8
    assert _most_running(runs["authors-timelyllm"]) <= 8
    # The capped baseline's five last requests wait for a slot: their responses come later.
    first = sorted(t.response_time_s for t in runs["authors-vllm"].tasks)
    uncapped = sorted(t.response_time_s for t in runs["vllm"].tasks)
    assert first[-1] > uncapped[-1]


def test_the_authors_baseline_keeps_prefix_caching_in_the_papers_configuration(first_event):
    workload, events, kw = first_event
    config = BenchConfig.paper(profile=H100)  # baselines without prefix caching
    assert run_policy(events, "vllm", workload, config, **kw).config["engine_prefix_cache"] is False
    run = run_policy(events, "authors-vllm", workload, config, **kw)
    assert run.config["engine_prefix_cache"] is True


def test_the_command_runs_all_three_on_the_authors_workload(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = bench_cli.main(["--workload", str(DRONE_HIGH), "--profile", str(H100), "--policies",
                         "authors-vllm,authors-timelyllm,default", "--duration-s", str(PREFIX_S),
                         "--json", str(out), "--no-progress"])
    assert rc == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert set(doc["policies"]) == {"authors-vllm", "authors-timelyllm", DEFAULT_POLICY}
    urgent_jobs = doc["workload"]["tasks_by_type"]["drone-urgent"]
    assert 0 < urgent_jobs < doc["workload"]["tasks"]
    for name, m in doc["policies"].items():
        o = m["overall"]
        assert 0 < o["response_time_p50_s"] <= o["response_time_p90_s"] <= o["response_time_p99_s"]
        urgent = [k for k in m["by_type"] if "urgent" in k]
        assert urgent == ["drone-urgent"], name
        fa = m["first_action"]
        assert fa["by_type"]["drone-urgent"]["tasks"] == urgent_jobs
        assert fa["overall"]["tasks"] == doc["workload"]["tasks"]
        assert fa["overall"]["tasks_without_first_action"] == 0
        assert (fa["overall"]["response_time_p50_s"] <= fa["overall"]["response_time_p90_s"]
                <= fa["overall"]["response_time_p99_s"])
    # The whole plan reaches the robot in one piece; TimelyLLM's in segments.
    assert doc["policies"]["authors-vllm"]["first_action"]["overall"]["segments_per_task"] == 1.0
    assert doc["policies"]["authors-timelyllm"]["first_action"]["overall"][
        "segments_per_task"] > 1.5
    printed = capsys.readouterr().out
    assert "Response as the TimelyLLM authors measure it" in printed
    assert "authors-timelyllm" in printed


URGENT = TUF(0.2, 2 / 0.3, 2.0)  # the authors' [2, 0.2, 0.5]


def _task(task_id, segments, utility=math.nan):
    return TaskResult(task_id=task_id, trace_id=1, category="drone", tuf_level="urgent",
                      task_type="drone-urgent", robot_id="r", arrival_s=10.0, ert_s=URGENT.ert_s,
                      response_time_s=math.nan, utility=utility, segments=segments, tuf=URGENT)


def test_first_action_is_the_robot_starting_the_first_non_empty_segment():
    # Delivered at 10.05 s, but the first segment is empty and the robot is still busy with
    # earlier work until 10.35 s: the first action is at 10.35 s.
    busy = _task("a", [SegmentResult(0, " ", False, 10.04, 10.05, 10.05),
                       SegmentResult(1, "tc,90;", False, 10.042, 10.35, 11.0),
                       SegmentResult(2, "mf,50;", True, 10.3, 11.0, 12.0)])
    assert first_action_s(busy) == pytest.approx(0.35)
    prompt = _task("b", [SegmentResult(0, "mf,50;", True, 10.1, 10.108, 11.0)])
    # Shed before any segment: no first action; it keeps the utility the bench gave it.
    shed = _task("c", [], utility=-0.1)
    m = first_action_bucket([busy, prompt, shed])
    assert m["tasks"] == 3 and m["tasks_without_first_action"] == 1
    assert m["deadline_miss_rate"] == pytest.approx(2 / 3)  # a is late (0.35 > 0.2), c counts
    assert m["utility_mean"] == pytest.approx((URGENT.utility(0.35) + 2.0 - 0.1) / 3)
    assert m["response_time_mean_s"] == pytest.approx((0.35 + 0.108) / 2)
    assert m["response_time_p50_s"] == pytest.approx(0.35) and m["response_time_p99_s"] == math.inf
    # Three segments sent together are one delivery; sent apart, three.
    assert deliveries(busy) == 3
    whole = _task("d", [SegmentResult(i, "mf,50;", i == 2, 10.2, 10.2 + i, 10.2 + i + 1)
                        for i in range(3)])
    assert deliveries(whole) == 1 and m["segments_per_task"] == pytest.approx(2.0)
    table = format_first_action_table({"policies": {"p": {"first_action": {
        "overall": m, "by_type": {"drone-urgent": m}}}}})
    assert "inf" in table and "drone-urgent" in table
