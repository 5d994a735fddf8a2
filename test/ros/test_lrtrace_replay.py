"""`timelyllm lrtrace replay` (timelyllm_ros/experiments/replay.py) and the executor backend `replay`
(timelyllm_ros/robots/replay.py).

- The backend replays recorded durations exactly (matched by call text, in recorded order, the
  robot's own rows first, cycling) and falls back to the execution-time model with a counter;
  directly and through make_backend. No ROS.
- Bad input exits before any node starts: an event list naming an unknown trace exits 1 and
  names the event; bad arguments exit 2.
- Over ROS (subprocesses: planner with the sim engine, executors at time scale 0.05, recorder):
  a 4-task event list finishes, prints the bench's table, writes the bench's JSON and a bag with
  the goals; a second replay with --durations-from that bag gives the robots the recorded
  durations again.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time

import pytest

from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.lrtrace import timing_table
from timelyllm_ros.lrtrace.timing_table import TimingRow
from timelyllm_ros.robots.factory import make_backend
from timelyllm_ros.robots.replay import (FALLBACK_PREFIX, REPLAYED_PREFIX, ReplayBackend,
                                         ReplayTable, call_key)
from timelyllm_ros.ros_env import REPO_ROOT


def _row(skill, arguments, robot, duration, *, start, success=True, seq=0):
    calls = skill.count(";") + 1
    return TimingRow(skill=skill, arguments=arguments, robot=robot, task_id=f"x{start:g}",
                     sequence=seq, start=float(start), finish=float(start) + duration,
                     duration=duration, success=success, calls_in_segment=calls)


ROWS = [
    _row("move_forward", "50", "drone_1", 1.5, start=10),
    _row("move_forward", "50", "drone_2", 9.0, start=11),
    _row("move_forward", "50", "drone_1", 99.0, start=12, success=False),  # skipped
    _row("move_forward", "50", "drone_1", 2.5, start=13),
    _row("sweeping", "cat", "drone_2", 4.0, start=14),
    _row("orienting;approach", "cat;", "drone_2", 3.25, start=15),
    _row("place", "box, table", "arm_1", 0.75, start=16),
]


@pytest.fixture()
def table_csv(tmp_path):
    # Written unsorted on purpose: the table's order (by start) is the replay order.
    return timing_table.write_csv(list(reversed(ROWS)), tmp_path / "skill_timings.csv")


def mf(n):
    return [SkillCall("move_forward", (str(n),))]


def test_call_keys_match_wire_form_and_table_rows():
    assert call_key(mf(50)) == "move_forward(50)"
    assert call_key(["move_forward( 50 )"]) == "move_forward(50)"
    assert call_key([SkillCall("orienting", ("cat",)), SkillCall("approach", ())]) == \
        "orienting(cat);approach()"
    table = ReplayTable(ROWS)
    assert table.keys() == ["move_forward(50)", "orienting(cat);approach()", "place(box,table)",
                            "sweeping(cat)"]
    assert table.skipped_failures == 1 and table.rows == 6


def test_replay_backend_replays_exact_durations_in_order(table_csv):
    model = ExecutionTimeModel.from_yaml(None)
    rows = timing_table.read_csv(table_csv)
    own = ReplayBackend(ReplayTable(rows), model, robot_id="drone_1")
    # drone_1's own rows, in recorded order, cycling; the failed 99 s row is never used.
    assert [own.next_duration(mf(50)).duration_s for _ in range(5)] == [1.5, 2.5, 1.5, 2.5, 1.5]
    # A robot without rows of its own gets every robot's, in recorded order.
    other = ReplayBackend(table_csv, model, robot_id="drone_9")
    assert [other.next_duration(mf(50)).duration_s for _ in range(4)] == [1.5, 9.0, 2.5, 1.5]
    draw = other.next_duration([SkillCall("orienting", ("cat",)), SkillCall("approach", ())])
    assert draw == (3.25, "orienting(cat);approach() recorded #1 of 1", True)
    assert other.next_duration(["place(box,table)"]).duration_s == 0.75
    assert other.next_duration([]).duration_s == 0.0
    assert (other.replayed, other.fallbacks) == (6, 0)  # an empty segment is neither
    # Never recorded: the execution-time model, counted.
    fb = other.next_duration(mf(70))
    assert not fb.replayed and fb.duration_s > 0 and "never recorded" in fb.note
    other.next_duration(mf(70))
    assert other.fallbacks == 2 and other.fallback_keys == {"move_forward(70)": 2}
    assert other.stats()["fallbacks"] == 2


def test_replay_backend_execute_sleeps_scaled_duration_and_reports(table_csv):
    backend = ReplayBackend(table_csv, ExecutionTimeModel.from_yaml(None), time_scale=0.02,
                            robot_id="drone_2")
    started = time.monotonic()
    ok, message = backend.execute([SkillCall("sweeping", ("cat",))])
    elapsed = time.monotonic() - started
    assert ok and message.startswith(f"{REPLAYED_PREFIX} 0.080 s: sweeping(cat)")
    assert elapsed >= 0.075
    ok, message = backend.execute([SkillCall("land", ())])
    assert ok and message.startswith(FALLBACK_PREFIX)
    # Shutting down interrupts the sleep and reports failure, as the sim backend does.
    stop = threading.Event()
    stop.set()
    slow = ReplayBackend(table_csv, ExecutionTimeModel.from_yaml(None), stop=stop)
    assert slow.execute(mf(50)) == (False, "executor shutting down")


def test_make_backend_replay(table_csv, tmp_path):
    backend = make_backend("replay", replay_table=str(table_csv), time_scale=0.5, seed=3,
                           robot_id="drone_1")
    assert isinstance(backend, ReplayBackend) and backend.time_scale == 0.5
    assert [backend.next_duration(mf(50)).duration_s for _ in range(3)] == [1.5, 2.5, 1.5]
    # Executor nodes pass model / time_scale / seed / stop to every kind.
    model = ExecutionTimeModel.from_yaml(None)
    backend = make_backend("REPLAY", model=model, replay_table=str(table_csv),
                           stop=threading.Event())
    assert backend.model is model and backend.next_duration(mf(50)).duration_s == 1.5
    with pytest.raises(ValueError, match="replay_table: required"):
        make_backend("replay")
    with pytest.raises(ValueError, match="no such timing table"):
        make_backend("replay", replay_table=str(tmp_path / "nope.csv"))
    bad = tmp_path / "bad.csv"
    bad.write_text("skill,arguments\nmove_forward,50\n")
    with pytest.raises(ValueError, match="header: missing column"):
        make_backend("replay", replay_table=str(bad))
    with pytest.raises(ValueError, match="time_scale"):
        make_backend("replay", replay_table=str(table_csv), time_scale=0)
    with pytest.raises(ValueError, match="host: not a parameter of backend 'replay'"):
        make_backend("replay", replay_table=str(table_csv), host="x")


# ------------------------------------------------------------------------------ bad input

def _cli(argv, capsys):
    from timelyllm_ros.cli.lrtrace import main

    code = main(["replay", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_unknown_trace_exits_1_naming_the_event(tmp_path, capsys):
    events = tmp_path / "events.yaml"
    events.write_text("events:\n"
                      "  - time_s: 0.5\n    tasks: [{robot: drone_a, trace: 1}]\n"
                      "  - time_s: 1.0\n    tasks: [{robot: drone_b, trace: 2}, {robot: drone_c, trace: 99}]\n")
    code, out, err = _cli([str(events)], capsys)
    assert code == 1
    assert "event 1" in err and "tasks[1]" in err and "unknown trace id 99" in err, err
    assert out == ""


def test_other_bad_input(tmp_path, capsys, monkeypatch):
    events = tmp_path / "events.yaml"
    events.write_text("events:\n  - time_s: 0.5\n    tasks: [{robot: drone_a, trace: 1, "
                      "tuf_level: hurry}]\n")
    code, _, err = _cli([str(events)], capsys)
    assert code == 1 and "event 0" in err and "tuf_level" in err and "hurry" in err, err
    code, _, err = _cli(["WID9"], capsys)
    assert code == 1 and "unknown workload preset" in err, err
    good = tmp_path / "good.yaml"
    good.write_text("events:\n  - time_s: 0.5\n    tasks: [{robot: drone_a, trace: 1}]\n")
    for argv, needle in (([str(good), "--time-scale", "0"], "--time-scale"),
                         ([str(good), "--policy", "nope"], "unknown policy 'nope'"),
                         ([str(good), "--no-robots"], "--no-robots"),
                         ([str(good), "--model", "m"], "--model")):
        code, _, err = _cli(argv, capsys)
        assert code == 2 and needle in err, (argv, err)
    code, _, err = _cli([str(good), "--durations-from", str(tmp_path / "none.csv")], capsys)
    assert code == 1 and "none.csv" in err, err
    code, _, err = _cli([str(good), "--exec-model", str(tmp_path / "none.yaml")], capsys)
    assert code == 1 and "--exec-model" in err, err
    (tmp_path / "taken").mkdir()
    code, _, err = _cli([str(good), "--record", str(tmp_path / "taken.mcap")], capsys)
    assert code == 1 and "already exists" in err, err
    pytest.importorskip("rclpy")
    # DDS maps the domain to UDP ports; beyond 232 every node would exit at start-up.
    monkeypatch.setenv("ROS_DOMAIN_ID", "240")
    code, _, err = _cli([str(good)], capsys)
    assert code == 1 and "ROS_DOMAIN_ID=240" in err, err


# ------------------------------------------------------------------------------ over ROS

EVENTS = """\
# 4 tasks over ~4 s: two drones (one gets two tasks), an urgent drone task and an arm task.
events:
  - time_s: 0.5
    tasks: [{robot: drone_a, trace: 1}]
  - time_s: 1.5
    tasks: [{robot: drone_b, trace: 6}, {robot: arm_a, trace: 9}]
  - time_s: 4.0
    tasks: [{robot: drone_a, trace: 2}]
