"""`timelyllm lrtrace` on the command line: table, fit, info, compose, and bad input.

Bags here are written with rosbags (no ROS needed); test_lrtrace_record.py covers recording over
real ROS topics. Every bad input must exit non-zero with a message naming the file and the line,
byte or field.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import yaml

from timelyllm_ros.cli import main as top_cli
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.lrtrace import bag as bagmod
from timelyllm_ros.lrtrace import message_types as msgtypes
from timelyllm_ros.cli import lrtrace as cli
from timelyllm_ros.lrtrace.event_lists import load_events


def _t(store, s: float):
    sec = math.floor(s)
    return store.types["builtin_interfaces/msg/Time"](sec=int(sec), nanosec=int(round((s - sec) * 1e9)) % 10**9)


def write_bag(path, calls_and_durations, *, seed=0):
    store = msgtypes.typestore()
    Seg, Rep = store.types[msgtypes.SEGMENT_TYPE], store.types[msgtypes.REPORT_TYPE]
    Goal = store.types[msgtypes.GOAL_TYPE]
    t = 100.0
    with bagmod.BagWriter(path) as w:
        w.write("/timelyllm/task_goals", Goal(task_id="g", robot_id="drone_1", skill_set="drone",
                                              instruction="find the cat", urgency="normal",
                                              expected_response_time_s=0.0, decline_slope_per_s=0.0,
                                              initial_utility=0.0, stamp=_t(store, t)), int(t * 1e9))
        for i, (calls, dur) in enumerate(calls_and_durations):
            w.write("/drone_1/skill_segments", Seg(
                task_id=f"k{i}", robot_id="drone_1", sequence=0, text="", calls=calls, is_last=True,
                estimated_execution_s=0.5, stamp=_t(store, t)), int(t * 1e9) + 1)
            w.write("/drone_1/execution_reports", Rep(
                task_id=f"k{i}", robot_id="drone_1", sequence=0, started=_t(store, t),
                finished=_t(store, t + dur), success=True, message="ok"), int((t + dur) * 1e9) + 2)
            t += dur + 0.5
    return w.bag_dir


def _good_plan(seed=1):
    rng = np.random.default_rng(seed)
    plan = []
    for _ in range(12):
        x = int(rng.choice([20, 50, 100, 200, 400]))
        plan.append((["move_forward(%d)" % x], (1.0 + 0.02 * x) * math.exp(rng.normal(0, 0.02))))
        d = int(rng.choice([30, 90, 180, 360]))
        plan.append((["turn_cw(%d)" % d], (0.8 + d / 90) * math.exp(rng.normal(0, 0.02))))
        plan.append((["sweeping(bottle)"], float(rng.choice([1.5, 3.0, 4.5, 6.0]))))
    return plan


@pytest.fixture(scope="module")
def good_bag(tmp_path_factory):
    return write_bag(tmp_path_factory.mktemp("cli") / "good.mcap", _good_plan())


def test_top_level_cli_lists_lrtrace(capsys):
    with pytest.raises(SystemExit) as exc:
        top_cli.main(["lrtrace", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for sub in ("record", "table", "fit", "compose", "info"):
        assert sub in out


def test_info_lists_topics(good_bag, capsys):
    assert cli.main(["info", str(good_bag)]) == 0
    out = capsys.readouterr().out
    assert "messages: 73" in out
    assert "/drone_1/skill_segments" in out and "timelyllm_ros/msg/SkillSegment" in out


def test_table_beside_bag_and_to_file(good_bag, tmp_path, capsys):
    assert cli.main(["table", str(good_bag)]) == 0
    beside = good_bag / "skill_timings.csv"
    assert beside.is_file() and "36 rows" in capsys.readouterr().out
    assert cli.main(["table", str(good_bag / "good.mcap"), "-o", str(tmp_path / "t.csv")]) == 0
    assert (tmp_path / "t.csv").read_text() == beside.read_text()


def test_fit_from_bag_writes_model_summary_and_plots(good_bag, tmp_path, capsys):
    out = tmp_path / "model.yaml"
    assert cli.main(["fit", str(good_bag), "-o", str(out), "--plots", str(tmp_path / "plots")]) == 0
    printed = capsys.readouterr().out
    assert "move_forward" in printed and "RMSE" in printed and "wrote" in printed
    model = ExecutionTimeModel.from_yaml(out)
    assert model.model_for("move_forward").kind == "linear"
    assert abs(model.model_for("move_forward").fixed_s - 1.0) < 0.1
    assert model.model_for("sweeping").kind == "empirical"
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"move_forward.png", "turn_cw.png", "sweeping.png"}


def test_fit_from_table_csv(good_bag, tmp_path):
    cli.main(["table", str(good_bag), "-o", str(tmp_path / "t.csv")])
    assert cli.main(["fit", str(tmp_path / "t.csv"), "-o", str(tmp_path / "m.yaml")]) == 0
    assert ExecutionTimeModel.from_yaml(tmp_path / "m.yaml").model_for("turn_cw").kind == "linear"


# --- bad input: too few samples ------------------------------------------------------------------

def test_fit_with_too_few_samples_fails_naming_the_skill(tmp_path, capsys):
    plan = _good_plan() + [(["move_left(50)"], 2.0), (["move_left(100)"], 3.0), (["query(x)"], 1.0)]
    bag_dir = write_bag(tmp_path / "sparse.mcap", plan)
    out = tmp_path / "m.yaml"
    assert cli.main(["fit", str(bag_dir), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "move_left: 2 samples" in err and "MIN_LINEAR_SAMPLES" in err
    assert "query: 1 sample" in err and "--allow-sparse" in err
    assert not out.exists()
    assert cli.main(["fit", str(bag_dir), "-o", str(out), "--allow-sparse"]) == 0
    captured = capsys.readouterr()
    assert "warning: move_left" in captured.err
    base = yaml.safe_load((tmp_path / "m.yaml").read_text())["skills"]["move_left"]
    assert base["fixed_s"] == 1.0 and base["per_unit_s"] == 0.02  # kept from config/exec_model.yaml


# --- bad input: corrupt bags ---------------------------------------------------------------------

def _copy_bag(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_truncated_bag(good_bag, tmp_path, capsys):
    bag_dir = _copy_bag(good_bag, tmp_path / "trunc")
    data = (bag_dir / "good.mcap").read_bytes()
    (bag_dir / "good.mcap").write_bytes(data[: len(data) // 2])
    assert cli.main(["table", str(bag_dir)]) == 1
    err = capsys.readouterr().err
    assert "good.mcap: byte " in err and "truncated" in err and "--salvage" in err
    assert cli.main(["fit", str(bag_dir), "-o", str(tmp_path / "m.yaml")]) == 1
    assert "good.mcap: byte " in capsys.readouterr().err
    # --salvage keeps what precedes the damage
    assert cli.main(["table", str(bag_dir), "--salvage", "-o", str(tmp_path / "s.csv")]) == 0
    assert "warning: salvaged" in capsys.readouterr().err


def test_garbage_bytes(tmp_path, capsys):
    junk = tmp_path / "junk.mcap"
    junk.write_bytes(bytes(range(256)) * 8)
    assert cli.main(["fit", str(junk), "-o", str(tmp_path / "m.yaml")]) == 1
    assert "junk.mcap: byte 0: not an MCAP file" in capsys.readouterr().err
    magic_then_junk = tmp_path / "mj.mcap"
    magic_then_junk.write_bytes(b"\x89MCAP0\r\n" + b"\xff" * 300)
    assert cli.main(["table", str(magic_then_junk)]) == 1
    err = capsys.readouterr().err
    assert "mj.mcap: byte 8" in err


def test_corrupt_message_payload_names_the_message(tmp_path, capsys):
    store = msgtypes.typestore()
    with bagmod.BagWriter(tmp_path / "bad.mcap", store=store) as w:
        w.write_raw("/drone_1/skill_segments", msgtypes.SEGMENT_TYPE, b"\x00\x01\x00\x00\xff\xff\xff\x7f", 5_000_000_000)
    assert cli.main(["table", str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err
    assert "message 0 on /drone_1/skill_segments at t=5.000000" in err
    assert "cannot deserialize as timelyllm_ros/msg/SkillSegment" in err


def test_missing_bag_and_broken_metadata(good_bag, tmp_path, capsys):
    assert cli.main(["table", str(tmp_path / "nope.mcap")]) == 1
    assert "no such bag" in capsys.readouterr().err
    bag_dir = _copy_bag(good_bag, tmp_path / "meta")
    (bag_dir / "metadata.yaml").write_text("rosbag2_bagfile_information: [unclosed\n")
    assert cli.main(["info", str(bag_dir)]) == 1
    assert "metadata.yaml" in capsys.readouterr().err


# --- bad input: timing tables --------------------------------------------------------------------

HEADER = "skill,arguments,robot,task_id,sequence,start,finish,duration,success\n"


@pytest.mark.parametrize("body, expect", [
    ("skill,robot\nmove_forward,r\n", "t.csv:1: header: missing column(s) arguments"),
    (HEADER + "move_forward,50,r,a,0,1,3,2,true\nmove_forward,60,r,b,0,1,3,abc,true\n",
     "t.csv:3: duration: 'abc' is not a number"),
    (HEADER + "move_forward,50,r,a,0,5,3,2,true\n", "t.csv:2: finish: 3.0 is before start 5.0"),
    (HEADER + "move_forward,50,r,a,0,1,3,2,maybe\n", "t.csv:2: success: 'maybe' is not true/false"),
    (HEADER + "move_forward,50,r,a,0,1,3\n", "t.csv:2: expected 9 columns, got 7"),
    ("", "t.csv:1: empty file"),
])
def test_bad_table_names_the_line(tmp_path, capsys, body, expect):
    (tmp_path / "t.csv").write_text(body)
    assert cli.main(["fit", str(tmp_path / "t.csv"), "-o", str(tmp_path / "m.yaml")]) == 1
    assert expect in capsys.readouterr().err


# --- compose -------------------------------------------------------------------------------------

def test_compose_preset_with_seed_is_reproducible(tmp_path, capsys):
    a, b, c = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "c.yaml"
    assert cli.main(["compose", "WID1", "-o", str(a), "--seed", "5"]) == 0
    assert cli.main(["compose", "wid1", "-o", str(b), "--seed", "5"]) == 0
    assert cli.main(["compose", "WID1", "-o", str(c), "--seed", "6"]) == 0
    assert a.read_text() == b.read_text() != c.read_text()
    events = load_events(a)
    assert events and all(1 <= len(e.tasks) <= 8 for e in events)
    assert "wrote" in capsys.readouterr().out and "seed 5" in a.read_text()


def test_compose_notation(tmp_path):
    out = tmp_path / "n.yaml"
    assert cli.main(["compose", "--notation", "{(1,2), 3, 9}", "-o", str(out), "--interval", "2"]) == 0
    events = load_events(out)
    assert [len(e.tasks) for e in events] == [2, 1, 1]
    assert [e.time_s for e in events] == [0.0, 2.0, 4.0]


def test_compose_errors(tmp_path, capsys):
    out = str(tmp_path / "x.yaml")
    assert cli.main(["compose", "--notation", "{(1,2), 3", "-o", out]) == 1
    assert "event notation: expected '}'" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("eps: -1\nmax_tpe: 2\ntraces: [1]\nagents: 3\nduration_s: 10\n")
    assert cli.main(["compose", str(bad), "-o", out]) == 1
    assert "bad.yaml: eps: must be >= 0" in capsys.readouterr().err
    assert cli.main(["compose", "WID7", "-o", out]) == 1
    assert "unknown workload preset" in capsys.readouterr().err
    assert cli.main(["compose", "-o", out]) == 2
    assert cli.main(["compose", "WID1", "--notation", "1", "-o", out]) == 2
