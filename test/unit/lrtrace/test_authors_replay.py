"""The shipped authors' workloads (lrtrace/authors/, CC BY 4.0, the TimelyLLM authors) in the
bench and the fitter: a replay executes every job's measured skill times, not the
execution-time model's samples; `lrtrace fit` on the imported reports fits the real drone."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.workloads import (WorkloadSourceError, load_bench_workload,
                                           load_workload_events)
from timelyllm_ros.cli import bench as bench_cli
from timelyllm_ros.cli import lrtrace as lrtrace_cli
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.lrtrace.measured import default_skill_sets, load_measured, plan_calls

REPO = Path(__file__).resolve().parents[3]
DRONE_HIGH = REPO / "lrtrace" / "authors" / "drone-high.yaml"
# The authors' first event arrives at 33.94 s with 13 jobs of every drone trace; 35 s keeps it.
FIRST_EVENT_S = 35.0


@pytest.fixture(scope="module")
def first_event():
    workload, events, run_kwargs = load_bench_workload(str(DRONE_HIGH), None, FIRST_EVENT_S)
    measured = load_measured(DRONE_HIGH, FIRST_EVENT_S)
    return workload, events, run_kwargs, measured


def _segment_durations(task, trace, skill_sets):
    """(measured seconds the segment's calls should take, seconds it took) per segment."""
    return [(len(plan_calls(skill_sets[trace.skill_set], s.text)), s.finished_s - s.started_s)
            for s in task.segments]


@pytest.mark.parametrize("policy", ["vllm-stream", "timelyllm"])
def test_replay_executes_each_jobs_measured_times(first_event, policy):
    workload, events, run_kwargs, measured = first_event
    assert len(events) == len(measured.jobs) >= 8
    run = run_policy(events, policy, workload, BenchConfig(), **run_kwargs)
    skill_sets = default_skill_sets()
    done = [t for t in run.tasks if t.state == "done"]
    assert len(done) == len(measured.jobs)
    seen_vision = False
    for task in done:
        job = measured.jobs[int(task.task_id[1:])]
        trace = measured.traces[job.trace]
        k = 0
        for n_calls, took in _segment_durations(task, trace, skill_sets):
            assert took == pytest.approx(sum(job.times[k:k + n_calls]), abs=1e-9), task.task_id
            k += n_calls
        assert k == len(job.times)  # every measured skill ran, none twice
        seen_vision |= "is_visible" in [c.name for c in plan_calls(
            skill_sets[trace.skill_set], trace.plan)]
        # The job's own TUF, not our config's (the authors' urgent cut-off is exactly 0.5 s).
        assert task.ert_s == measured.tuf_triples[job.tuf][1]
        assert task.task_type == f"drone-{job.tuf}"
    assert seen_vision


def test_without_the_measured_times_the_model_would_have_been_sampled(first_event):
    """The control: the same replay without `call_durations` draws other durations (our
    model's is_visible takes ~0.3 s, the authors' drone 0.001 s), so the test above can fail."""
    workload, events, run_kwargs, measured = first_event
    sampled = dict(run_kwargs)
    del sampled["call_durations"]
    run = run_policy(events, "vllm-stream", workload, BenchConfig(), **sampled)
    differ = 0
    for task in run.tasks:
        job = measured.jobs[int(task.task_id[1:])]
        took = [s.finished_s - s.started_s for s in task.segments if s.finished_s > s.started_s]
        differ += any(abs(a - b) > 0.05 for a, b in zip(took, job.times))
    assert differ >= len(run.tasks) // 2


def test_bench_cli_replays_drone_high_offline(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench_cli.main(["--workload", str(DRONE_HIGH), "--policies", "vllm-stream",
                         "--engine", "sim", "--duration-s", str(FIRST_EVENT_S), "--no-progress",
                         "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    jobs = load_measured(DRONE_HIGH, FIRST_EVENT_S).jobs
    assert doc["workload"]["tasks"] == len(jobs)
    assert "CC BY 4.0" in doc["workload"]["description"]
    assert doc["workload"]["tasks_not_done"] == {"vllm-stream": 0}
    assert "drone-urgent" in capsys.readouterr().out


def test_load_scale_and_the_ros_replay_refuse_a_measured_workload(capsys):
    with pytest.raises(WorkloadSourceError, match="measured robot times.*timelyllm bench"):
        load_workload_events(str(DRONE_HIGH), None, None)
    rc = bench_cli.main(["--workload", str(DRONE_HIGH), "--policies", "vllm-stream",
                         "--duration-s", "35", "--load-scale", "2", "--no-progress"])
    assert rc == 2 and "no event rate to scale" in capsys.readouterr().err


def test_fit_on_the_imported_reports_is_the_real_drone(tmp_path, capsys):
    model_path = tmp_path / "drone.yaml"
    argv = ["fit", str(DRONE_HIGH), "-o", str(model_path)]
    assert lrtrace_cli.main(argv) == 1  # forward, sideways and down flown at one distance only
    assert "move_forward: 141 samples but all at argument 50" in capsys.readouterr().err
    assert lrtrace_cli.main([*argv, "--allow-sparse"]) == 0
    text = model_path.read_text()
    assert text.startswith("# Data: the TimelyLLM authors") and "CC BY 4.0" in text
    spec = yaml.safe_load(text)["skills"]
    model = ExecutionTimeModel.from_yaml(model_path)

    measured = load_measured(DRONE_HIGH)
    skill_sets = default_skill_sets()
    by_skill = defaultdict(list)  # skill -> [(argument, seconds)]
    for job in measured.jobs:
        trace = measured.traces[job.trace]
        for call, t in zip(plan_calls(skill_sets[trace.skill_set], trace.plan), job.times):
            by_skill[call.name].append((call.args[0] if call.args else "", t))
    for skill in ("is_visible", "sweeping", "approach", "log", "picture"):
        times = [t for _, t in by_skill[skill]]
        assert spec[skill]["kind"] == "empirical"
        assert (min(spec[skill]["samples"]), max(spec[skill]["samples"])) == (min(times),
                                                                              max(times))
    # move_up was flown at two heights: the line goes through the mean of each.
    means = {float(a): np.mean([t for b, t in by_skill["move_up"] if b == a])
             for a, _ in by_skill["move_up"]}
    assert len(means) == 2
    for arg, mean in means.items():
        assert model.model_for("move_up").nominal((str(int(arg)),)) == pytest.approx(mean,
                                                                                   abs=1e-4)
    assert spec["move_forward"] == yaml.safe_load(
        (REPO / "config" / "exec_model.yaml").read_text())["skills"]["move_forward"]
