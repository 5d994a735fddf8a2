"""LRTrace recorder over real ROS 2 topics: a recorder process, a publisher process, a bag.

The recorder runs as `timelyllm lrtrace record` in a subprocess; the publisher is this file run
as a script (`python test_lrtrace_record.py publish full|small`), on a private ROS domain
(150-200) on loopback. Checks: every message acknowledged before SIGINT / SIGTERM is in the bag;
robots appearing (drone_9, never named), disappearing and coming back (drone_1) are recorded;
the bag is a rosbag2 MCAP directory that an independent reader (`mcap`) and rosbags read, with the
type names, encoding, hashes and QoS `ros2 bag` expects; the timing table is written beside it;
a SIGKILLed recorder leaves a file whose flushed messages `--salvage` recovers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

if __name__ != "__main__":
    import pytest

    pytest.importorskip("rclpy")
    from timelyllm_ros.ros_env import interfaces_built

    if not interfaces_built():
        pytest.skip("message types not built (run scripts/bootstrap.sh)", allow_module_level=True)
    pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
# Domains 150-200 are this file's; each test takes its own so a slow shutdown cannot leak.
DOMAIN_BASE = 150 + os.getpid() % 40
FULL_TOTAL = 16  # messages the "full" publisher sends (see _publish_full)
SMALL_TOTAL = 3


# --- the publisher (this file run as a script) ---------------------------------------------------

def _publisher_main(mode: str) -> int:
    import rclpy
    from builtin_interfaces.msg import Time
    from rclpy.duration import Duration
    from rclpy.node import Node

    from timelyllm_ros.msg import ExecutionReport, SkillSegment, TaskGoal, TaskStatus
    from timelyllm_ros.ros import topics

    rclpy.init()
    node = Node("lrtrace_test_publisher")
    sent = 0

    def spin_until(pred, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            if time.monotonic() > deadline:
                raise SystemExit(f"publisher: timed out waiting for {what}")
            rclpy.spin_once(node, timeout_sec=0.05)

    def matched(pub, what):
        spin_until(lambda: pub.get_subscription_count() > 0, 90, f"a subscriber on {what}")

    def publish(pub, msg):
        nonlocal sent
        pub.publish(msg)
        sent += 1
        rclpy.spin_once(node, timeout_sec=0.02)

    def acked(*pubs):
        for p in pubs:
            p.wait_for_all_acked(Duration(seconds=10))

    def robot(robot_id):
        seg = node.create_publisher(SkillSegment, topics.robot_topic(robot_id, topics.SKILL_SEGMENTS),
                                    topics.COMMAND_QOS)
        rep = node.create_publisher(ExecutionReport, topics.robot_topic(robot_id, topics.EXECUTION_REPORTS),
                                    topics.COMMAND_QOS)
        matched(seg, f"{robot_id} segments")
        matched(rep, f"{robot_id} reports")
        return seg, rep

    def segment(robot_id, task, seq, calls, last=False):
        return SkillSegment(task_id=task, robot_id=robot_id, sequence=seq, text=";".join(calls),
                            calls=calls, is_last=last, estimated_execution_s=1.25,
                            stamp=Time(sec=1000 + seq, nanosec=5))

    def report(robot_id, task, seq, start, dur, ok=True):
        sec = int(start)
        fin = start + dur
        return ExecutionReport(task_id=task, robot_id=robot_id, sequence=seq,
                               started=Time(sec=sec, nanosec=int(round((start - sec) * 1e9))),
                               finished=Time(sec=int(fin), nanosec=int(round((fin - int(fin)) * 1e9))),
                               success=ok, message=f"{task}#{seq}")

    goals = node.create_publisher(TaskGoal, topics.TASK_GOALS, topics.COMMAND_QOS)
    status = node.create_publisher(TaskStatus, topics.TASK_STATUS, topics.STATUS_QOS)
    matched(goals, "task goals")
    matched(status, "task status")
    if mode == "small":
        for i in range(SMALL_TOTAL):
            publish(goals, TaskGoal(task_id=f"s{i}", robot_id="drone_1", skill_set="drone",
                                    instruction=f"small {i}", urgency="normal"))
        acked(goals)
    else:
        for i, urgency in enumerate(("normal", "urgent")):
            publish(goals, TaskGoal(task_id=f"t{i + 1}", robot_id="drone_1", skill_set="drone",
                                    instruction=f"find the cat {i}", urgency=urgency,
                                    stamp=Time(sec=900, nanosec=i)))
        publish(status, TaskStatus(task_id="t1", robot_id="drone_1", state="queued",
                                   response_time_s=float("nan"), utility=float("nan"),
                                   waiting_time_s=float("nan")))
        publish(status, TaskStatus(task_id="t1", robot_id="drone_1", state="done", reason="ok",
                                   response_time_s=0.25, utility=1.0, waiting_time_s=0.5,
                                   segments_dispatched=3, segments_completed=3))
        # drone_1 (given with --robots): three segments, the last without calls.
        seg, rep = robot("drone_1")
        publish(seg, segment("drone_1", "t1", 0, ["move_forward(50)"]))
        publish(seg, segment("drone_1", "t1", 1, ["turn_cw(90)"]))
        publish(seg, segment("drone_1", "t1", 2, [], last=True))
        publish(rep, report("drone_1", "t1", 0, 2000.0, 2.0))
        publish(rep, report("drone_1", "t1", 1, 2002.5, 1.5))
        publish(rep, report("drone_1", "t1", 2, 2004.0, 0.0))
        acked(goals, status, seg, rep)
        node.destroy_publisher(seg)  # drone_1 goes away
        node.destroy_publisher(rep)
        # drone_9 was never named: the recorder must discover it.
        seg9, rep9 = robot("drone_9")
        publish(seg9, segment("drone_9", "t2", 0, ["move_forward(100)", "turn_ccw(45)"]))
        publish(seg9, segment("drone_9", "t2", 1, ["sweeping(bottle)"], last=True))
        publish(rep9, report("drone_9", "t2", 0, 3000.0, 4.0))
        publish(rep9, report("drone_9", "t2", 1, 3004.0, 4.5, ok=False))
        acked(seg9, rep9)
        # drone_1 comes back.
        seg, rep = robot("drone_1")
        publish(seg, segment("drone_1", "t3", 0, ["delay(500)"], last=True))
        publish(rep, report("drone_1", "t3", 0, 4000.0, 0.5))
        acked(seg, rep)
        assert sent == FULL_TOTAL, sent
    print(f"published {sent}", flush=True)
    time.sleep(0.5)
    node.destroy_node()
    rclpy.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(_publisher_main(sys.argv[2] if len(sys.argv) > 2 else "full"))


# --- helpers -------------------------------------------------------------------------------------

def _env(domain: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"ROS_DOMAIN_ID": str(domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
                "RMW_IMPLEMENTATION": env.get("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp"),
                "PYTHONUNBUFFERED": "1"})
    return env


class Recorder:
    """`timelyllm lrtrace record` in a subprocess, its output collected line by line."""

    def __init__(self, domain: int, output: Path, *extra: str):
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "timelyllm_ros.cli.main", "lrtrace", "record", "-o", str(output), *extra],
            cwd=REPO, env=_env(domain), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            bufsize=1)
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while True:
            exited = self.proc.poll() is not None
            if exited:
                self._pump_thread.join(timeout=5)
            with self._cv:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                if exited or time.monotonic() > deadline:
                    raise AssertionError(f"recorder never printed {pattern!r}; output:\n" + self.output())
                self._cv.wait(0.5)

    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self, sig=signal.SIGINT, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("recorder did not stop; output:\n" + self.output())


def _publish(domain: int, mode: str) -> None:
    res = subprocess.run([sys.executable, __file__, "publish", mode], cwd=REPO, env=_env(domain),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"publisher failed:\n{res.stdout}\n{res.stderr}"


def _acknowledged(rec: Recorder, n: int, timeout_s: float = 90) -> None:
    rec.wait_for(rf"\[lrtrace\] recorded {n} messages", timeout_s)


# --- tests ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def full_recording(tmp_path_factory):
    out = tmp_path_factory.mktemp("lrtrace-rec") / "run.mcap"
    rec = Recorder(DOMAIN_BASE, out, "--robots", "drone_1")
    try:
        rec.wait_for(r"\[lrtrace\] recording to", 120)
        _publish(DOMAIN_BASE, "full")
        _acknowledged(rec, FULL_TOTAL)
    finally:
        rc = rec.stop(signal.SIGINT)
    return out.with_suffix(""), rec, rc


def test_sigint_keeps_every_acknowledged_message(full_recording):
    bag_dir, rec, rc = full_recording
    assert rc == 0, rec.output()
    from timelyllm_ros.lrtrace.bag import read_messages

    contents = read_messages(bag_dir)
    assert len(contents.messages) == FULL_TOTAL
    counts = {t: c for t, (_, c) in contents.topics.items()}
    assert counts == {"/timelyllm/task_goals": 2, "/timelyllm/task_status": 2,
                      "/drone_1/skill_segments": 4, "/drone_1/execution_reports": 4,
                      "/drone_9/skill_segments": 2, "/drone_9/execution_reports": 2}
    assert "discovered robot drone_9" in rec.output()
    assert re.search(rf"closed .*: {FULL_TOTAL} messages", rec.output())


def test_independent_mcap_reader_sees_a_ros2_bag(full_recording):
    """What `ros2 bag` relies on, checked with the `mcap` package (not rosbags)."""
    import yaml
    from mcap.reader import make_reader

    bag_dir, _, _ = full_recording
    meta_path = bag_dir / "metadata.yaml"
    assert meta_path.is_file() and (bag_dir / "run.mcap").is_file()
    with (bag_dir / "run.mcap").open("rb") as fh:
        reader = make_reader(fh)
        summary = reader.get_summary()
        assert reader.get_header().profile == "ros2"
        schemas = {s.id: s for s in summary.schemas.values()}
        channels = {c.topic: c for c in summary.channels.values()}
        assert {schemas[c.schema_id].name for c in channels.values()} == {
            "timelyllm_ros/msg/TaskGoal", "timelyllm_ros/msg/TaskStatus",
            "timelyllm_ros/msg/SkillSegment", "timelyllm_ros/msg/ExecutionReport"}
        assert all(s.encoding == "ros2msg" for s in schemas.values())
        assert all(c.message_encoding == "cdr" for c in channels.values())
        assert schemas[channels["/timelyllm/task_goals"].schema_id].name == "timelyllm_ros/msg/TaskGoal"
        assert b"builtin_interfaces/Time" in schemas[channels["/timelyllm/task_goals"].schema_id].data
        by_id = {c.id: t for t, c in channels.items()}
        stats = {by_id[cid]: n for cid, n in summary.statistics.channel_message_counts.items()}
        assert stats["/drone_9/skill_segments"] == 2 and sum(stats.values()) == FULL_TOTAL
        iterated: dict[str, int] = {}
        for _, channel, message in reader.iter_messages():
            assert message.data[:4] == b"\x00\x01\x00\x00"  # CDR little endian encapsulation
            iterated[channel.topic] = iterated.get(channel.topic, 0) + 1
        assert iterated == stats
    meta = yaml.safe_load(meta_path.read_text())["rosbag2_bagfile_information"]
    assert meta["version"] == 9 and meta["storage_identifier"] == "mcap"
    assert meta["relative_file_paths"] == ["run.mcap"] and meta["message_count"] == FULL_TOTAL
    topics = {t["topic_metadata"]["name"]: t for t in meta["topics_with_message_count"]}
    status = topics["/timelyllm/task_status"]["topic_metadata"]
    assert status["type"] == "timelyllm_ros/msg/TaskStatus"
    assert status["serialization_format"] == "cdr"
    qos = status["offered_qos_profiles"]
    qos = yaml.safe_load(qos) if isinstance(qos, str) else qos
    assert qos[0]["durability"] == "transient_local" and qos[0]["reliability"] == "reliable"
    goal_qos = topics["/timelyllm/task_goals"]["topic_metadata"]["offered_qos_profiles"]
    goal_qos = yaml.safe_load(goal_qos) if isinstance(goal_qos, str) else goal_qos
    assert goal_qos[0]["durability"] == "volatile" and goal_qos[0]["depth"] == 50
    # Type hashes equal to what rosidl generated for our messages (ros2 bag checks them).
    share = REPO / ".cache" / "colcon" / "install" / "timelyllm_ros" / "share" / "timelyllm_ros" / "msg"
    if share.is_dir():
        for t in meta["topics_with_message_count"]:
            tm = t["topic_metadata"]
            desc = json.loads((share / (tm["type"].rsplit("/", 1)[1] + ".json")).read_text())
            rosidl_hash = desc["type_hashes"][0]["hash_string"]
            assert tm["type_description_hash"] == rosidl_hash, tm["name"]


def test_rosbags_reader_gives_back_field_values(full_recording):
    from rclpy.serialization import deserialize_message
    from rosbags.highlevel import AnyReader

    from timelyllm_ros.msg import SkillSegment

    bag_dir, _, _ = full_recording
    with AnyReader([bag_dir]) as reader:
        segs, goals, statuses, reports = [], [], [], []
        raw_segment = None
        for conn, _, raw in reader.messages():
            msg = reader.deserialize(raw, conn.msgtype)
            {"timelyllm_ros/msg/SkillSegment": segs, "timelyllm_ros/msg/TaskGoal": goals,
             "timelyllm_ros/msg/TaskStatus": statuses,
             "timelyllm_ros/msg/ExecutionReport": reports}[conn.msgtype].append(msg)
            if conn.msgtype.endswith("SkillSegment") and raw_segment is None:
                raw_segment = raw
    multi = next(s for s in segs if s.task_id == "t2" and s.sequence == 0)
    assert multi.calls == ["move_forward(100)", "turn_ccw(45)"] and multi.robot_id == "drone_9"
    assert multi.estimated_execution_s == 1.25 and multi.stamp.sec == 1000 and multi.stamp.nanosec == 5
    assert [g.urgency for g in sorted(goals, key=lambda g: g.task_id)] == ["normal", "urgent"]
    done = next(s for s in statuses if s.state == "done")
    assert done.utility == 1.0 and done.segments_completed == 3 and done.reason == "ok"
    failed = next(r for r in reports if r.task_id == "t2" and r.sequence == 1)
    assert failed.success is False and failed.message == "t2#1"
    assert failed.finished.sec - failed.started.sec == 4
    # rclpy (what ros2 bag play publishes from) decodes our bytes to the same message.
    back = deserialize_message(bytes(raw_segment), SkillSegment)
    assert back.task_id in {"t1", "t2", "t3"} and back.estimated_execution_s == 1.25


def test_timing_table_written_beside_the_bag(full_recording):
    from timelyllm_ros.lrtrace.timing_table import read_csv

    bag_dir, rec, _ = full_recording
    rows = {(r.task_id, r.sequence): r for r in read_csv(bag_dir / "skill_timings.csv")}
    assert set(rows) == {("t1", 0), ("t1", 1), ("t2", 0), ("t2", 1), ("t3", 0)}
    assert rows[("t1", 0)].skill == "move_forward" and rows[("t1", 0)].arguments == "50"
    assert abs(rows[("t1", 0)].duration - 2.0) < 1e-6 and rows[("t1", 0)].robot == "drone_1"
    multi = rows[("t2", 0)]
    assert multi.skill == "move_forward;turn_ccw" and multi.arguments == "100;45"
    assert multi.calls_in_segment == 2 and multi.robot == "drone_9"
    assert rows[("t2", 1)].success is False
    assert rows[("t3", 0)].skill == "delay" and abs(rows[("t3", 0)].duration - 0.5) < 1e-6
    assert "wrote" in rec.output() and "skill_timings.csv" in rec.output()


def test_truncated_recording_is_a_clear_error(full_recording, tmp_path, capsys):
    from timelyllm_ros.cli import lrtrace as cli

    bag_dir, _, _ = full_recording
    data = (bag_dir / "run.mcap").read_bytes()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metadata.yaml").write_text((bag_dir / "metadata.yaml").read_text())
    (broken / "run.mcap").write_bytes(data[: len(data) * 2 // 3])
    assert cli.main(["table", str(broken)]) == 1
    err = capsys.readouterr().err
    assert "run.mcap: byte " in err and "truncated" in err and "--salvage" in err
    assert cli.main(["fit", str(broken), "-o", str(tmp_path / "m.yaml")]) == 1
    assert "byte " in capsys.readouterr().err
    assert not (tmp_path / "m.yaml").exists()


def test_sigterm_closes_the_bag(tmp_path):
    domain = DOMAIN_BASE + 1
    out = tmp_path / "term.mcap"
    rec = Recorder(domain, out)
    try:
        rec.wait_for(r"\[lrtrace\] recording to", 120)
        _publish(domain, "small")
        _acknowledged(rec, SMALL_TOTAL)
    finally:
        rc = rec.stop(signal.SIGTERM)
    assert rc == 0, rec.output()
    from timelyllm_ros.lrtrace.bag import read_messages

    contents = read_messages(tmp_path / "term")
    assert [bagmsg.msg.task_id for bagmsg in contents.messages] == [f"s{i}" for i in range(SMALL_TOTAL)]
    assert (tmp_path / "term" / "metadata.yaml").is_file()
    assert (tmp_path / "term" / "skill_timings.csv").read_text().startswith("skill,arguments,robot")


def test_sigkill_leaves_acknowledged_messages_salvageable(tmp_path, capsys):
    """Acknowledged means flushed: even a recorder killed without a chance to close loses
    nothing it acknowledged; the strict reader refuses the footer-less file, --salvage reads it."""
    from timelyllm_ros.cli import lrtrace as cli

    domain = DOMAIN_BASE + 2
    out = tmp_path / "killed.mcap"
    rec = Recorder(domain, out)
    try:
        rec.wait_for(r"\[lrtrace\] recording to", 120)
        _publish(domain, "small")
        _acknowledged(rec, SMALL_TOTAL)
    finally:
        rec.stop(signal.SIGKILL)
    bag_dir = tmp_path / "killed"
    assert not (bag_dir / "metadata.yaml").exists()
    assert cli.main(["info", str(bag_dir)]) == 1
    assert "--salvage" in capsys.readouterr().err
    assert cli.main(["info", str(bag_dir), "--salvage"]) == 0
    printed = capsys.readouterr()
    assert re.search(r"/timelyllm/task_goals\s+timelyllm_ros/msg/TaskGoal\s+3", printed.out), printed


def test_node_with_ros_args_and_duration_stops_by_itself(tmp_path):
    """As a launch file starts it: `python -m ...lrtrace_recorder_node --ros-args -p ...`."""
    out = tmp_path / "idle.mcap"
    proc = subprocess.run(
        [sys.executable, "-m", "timelyllm_ros.ros.lrtrace_recorder_node", "--ros-args",
         "-p", f"output:={out}", "-p", "robots:=drone_1,drone_2", "-p", "duration_s:=2.0"],
        cwd=REPO, env=_env(DOMAIN_BASE + 3), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "robots: drone_1, drone_2; for 2 s" in proc.stdout
    from timelyllm_ros.lrtrace.bag import read_messages

    contents = read_messages(out)  # the -o name resolves to the bag directory
    assert contents.messages == []
    assert set(contents.topics) == {"/timelyllm/task_goals", "/timelyllm/task_status",
                                    "/drone_1/skill_segments", "/drone_1/execution_reports",
                                    "/drone_2/skill_segments", "/drone_2/execution_reports"}
    assert (tmp_path / "idle" / "skill_timings.csv").is_file()


def test_existing_output_is_refused(tmp_path, capsys):
    from timelyllm_ros.cli import lrtrace as cli

    (tmp_path / "taken").mkdir()
    assert cli.main(["record", "-o", str(tmp_path / "taken.mcap")]) == 1
    assert "already exists" in capsys.readouterr().err


def test_bad_arguments_exit_2_and_create_nothing(tmp_path, capsys):
    from timelyllm_ros.cli import lrtrace as cli

    assert cli.main(["record", "-o", str(tmp_path / "r.mcap"), "--robots", "drone 1"]) == 2
    assert "'drone 1' is not a valid ROS namespace" in capsys.readouterr().err
    assert cli.main(["record", "-o", str(tmp_path / "r.mcap"), "--duration", "-1"]) == 2
    assert not (tmp_path / "r").exists()


def test_rclpy_round_trip_of_every_message_type():
    """rclpy -> rosbags dataclass -> CDR -> rclpy gives back every field (NaN included)."""
    import math as _math

    from builtin_interfaces.msg import Time
    from rclpy.serialization import deserialize_message, serialize_message

    from timelyllm_ros.lrtrace import message_types as msgtypes
    from timelyllm_ros.msg import (ExecutionReport, PlannerMetrics, SkillSegment, TaskGoal,
                                   TaskStatus)

    msgs = [
        TaskGoal(task_id="a", robot_id="drone_1", skill_set="drone", instruction="find ✓ the cat",
                 urgency="", expected_response_time_s=0.5, decline_slope_per_s=2.0,
                 initial_utility=1.0, stamp=Time(sec=3, nanosec=999_999_999)),
        SkillSegment(task_id="a", robot_id="drone_1", sequence=7, text="8{tc,45;}",
                     calls=["turn_cw(45)"] * 3, is_last=True, estimated_execution_s=2.5),
        ExecutionReport(task_id="a", robot_id="drone_1", sequence=2**32 - 1, success=False,
                        started=Time(sec=1, nanosec=2), finished=Time(sec=3, nanosec=4), message="x"),
        TaskStatus(task_id="a", state="done", response_time_s=float("nan"), utility=-0.5,
                   waiting_time_s=1.25, cached_tokens_total=1152),
        PlannerMetrics(policy="timelyllm", engine="vllm", queued=3, kv_free_blocks=10,
                       fetch_overhead_ms=2.03),
    ]
    for msg in msgs:
        msgtype = msgtypes.msgtype_of(msg)
        raw = msgtypes.serialize(msg)
        back = deserialize_message(raw, type(msg))  # what ros2 bag play would publish
        again = msgtypes.to_rclpy(msgtypes.deserialize(raw, msgtype))
        for other in (back, again):
            for name in msg.get_fields_and_field_types():
                want, got = getattr(msg, name), getattr(other, name)
                if isinstance(want, float) and _math.isnan(want):
                    assert _math.isnan(got), (msgtype, name)
                else:
                    assert got == want, (msgtype, name, got, want)
        # and bytes from rclpy decode with the typestore
        decoded = msgtypes.to_dict(msgtypes.deserialize(bytes(serialize_message(msg)), msgtype))
        key = "task_id" if "task_id" in decoded else "policy"
        assert decoded[key] == getattr(msg, key)
