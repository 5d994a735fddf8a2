"""The workload family (bench/family.py), its report (bench/family_report.py) and
`timelyllm bench --family`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from timelyllm_ros.bench import family_report as report
from timelyllm_ros.bench.family import (CONTEXTS, LOAD_RANGE, MAX_NUM_SEQS, MAX_TPE_RANGE,
                                        MEMBER_DURATION_S, MIXES, PROFILES, TraceSize, capacity,
                                        draw_family, draw_member, member_yaml)
from timelyllm_ros.cli import bench as cli
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.lrtrace.workload import Stream, compose, workload_from_dict


# ---- the distribution ----

def test_a_member_is_the_same_drawn_alone_or_in_any_family():
    family = draw_family(6, family_seed=3)
    assert [m.params for m in family] == [draw_member(3, k).params for k in range(6)]
    assert draw_family(3, family_seed=3) == family[:3]
    assert draw_member(4, 2).params != draw_member(3, 2).params


def test_members_stay_within_the_documented_ranges():
    members = draw_family(120, family_seed=0)
    for m in members:
        p = m.params
        assert p.profile in PROFILES and m.profile.name == p.profile
        assert p.mix in MIXES and p.context in CONTEXTS
        assert MAX_TPE_RANGE[0] <= p.max_tpe <= MAX_TPE_RANGE[1]
        assert LOAD_RANGE[0] <= p.load <= LOAD_RANGE[1]
        assert p.duration_s == MEMBER_DURATION_S == m.workload.duration_s
        # The event rate is the load times the capacity's (streams rounded to 6 digits).
        assert p.eps == pytest.approx(p.load * p.capacity_eps, rel=1e-5)
        shapes = MIXES[p.mix]
        assert [s.name for s in m.workload.streams] == [s.name for s in shapes]
        for stream, shape in zip(m.workload.streams, shapes):
            assert stream.traces == shape.traces
            assert stream.max_tpe == (shape.max_tpe or p.max_tpe)
            assert stream.agents >= stream.max_tpe
            ranges = CONTEXTS[p.context]
            assert stream.context_tokens == (None if ranges is None
                                             else ranges[shape.context_kind])
        # The streams keep the mix's relative rates.
        total = sum(s.share for s in shapes)
        for stream, shape in zip(m.workload.streams, shapes):
            assert stream.eps / p.eps == pytest.approx(shape.share / total, rel=1e-5)
    # 120 draws reach every value of every categorical parameter, and both ends of the load.
    assert {m.params.profile for m in members} == set(PROFILES)
    assert {m.params.mix for m in members} == set(MIXES)
    assert {m.params.context for m in members} == set(CONTEXTS)
    assert {m.params.max_tpe for m in members} == set(range(1, 9))
    loads = [m.params.load for m in members]
    assert min(loads) < 0.1 and max(loads) > 1.5


def test_the_profiles_include_the_kv_limited_ones_and_no_cpu_profile():
    assert {"llama3-8b-fp8-rtx4080", "llama3-8b-a10", "llama3-8b-rtx4090",
            "llama3-8b-h100"} <= set(PROFILES)
    assert not any("cpu" in p for p in PROFILES)


def test_bad_family_arguments_name_the_field():
    with pytest.raises(ValueError, match="family seed"):
        draw_member(-1, 0)
    with pytest.raises(ValueError, match="family member"):
        draw_member(1, -2)
    with pytest.raises(ValueError, match="family size"):
        draw_family(0, 1)
    with pytest.raises(ValueError, match="duration_s"):
        draw_member(1, 0, duration_s=0)


def test_a_members_yaml_composes_the_same_events():
    for k in range(4):
        member = draw_member(5, k, duration_s=4.0)
        workload = workload_from_dict(yaml.safe_load(member_yaml(member)))
        assert workload == member.workload
        assert compose(workload) == compose(member.workload)


# ---- the capacity ----

PROFILE = EngineProfile(name="test", prefill_fixed_s=0.002, prefill_per_token_s=1e-4,
                        decode_fixed_s=0.01, decode_per_seq_s=0.001,
                        decode_per_ctx_token_s=1e-6, kv_block_size=16, kv_total_blocks=100)
SIZES = {1: TraceSize("a", prompt_tokens=100, cached_tokens=96, plan_tokens=20),
         2: TraceSize("b", prompt_tokens=50, cached_tokens=32, plan_tokens=60)}


def test_capacity_of_one_trace_is_the_profiles_arithmetic():
    cap = capacity(PROFILE, [Stream("s", 1.0, 3, (1,), 3)], SIZES)
    # A sequence holds ceil(120 / 16) = 8 blocks, 6 of them the shared prompt's: 2 of its own;
    # 100 - 6 shared blocks hold 47 sequences.
    assert cap.batch == 47
    context = 100 + (20 - 1) / 2
    assert cap.context_tokens == pytest.approx(context)
    step = 0.01 + 0.001 * 47 + 1e-6 * 47 * context
    assert cap.step_s == pytest.approx(step)
    assert cap.task_s == pytest.approx(1e-4 * 4 + 20 * step / 47)
    assert cap.tasks_per_event == 2.0  # Uniform{1..3}
    assert cap.events_per_s == pytest.approx(1 / cap.task_s / 2)


def test_capacity_weighs_streams_by_their_tasks_and_tokens():
    # Stream x: 1 event/s of 1 task (trace 1); stream y: 0.5 events/s of Uniform{1..3} (trace 2,
    # with 40 tokens of context): 1 task/s each.
    streams = [Stream("x", 1.0, 1, (1,), 1), Stream("y", 0.5, 3, (2,), 3, (30, 50))]
    cap = capacity(PROFILE, streams, SIZES)
    f = [0.5, 0.5]
    prompt, plan, cached = [100, 90], [20, 60], [96, 32]
    mean_plan = 0.5 * 20 + 0.5 * 60
    assert cap.plan_tokens == mean_plan
    token_w = [fi * g / mean_plan for fi, g in zip(f, plan)]
    context = sum(w * (p + (g - 1) / 2) for w, p, g in zip(token_w, prompt, plan))
    own = [math.ceil(120 / 16) - 6, math.ceil(150 / 16) - 2]  # 2 and 8 blocks
    held = sum(w * o for w, o in zip(token_w, own))
    batch = int((100 - 6 - 2) // held)
    assert cap.batch == batch
    step = 0.01 + 0.001 * batch + 1e-6 * batch * context
    prefill = 1e-4 * sum(fi * (p - c) for fi, p, c in zip(f, prompt, cached))
    assert cap.task_s == pytest.approx(prefill + mean_plan * step / batch)
    assert cap.tasks_per_event == pytest.approx(2 / 1.5)


def test_capacity_batch_stops_at_the_engines_sequences():
    roomy = EngineProfile(name="roomy", kv_total_blocks=100_000)
    assert capacity(roomy, [Stream("s", 1.0, 1, (1,), 1)], SIZES).batch == MAX_NUM_SEQS


def test_more_context_lowers_the_capacity():
    member = draw_member(1, 0)
    streams = member.workload.streams
    sizes = {tid: TraceSize("a", 100, 96, 20) for s in streams for tid in s.traces}
    plain = capacity(PROFILE, [Stream(s.name, s.eps, s.max_tpe, s.traces, s.agents)
                               for s in streams], sizes)
    longer = capacity(PROFILE, [Stream(s.name, s.eps, s.max_tpe, s.traces, s.agents, (500, 900))
                                for s in streams], sizes)
    assert longer.tasks_per_s < plain.tasks_per_s


# ---- the report ----

@dataclass
class _Task:
    utility: float
    response_time_s: float
    ert_s: float


def test_task_figures_count_a_task_without_response_as_late_with_its_utility():
    tasks = [_Task(2.0, 0.1, 0.2), _Task(-1.0, 0.4, 0.2), _Task(1.0, 0.5, 1.0),
             _Task(math.nan, math.nan, 1.0)]
    f = report.task_figures(tasks, urgent_ert_s=0.2)
    assert f["utility_mean"] == pytest.approx((2.0 - 1.0 + 1.0 + 0.0) / 4)
    assert f["late_share"] == pytest.approx(2 / 4)
    assert f["urgent_late_share"] == pytest.approx(1 / 2)
    assert f["urgent_tasks"] == 2 and f["tasks_without_response"] == 1


def _fig(u: float, late: float, urgent: float) -> dict:
    return {"utility_mean": u, "late_share": late, "urgent_late_share": urgent}


def _row(index: int, load: float, subject: dict, stream: dict, priority: dict,
         bound_u: float = 1.3) -> dict:
    params = {"index": index, "profile": "llama3-8b-rtx4090", "mix": "drone", "max_tpe": 4,
              "context": "none", "load": load, "events_per_s": 1.0}
    row = report.member_row(params, {"default": subject, "vllm-stream": stream,
                                     "vllm-priority": priority},
                            _fig(bound_u, 0.0, 0.0), "default")
    row["tasks"] = 100
    return row


def test_member_row_judges_against_the_better_baseline():
    win = _row(0, 1.0, _fig(1.20, 0.3, 0.2), _fig(1.10, 0.3, 0.6), _fig(1.15, 0.3, 0.5))
    assert win["best_baseline"] == "vllm-priority" and win["outcome"] == "win"
    assert win["delta"] == pytest.approx(0.05)
    assert win["overloaded"] and win["goal_b"] is True  # urgent 0.2 <= 0.5 * 0.5
    tie = _row(1, 0.5, _fig(1.196, 0.0, 0.0), _fig(1.20, 0.0, 0.0), _fig(1.20, 0.0, 0.0))
    assert tie["outcome"] == "tie" and tie["best_baseline"] == "vllm-stream"
    assert not tie["overloaded"] and tie["goal_b"] is None and tie["goal_c"] is None
    loss = _row(2, 1.5, _fig(1.00, 0.4, 0.4), _fig(1.03, 0.3, 0.5), _fig(1.02, 0.3, 0.5))
    assert loss["outcome"] == "loss" and loss["goal_b"] is False  # 0.4 > 0.25, behind
    light = _row(3, 0.1, _fig(1.29, 0.0, 0.0), _fig(1.28, 0.0, 0.0), _fig(1.28, 0.0, 0.0))
    assert light["light"] and light["goal_c"] is True  # 1.29 >= 0.99 * 1.3 = 1.287
    far = _row(4, 0.25, _fig(1.2, 0.0, 0.0), _fig(1.2, 0.0, 0.0), _fig(1.2, 0.0, 0.0))
    assert far["light"] and far["goal_c"] is False


def test_utility_lead_passes_an_overloaded_member_whose_urgent_tasks_are_not_halved():
    row = _row(0, 2.0, _fig(0.90, 0.5, 0.5), _fig(0.84, 0.5, 0.6), _fig(0.80, 0.5, 0.6))
    assert row["overloaded"] and row["goal_b"] is True


def test_summary_counts_and_goals():
    rows = [_row(0, 1.0, _fig(1.20, 0.3, 0.2), _fig(1.10, 0.3, 0.6), _fig(1.15, 0.3, 0.5)),
            _row(1, 0.5, _fig(1.196, 0.0, 0.0), _fig(1.20, 0.0, 0.0), _fig(1.20, 0.0, 0.0)),
            _row(2, 1.5, _fig(1.00, 0.4, 0.4), _fig(1.03, 0.3, 0.5), _fig(1.02, 0.3, 0.5)),
            _row(3, 0.1, _fig(1.29, 0.0, 0.0), _fig(1.28, 0.0, 0.0), _fig(1.28, 0.0, 0.0))]
    s = report.summarise(rows)
    assert (s["win"], s["tie"], s["loss"]) == (2, 1, 1)
    assert s["worst"] == {"index": 2, "delta": pytest.approx(-0.03)}
    assert s["goals"]["a"]["verdict"] == "fail"  # 75 % < 95 %, and -0.03 < -0.02
    assert s["goals"]["b"] == {"members": 2, "passed": 1, "verdict": "fail"}
    assert s["goals"]["c"] == {"members": 1, "passed": 1, "verdict": "pass"}
    s = report.summarise(rows[1:2] * 20)
    assert s["goals"]["a"]["verdict"] == "pass"
    assert s["goals"]["b"]["verdict"] == "n/a" and s["goals"]["c"]["verdict"] == "n/a"


def test_one_small_loss_in_twenty_members_still_meets_goal_a():
    tie = _row(0, 0.5, _fig(1.2, 0.0, 0.0), _fig(1.2, 0.0, 0.0), _fig(1.2, 0.0, 0.0))
    small_loss = _row(1, 0.5, _fig(1.19, 0.0, 0.0), _fig(1.2, 0.0, 0.0), _fig(1.2, 0.0, 0.0))
    s = report.summarise([tie] * 19 + [small_loss])
    assert s["loss"] == 1 and s["goals"]["a"]["verdict"] == "pass"
    s = report.summarise([tie] * 18 + [small_loss] * 2)
    assert s["goals"]["a"]["verdict"] == "fail"


def test_table_and_figure_from_hand_made_rows(tmp_path):
    rows = [_row(0, 1.0, _fig(1.20, 0.3, 0.2), _fig(1.10, 0.3, 0.6), _fig(1.15, 0.3, 0.5)),
            _row(3, 0.1, _fig(1.29, 0.0, 0.0), _fig(1.28, 0.0, 0.0), _fig(1.28, 0.0, 0.0))]
    doc = {"family": {"seed": 7, "duration_s": 60.0, "subject": "default",
                      "baselines": ["vllm-stream", "vllm-priority"]},
           "members": rows, "summary": report.summarise(rows)}
    text = report.format_family(doc)
    assert "win, overload" in text and "light" in text
    assert "2 wins, 0 ties, 0 losses" in text
    assert report.format_family_markdown(doc).count("\n") == 3
    assert report.plot_family(doc, tmp_path / "family.png").stat().st_size > 0


# ---- end to end ----

def test_cli_family_of_two_short_members(tmp_path, capsys):
    out = tmp_path / "family.json"
    assert cli.main(["--family", "2", "--family-seed", "1", "--duration-s", "3",
                     "--json", str(out), "--plots", str(tmp_path), "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    assert [r["index"] for r in doc["members"]] == [0, 1]
    for row in doc["members"]:
        assert set(row["policies"]) >= {row["subject"], "vllm-stream", "vllm-priority"}
        events = compose(draw_member(1, row["index"], duration_s=3.0).workload)
        assert row["tasks"] == sum(len(e.tasks) for e in events)
        assert row["bound"]["utility_mean"] >= row["policies"][row["subject"]]["utility_mean"] \
            - 0.05  # the bound can beat a response only by a few ms of prefix cache
        # The alone bound beside the burst bound, for the same tasks.
        assert row["bound_alone"]["urgent_tasks"] == row["bound"]["urgent_tasks"]
        assert row["subject_of_alone_bound"] == pytest.approx(
            row["policies"][row["subject"]]["utility_mean"] / row["bound_alone"]["utility_mean"])
    assert doc["summary"]["members"] == 2
    assert (tmp_path / "family.png").is_file()
    table = capsys.readouterr().out
    assert "(a)" in table and "(b)" in table and "(c)" in table

    # Member 1 replayed alone: its YAML, and the same figures.
    assert cli.main(["--family-member", "1", "--family-seed", "1", "--duration-s", "3",
                     "--json", str(tmp_path / "one.json"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "name: family-s1-m01" in printed
    alone = json.loads((tmp_path / "one.json").read_text())["members"][0]
    member = doc["members"][1]
    for name, figures in member["policies"].items():
        assert alone["policies"][name]["utility_mean"] == figures["utility_mean"]


@pytest.mark.parametrize("argv", [
    ["--family", "0"],
    ["--family", "2", "--family-subject", "no-such-policy"],
    ["--family", "2", "--family-subject", "default,vllm"],
    ["--family", "2", "--workload", "WID1"],
    ["--family", "2", "--profile", "config/engine_profiles/llama3-8b-a10.yaml"],
    ["--family-member", "-1"],
])
def test_cli_family_usage_errors(argv, capsys):
    assert cli.main([*argv, "--no-progress"]) == 2
    assert "error" in capsys.readouterr().err