"""
EXPECTED = {"t00000": (1, "drone_a"), "t00001": (6, "drone_b"), "t00002": (9, "arm_a"),
            "t00003": (2, "drone_a")}


def _replay(domain: int, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ROS_DOMAIN_ID": str(domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
           "RMW_IMPLEMENTATION": os.environ.get("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")}
    res = subprocess.run([sys.executable, "-m", "timelyllm_ros.cli.main", "lrtrace", "replay", *argv,
                          "--no-progress"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=480)
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-4000:]}"
    return res


@pytest.fixture(scope="module")
def first_replay(tmp_path_factory):
    pytest.importorskip("rclpy")
    root = tmp_path_factory.mktemp("replay")
    events = root / "events.yaml"
    events.write_text(EVENTS)
    res = _replay(231, str(events), "--time-scale", "0.05", "--seed", "3",
                  "--record", str(root / "run1.mcap"), "--json", str(root / "run1.json"))
    return root, res


@pytest.mark.ros
@pytest.mark.timeout(600)
def test_replay_over_ros_finishes_prints_table_writes_json_and_bag(first_replay):
    from timelyllm_ros.bench.metrics import METRIC_KEYS
    from timelyllm_ros.lrtrace import bag as bagmod
    from timelyllm_ros.lrtrace import message_types as msgtypes
    from timelyllm_ros.lrtrace.traces import load_traces

    root, res = first_replay
    # The bench's table, per type and overall.
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["policy", "type", "utility", "resp_ms", "wait_ms", "p99_ms", "miss%"]
    for needle in ("timelyllm  overall", "drone-normal", "drone-urgent", "arm", "sched overhead",
                   "4 tasks: 4 done"):
        assert needle in res.stdout, res.stdout
    # The bench's JSON schema.
    doc = json.loads((root / "run1.json").read_text())
    assert set(doc) >= {"policies", "workload", "replay"}
    pol = doc["policies"]["timelyllm"]
    assert set(pol) == {"overall", "by_type", "scheduling_overhead_ms"}
    assert set(pol["by_type"]) == {"drone-normal", "drone-urgent", "arm"}
    for bucket in (pol["overall"], *pol["by_type"].values()):
        assert set(bucket) == set(METRIC_KEYS)
        assert bucket["response_time_mean_s"] > 0 and bucket["waiting_time_mean_s"] > 0
        assert math.isfinite(bucket["utility_mean"])
    wl = doc["workload"]
    assert wl["tasks"] == 4 and wl["events"] == 3 and wl["seed"] == 3
    assert wl["tasks_not_done"] == {"timelyllm": 0} and wl["tasks_without_response"] == {"timelyllm": 0}
    assert wl["tasks_by_type"] == {"drone-normal": 2, "drone-urgent": 1, "arm": 1}
    assert doc["replay"]["states"] == {"done": 4} and doc["replay"]["statuses_from_client"] == 0
    assert doc["replay"]["robots"]["time_scale"] == 0.05
    # The bag holds the goals as published, and every task's final status.
    traces = load_traces()
    contents = bagmod.read_messages(root / "run1.mcap")
    goals = {m.msg.task_id: m.msg for m in contents.messages if m.msgtype == msgtypes.GOAL_TYPE}
    assert set(goals) == set(EXPECTED)
    for task_id, (trace_id, robot) in EXPECTED.items():
        goal, trace = goals[task_id], traces[trace_id]
        assert (goal.robot_id, goal.instruction, goal.skill_set, goal.urgency) == \
            (robot, trace.instruction, trace.skill_set, trace.tuf_level)
        assert msgtypes.stamp_s(goal.stamp) > 0
    final = {}
    for m in contents.messages:
        if m.msgtype == msgtypes.STATUS_TYPE:
            final[m.msg.task_id] = m.msg.state
    assert final == {t: "done" for t in EXPECTED}
    assert contents.topics["/arm_a/skill_segments"][1] >= 2
    assert (root / "run1" / timing_table.TABLE_NAME).is_file()


@pytest.mark.ros
@pytest.mark.timeout(600)
def test_replay_durations_from_a_bag_gives_robots_the_recorded_durations(first_replay):
    root, _ = first_replay
    res = _replay(232, str(root / "events.yaml"), "--durations-from", str(root / "run1.mcap"),
                  "--record", str(root / "run2.mcap"), "--json", str(root / "run2.json"))
    doc = json.loads((root / "run2.json").read_text())
    robots = doc["replay"]["robots"]
    assert robots["backend"] == "replay" and robots["fallback_segments"] == 0
    assert robots["replayed_segments"] > 0 and doc["replay"]["states"] == {"done": 4}
    assert "drawn from the execution-time model" in res.stdout
    first = {(r.task_id, r.sequence): r for r in timing_table.read_csv(root / "run1" / timing_table.TABLE_NAME)}
    again = {(r.task_id, r.sequence): r for r in timing_table.read_csv(root / "run2" / timing_table.TABLE_NAME)}
    # The same events give the same plans, so the same (task, segment) gets its recorded duration
    # back (robot's own rows, in order). A sleep may overrun a little, never end early.
    assert set(again) == set(first)
    for key, row in first.items():
        assert again[key].skill == row.skill
        assert again[key].message.startswith(REPLAYED_PREFIX), again[key].message
        assert row.duration - 0.005 <= again[key].duration <= row.duration + 0.25, (key, row, again[key])
