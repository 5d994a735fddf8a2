"""The load sweep (bench/load_sweep.py, `--load-scale`) and `--policies default`."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import yaml

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.load_sweep import (format_load_sweep, format_load_sweep_markdown,
                                            overload_at, scaled_workload, sweep_loads)
from timelyllm_ros.bench.plots import plot_load_sweep
from timelyllm_ros.bench.policies import PolicyListError, parse_policy_list
from timelyllm_ros.bench.replay import run_policies
from timelyllm_ros.bench.workloads import shorten
from timelyllm_ros.cli import bench as cli
from timelyllm_ros.cli.bench_args import build_parser
from timelyllm_ros.core.policies.registry import DEFAULT_POLICY
from timelyllm_ros.lrtrace.workload import compose, load_workload

REPO = Path(__file__).resolve().parents[3]
POLICIES = ("vllm-stream", "vllm-priority")
CONFIG = BenchConfig(prompt_tokens=None, baseline_prefix_cache=True)


def test_scaled_workload_multiplies_the_event_rate_only():
    w = load_workload("WID1")
    s = scaled_workload(w, 4)
    assert s.eps == pytest.approx(4 * w.eps)
    assert dataclasses.replace(s, eps=w.eps) == w
    with pytest.raises(ValueError):
        scaled_workload(w, 0)
    with pytest.raises(ValueError):
        scaled_workload(dataclasses.replace(w, eps=0.0), 2)  # an event list has no rate


def test_same_seed_compresses_the_same_arrivals():
    """With the seed kept, a higher rate replays the same event sequence faster: at least as
    many events in the same duration, and the first ones are the same tasks."""
    w = shorten(load_workload("WID1"), 60.0)
    low, high = compose(scaled_workload(w, 1)), compose(scaled_workload(w, 4))
    assert len(high) >= len(low) > 0
    for a, b in zip(low, high):
        assert a.tasks == b.tasks
        assert b.time_s == pytest.approx(a.time_s / 4)


@pytest.fixture(scope="module")
def sweep():
    workload = shorten(load_workload("WID1"), 30.0)
    events = compose(workload)
    base = run_policies(events, POLICIES, workload, CONFIG)
    return workload, events, base, sweep_loads(workload, POLICIES, CONFIG, [0.5, 1, 16],
                                               base=(events, base))


def test_sweep_block(sweep):
    workload, events, base, s = sweep
    assert s["load_scale"] == [0.5, 1, 16]
    assert s["events_per_s"] == pytest.approx([workload.eps * k for k in (0.5, 1, 16)])
    assert s["tasks"][1] == sum(len(e.tasks) for e in events)
    assert s["tasks"] == sorted(s["tasks"]) and s["tasks"][2] > 4 * s["tasks"][1]
    assert s["baselines"] == list(POLICIES)
    for name in POLICIES:
        entry = s["policies"][name]
        assert all(len(v) == 3 for v in entry.values())
        for i in range(3):
            assert entry["utility_mean"][i] <= s["bound"]["utility_mean"][i] + 1e-9
            assert entry["utility_fraction_of_bound"][i] == pytest.approx(
                entry["utility_mean"][i] / s["bound"]["utility_mean"][i])
    # Load costs response time (p99), and the bound does not depend on load.
    stream = s["policies"]["vllm-stream"]
    assert stream["response_time_p99_s"][2] > stream["response_time_p99_s"][0]
    assert s["bound"]["response_time_p99_s"][2] == pytest.approx(
        s["bound"]["response_time_p99_s"][1], abs=0.05)
    # The overload flag follows the rule.
    for i in range(3):
        best = min(s["policies"][b]["deadline_miss_rate"][i] for b in POLICIES)
        assert s["best_baseline_miss_rate"][i] == best
        assert s["overload"][i] == (best > 0.10)


def test_scale_one_reuses_the_base_run(sweep):
    workload, _, _, s = sweep
    fresh = sweep_loads(workload, POLICIES, CONFIG, [1])
    for name in POLICIES:
        assert fresh["policies"][name]["utility_mean"] == [s["policies"][name]["utility_mean"][1]]
        assert fresh["policies"][name]["response_time_p99_s"] == \
            [s["policies"][name]["response_time_p99_s"][1]]


def test_overload_rule():
    assert overload_at({"vllm-stream": 0.2, "vllm-priority": 0.05}) == (0.05, False)
    assert overload_at({"vllm-stream": 0.2, "vllm-priority": 0.15}) == (0.15, True)
    assert overload_at({"vllm-stream": 0.1}) == (0.1, False)  # more than 10 %, not 10 %
    best, flag = overload_at({})
    assert math.isnan(best) and not flag
    best, flag = overload_at({"vllm-stream": float("nan")})
    assert math.isnan(best) and not flag


def _synthetic():
    return {"load_scale": [1, 2, 4], "events_per_s": [0.25, 0.5, 1.0], "events": [5, 10, 20],
            "tasks": [20, 40, 80], "baselines": ["vllm-stream"],
            "best_baseline_miss_rate": [0.0, 0.05, 0.4], "overload": [False, False, True],
            "overload_miss_rate": 0.1,
            "bound": {"utility_mean": [1.4, 1.4, 1.4], "response_time_mean_s": [0.1] * 3,
                      "response_time_p99_s": [0.2] * 3, "deadline_miss_rate": [0.0] * 3},
            "policies": {"vllm-stream": {
                "utility_mean": [1.4, 1.3, -5.0], "response_time_mean_s": [0.1, 0.2, 3.0],
                "response_time_p99_s": [0.2, 0.4, 9.0], "deadline_miss_rate": [0.0, 0.05, 0.4],
                "utility_fraction_of_bound": [1.0, 0.93, float("nan")],
                "by_type_utility": [{}] * 3, "tasks_without_response": [0] * 3}}}


def test_tables_mark_overload():
    text = format_load_sweep(_synthetic())
    rows = [line for line in text.splitlines() if line.startswith("x")]
    assert [r.split()[0] for r in rows] == ["x1", "x2", "x4"]
    assert "overload" in rows[2] and "overload" not in rows[0] + rows[1]
    assert sum(1 for line in text.splitlines() if line.lstrip().startswith("bound ")) == 3
    md = format_load_sweep_markdown(_synthetic()).splitlines()
    assert md[0].startswith("| load |") and len(md) == 2 + 3 * 2
    assert "| x4 overload |" in md[-2]


def test_plot_load_sweep(tmp_path):
    path = plot_load_sweep(_synthetic(), tmp_path / "load.png", title="t")
    assert path.exists() and path.stat().st_size > 1000


def test_cli_load_sweep(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["--workload", "WID1", "--duration-s", "20", "--policies",
                     "vllm-stream,default", "--prompt-tokens", "none",
                     "--baseline-prefix-cache", "on", "--load-scale", "1,4", "--no-progress",
                     "--json", str(out), "--plots", str(tmp_path / "plots")]) == 0
    captured = capsys.readouterr()
    doc = json.loads(out.read_text())
    assert list(doc["policies"]) == ["vllm-stream", DEFAULT_POLICY]
    ls = doc["load_sweep"]
    assert ls["load_scale"] == [1, 4] and set(ls["policies"]) == {"vllm-stream", DEFAULT_POLICY}
    # Scale 1 is the main run.
    assert ls["policies"]["vllm-stream"]["utility_mean"][0] == \
        doc["policies"]["vllm-stream"]["overall"]["utility_mean"]
    assert (tmp_path / "plots" / "load_sweep.png").exists()
    assert "load sweep:" in captured.out
    assert "load x4:" in captured.err and f"default: {DEFAULT_POLICY}" in captured.err


@pytest.mark.parametrize("argv, message", [
    (["--workload", "seed001-chat", "--load-scale", "2"], "--load-scale"),
    (["--workload", "WID1", "--policies", f"default,{DEFAULT_POLICY}"], "listed twice"),
])
def test_cli_load_sweep_usage_errors(argv, message, capsys):
    assert cli.main([*argv, "--no-progress"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0", "-1", "x", "1,1", ""])
def test_cli_rejects_bad_load_scales(bad):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--workload", "WID1", "--load-scale", bad])
    assert info.value.code == 2


def test_default_names_the_planners_default_policy():
    assert parse_policy_list("vllm, default") == ["vllm", DEFAULT_POLICY]
    with pytest.raises(PolicyListError, match="listed twice"):
        parse_policy_list(f"{DEFAULT_POLICY},default")
    planner = yaml.safe_load((REPO / "config" / "planner.yaml").read_text(encoding="utf-8"))
    assert planner["planner"]["ros__parameters"]["policy"] == DEFAULT_POLICY
