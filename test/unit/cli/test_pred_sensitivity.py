"""`python -m timelyllm_ros.cli.pred_sensitivity`: argument errors, the sweep's bookkeeping (which
replays run with which knob value), the table, and one tiny replay end to end."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.cli import pred_sensitivity as ps
from timelyllm_ros.core.policies.predictive import PredictiveTimelyPolicy


def _error(capsys, argv) -> str:
    assert ps.main(argv) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    ([], ["--workload", "--family-seed"]),
    (["--workload", "WID1", "--family-seed", "1", "--family-members", "3"],
     ["--workload", "not with"]),
    (["--family-seed", "1"], ["--family-members", "together"]),
    (["--family-members", "3"], ["--family-seed", "together"]),
    (["--family-seed", "-1", "--family-members", "3"], ["--family-seed", ">= 0"]),
    (["--family-seed", "1", "--family-members", "3", "--load-scale", "2"], ["--load-scale"]),
    (["--workload", "WID1", "--duration-s", "0"], ["--duration-s", "> 0"]),
    (["--workload", "no-such-workload"], ["--workload", "no-such-workload"]),
    (["--workload", "WID1", "--knob", "speed"], ["--knob", "unknown knob 'speed'"]),
    (["--workload", "WID1", "--knob", "resume_weight", "--knob", "resume_weight=1"],
     ["resume_weight", "twice"]),
    (["--workload", "WID1", "--knob", "resume_weight=-1"], ["resume_weight", ">= 0"]),
    (["--workload", "WID1", "--knob", "resume_weight=none"], ["resume_weight", "not a number"]),
    (["--workload", "WID1", "--knob", "length_quantiles=2.5"],
     ["length_quantiles", "not an integer"]),
    (["--workload", "WID1", "--knob", "length_quantiles=0"], ["length_quantiles", ">= 1"]),
    (["--workload", "WID1", "--knob", "arrival_window_s=0"], ["arrival_window_s", "> 0"]),
    (["--workload", "WID1", "--knob", "arrival_window_s=1,1"], ["arrival_window_s", "twice"]),
    (["--workload", "WID1", "--knob", "prior_steps="], ["prior_steps", "no value"]),
])
def test_argument_errors_name_the_field_and_the_reason(capsys, argv, words):
    err = _error(capsys, argv)
    for word in words:
        assert word in err


@pytest.mark.parametrize("argv", [["--family-members", "1,1"], ["--family-members", "a"],
                                  ["--load-scale", "0"]])
def test_malformed_lists_are_argparse_errors(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        ps.main(["--workload", "WID1", *argv])
    assert exc.value.code == 2


def test_knob_defaults_are_the_policys_and_always_swept():
    policy = PredictiveTimelyPolicy()
    for name, knob in ps.KNOBS.items():
        assert knob.default == getattr(policy, name)
        # Every standard value reads back through the knob's own parser.
        assert tuple(knob.parse("none" if v is None else str(v)) for v in knob.values) \
            == knob.values
    assert ps.parse_knob("arrival_window_s=none,1") == ("arrival_window_s", (None, 1.0, 5.0))
    assert ps.parse_knob("resume_weight") == ("resume_weight", ps.KNOBS["resume_weight"].values)


def test_the_default_is_replayed_once_and_each_other_value_with_its_knob():
    calls = []

    def replay(policy, config, label):
        params = dict(config.policy_params.get(policy, {}))
        calls.append((policy, params))
        utility = 1.0 + sum(v or 0 for v in params.values())  # tells the settings apart
        return [SimpleNamespace(utility=utility, response_time_s=0.1, waiting_time_s=0.0,
                                ert_s=1.0)]

    run = ps.Run("r", None, [], BenchConfig(), {})
    knobs = {"resume_weight": (0.0, 0.25, 1.0), "arrival_window_s": (None, 5.0, 20.0)}
    row = ps.sweep_run(run, knobs, replay=replay)
    assert calls == [("vllm-stream", {}), ("vllm-priority", {}), ("timelyllm-pred", {}),
                     ("timelyllm-pred", {"resume_weight": 0.25}),
                     ("timelyllm-pred", {"resume_weight": 1.0}),
                     ("timelyllm-pred", {"arrival_window_s": None}),
                     ("timelyllm-pred", {"arrival_window_s": 20.0})]
    assert [c["utility_mean"] for c in row["knobs"]["resume_weight"]] == [1.0, 1.25, 2.0]
    assert [c["utility_mean"] for c in row["knobs"]["arrival_window_s"]] == [1.0, 1.0, 21.0]
    assert row["knobs"]["arrival_window_s"][1] is row["default"]


def test_table_marks_the_default_and_picks_the_better_baseline():
    def cell(u, miss):
        return {"utility_mean": u, "deadline_miss_rate": miss}
    doc = {"subject": "timelyllm-pred", "baselines": ["vllm-stream", "vllm-priority"],
           "knobs": {"resume_weight": {"default": 0.0, "values": [0.0, 1.0]}},
           "runs": [{"label": "WID1 x64",
                     "baselines": {"vllm-stream": cell(math.nan, math.nan),
                                   "vllm-priority": cell(0.5, 0.25)},
                     "knobs": {"resume_weight": [cell(1.359, 0.067), cell(1.2, 0.1)]}}]}
    lines = ps.format_sweep(doc).splitlines()
    assert "resume_weight 0*" in lines[2] and lines[2].rstrip().endswith("best baseline")
    assert lines[4].split() == ["WID1", "x64", "1.359", "(6.7)", "1.200", "(10.0)", "0.500",
                                "(25.0)", "priority"]
    md = ps.knob_table(doc, "resume_weight", markdown=True).splitlines()
    assert md[2] == "| WID1 x64 | 1.359 (6.7) | 1.200 (10.0) | 0.500 (25.0) priority |"


def test_a_tiny_sweep_end_to_end(capsys, tmp_path):
    out = tmp_path / "sweep.json"
    assert ps.main(["--workload", "WID1", "--robots", "parallel", "--duration-s", "8",
                    "--load-scale", "1,2", "--knob", "resume_weight=1", "--no-progress",
                    "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "resume_weight 1" in text and "0*" in text
    doc = json.loads(out.read_text())
    assert [r["label"] for r in doc["runs"]] == ["WID1 x1", "WID1 x2"]
    assert doc["knobs"]["resume_weight"] == {"default": 0.0, "values": [1.0, 0.0]}
    for row in doc["runs"]:
        assert row["tasks"] > 0
        assert row["knobs"]["resume_weight"][1] == row["default"]
        assert set(row["baselines"]) == {"vllm-stream", "vllm-priority"}


def test_a_family_member_runs_on_its_own_profile(capsys):
    args = ps.build_parser().parse_args(["--family-seed", "1", "--family-members", "31,9",
                                         "--duration-s", "5"])
    runs = ps.build_runs(args)
    assert [r.label.split(" (")[0] for r in runs] == ["family s1 #31", "family s1 #9"]
    from timelyllm_ros.bench.family import draw_member
    for run, k in zip(runs, (31, 9)):
        assert run.config.profile == draw_member(1, k, 5.0).profile


def test_a_failed_replay_is_a_cell_and_the_sweep_goes_on():
    def replay(policy, config, label):
        if config.policy_params.get(policy, {}).get("arrival_window_s") == 10.0:
            raise RuntimeError("replay stuck: nothing progressed")
        return [SimpleNamespace(utility=1.0, response_time_s=0.1, waiting_time_s=0.0,
                                ert_s=1.0)]

    run = ps.Run("member 31", None, [], BenchConfig(), {})
    knobs = {"arrival_window_s": (5.0, 10.0, 20.0)}
    row = ps.sweep_run(run, knobs, replay=replay)
    cells = row["knobs"]["arrival_window_s"]
    assert "stuck" in cells[1]["failed"] and cells[2]["utility_mean"] == 1.0
    doc = {"subject": "timelyllm-pred", "baselines": ["vllm-stream", "vllm-priority"],
           "knobs": {"arrival_window_s": {"default": 5.0, "values": [5.0, 10.0, 20.0]}},
           "runs": [row]}
    text = ps.format_sweep(doc)
    assert "failed" in text.splitlines()[4]
    assert "member 31, arrival_window_s 10.0: replay stuck" in text
