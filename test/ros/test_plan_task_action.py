"""The PlanTask action end to end over ROS, with a real rclpy ActionClient, the planner on the
wall-clock-paced simulated engine and executor nodes serving ExecuteSegment: feedback and
results, cancel, refused goals, UpdateTask / CancelTask, and the faults (dead robot, vanished
action server, a client that disappears). The same on the real vLLM engine: test_ros_e2e.py."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("rclpy")

from action_msgs.msg import GoalStatus  # noqa: E402
from fleet_helpers import (executor_spec, fleet, idle, log_tail, planner_spec,  # noqa: E402
                           use_domain, wait_for_executors, wait_until)

from timelyllm_ros.lrtrace.traces import load_traces  # noqa: E402
from timelyllm_ros.ros_env import REPO_ROOT  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]

DOMAIN = 150
ROBOTS = {"drone_1": "drone", "arm_1": "arm", "drone_dead": "drone", "drone_gone": "drone"}
TRACES = load_traces()
DRONE_PLAN = TRACES[1].instruction   # 4+ segments
ARM_PLAN = TRACES[9].instruction     # long arm segments


@pytest.fixture(scope="module")
def sim_fleet(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    use_domain(mp, DOMAIN)
    logs = tmp_path_factory.mktemp("plan-task-logs")
    specs = [planner_spec(robots=[f"{r}:{k}" for r, k in ROBOTS.items()],
                          report_timeout_factor=1.0, report_timeout_min_s=4.0),
             executor_spec("drone_1"),
             # Arm segments take seconds (pick 4 s x 0.5): room to cancel mid-segment.
             executor_spec("arm_1", time_scale=0.5),
             executor_spec("drone_dead", never_report=True)]
    try:
        with fleet(logs, specs, robots=list(ROBOTS)) as (group, client):
            yield group, client, logs
    finally:
        mp.undo()


def _done(run, timeout_s=60):
    outcome = run.result(timeout_s)
    assert outcome is not None, "no result in time"
    return outcome


def test_goal_gets_feedback_per_segment_and_succeeds(sim_fleet):
    _, client, _ = sim_fleet
    run = client.plan("fb-1", "drone_1", DRONE_PLAN, urgency="urgent")
    status, result = _done(run)
    assert status == GoalStatus.STATUS_SUCCEEDED and result.state == "done", result
    segments = [s.text for s in client.seen.segments["fb-1"]]
    assert "".join(segments) == TRACES[1].plan and result.segments == len(segments) >= 2
    # One feedback at least per dispatched segment, carrying that segment's text.
    by_count = {f.segments_dispatched: f.last_segment_text for f in run.feedback}
    assert set(range(1, len(segments) + 1)) <= set(by_count)
    assert [by_count[i + 1] for i in range(len(segments))] == segments
    assert all(f.task_id == "fb-1" for f in run.feedback)
    assert any(f.estimated_finish.sec > 0 for f in run.feedback)
    last = client.wait_terminal(["fb-1"], 5)["fb-1"]
    assert (result.resumes, result.segments) == (last.resumes, last.segments_dispatched)
    assert math.isfinite(result.response_time_s) and result.utility == pytest.approx(2.0)


def test_cancel_mid_plan_cancels_the_robot_segment_and_frees_everything(sim_fleet):
    _, client, _ = sim_fleet
    run = client.plan("cancel-1", "arm_1", ARM_PLAN, skill_set="arm")
    assert wait_until(lambda: any(f.segments_dispatched >= 1 for f in run.feedback), 30)
    time.sleep(0.5)  # the robot is executing segment 0 now (seconds long)
    t_cancel = time.time()
    response = run.cancel()
    assert len(response.goals_canceling) == 1
    status, result = _done(run, 30)
    assert status == GoalStatus.STATUS_CANCELED and result.state == "cancelled", result
    assert result.reason == "cancelled by the client"
    # The robot's running segment was cancelled (its report says so) ...
    assert client.wait_for(lambda seen: any(r.message.startswith("cancelled")
                                            for r in seen.reports["cancel-1"]), 10)
    stopped = min(r.finished.sec + r.finished.nanosec * 1e-9 for r in client.seen.reports["cancel-1"]
                  if r.message.startswith("cancelled"))
    freed = next(s for s in client.seen.statuses["cancel-1"] if s.state == "cancelled")
    print(f"cancel latency (sim engine): robot stopped {1e3 * (stopped - t_cancel):.1f} ms, "
          f"task cancelled + KV freed {1e3 * (freed.stamp.sec + freed.stamp.nanosec * 1e-9 - t_cancel):.1f} ms")
    assert stopped - t_cancel < 2.0
    # ... and the engine request, KV blocks and queue entry are gone.
    assert client.wait_for(idle, 10), client.seen.metrics[-1:]


@pytest.mark.parametrize("task_id, goal, field", [
    ("bad-empty", dict(robot_id="drone_1", instruction="   "), "instruction"),
    ("bad-robot", dict(robot_id="rover_9", instruction="drive"), "robot_id"),
    ("bad-nan", dict(robot_id="drone_1", instruction="fly", urgency="", ert_s=math.nan, slope=1.0,
                     initial_utility=1.0), "expected_response_time_s"),
    ("bad-absurd", dict(robot_id="drone_1", instruction="fly", urgency="", ert_s=1e9, slope=2.0,
                        initial_utility=1.0), "expected_response_time_s"),
    ("bad-long", dict(robot_id="drone_1", instruction="fly over the hill " * 5000), "instruction"),
])
def test_refused_goal_says_why(sim_fleet, task_id, goal, field):
    _, client, _ = sim_fleet
    goal = dict(goal)
    run = client.plan(task_id, goal.pop("robot_id"), goal.pop("instruction"), **goal)
    status, result = _done(run, 30)
    assert status == GoalStatus.STATUS_ABORTED and result.state == "rejected"
    assert result.reason.startswith(field + ":"), result.reason


def test_duplicate_id_is_refused_and_the_original_is_untouched(sim_fleet):
    _, client, _ = sim_fleet
    original = client.plan("dup-1", "drone_1", DRONE_PLAN)
    assert wait_until(lambda: original.feedback, 10)
    duplicate = client.plan("dup-1", "drone_1", "fly somewhere else")
    status, result = _done(duplicate, 30)
    assert status == GoalStatus.STATUS_ABORTED and result.reason.startswith("task_id: duplicate")
    status, result = _done(original)
    assert status == GoalStatus.STATUS_SUCCEEDED and "".join(
        s.text for s in client.seen.segments["dup-1"]) == TRACES[1].plan


def test_cancel_of_unknown_or_finished_task_is_answered_cleanly(sim_fleet):
    _, client, _ = sim_fleet
    response = client.cancel_task("no-such-task")
    assert not response.success and response.reason == "task_id: unknown task 'no-such-task'"
    run = client.plan("fin-1", "drone_1", DRONE_PLAN)
    assert _done(run)[1].state == "done"
    response = client.cancel_task("fin-1")
    assert not response.success and "already ended (done)" in response.reason
    assert response.state == "done"
    # The action's own cancel of a finished goal: refused, nothing changes.
    assert run.cancel().goals_canceling == []


def test_update_task_refuses_a_bad_tuf_and_applies_a_good_one(sim_fleet):
    _, client, _ = sim_fleet
    run = client.plan("upd-1", "arm_1", ARM_PLAN, skill_set="arm")
    assert wait_until(lambda: run.feedback, 10)
    bad = client.update_task("upd-1", urgency="", ert_s=math.nan, slope=1.0, initial_utility=1.0)
    assert not bad.success and bad.reason.startswith("expected_response_time_s:")
    assert (bad.urgency, bad.expected_response_time_s, bad.initial_utility) == ("normal", 1.0, 1.0)
    assert not client.update_task("upd-1", urgency="whenever").success
    assert not client.update_task("nope", urgency="urgent").success
    good = client.update_task("upd-1", urgency="urgent")
    assert good.success and good.reason == "" and good.urgency == "urgent"
    assert good.expected_response_time_s == pytest.approx(0.2)
    assert client.wait_for(lambda seen: any(s.urgency == "urgent" and s.initial_utility == 2.0
                                            for s in seen.statuses["upd-1"]), 5)
    assert run.cancel().goals_canceling
    assert _done(run, 30)[1].state == "cancelled"


def test_dead_robot_fails_the_task_and_its_goals_are_cancelled(sim_fleet):
    _, client, logs = sim_fleet
    run = client.plan("dead-1", "drone_dead", DRONE_PLAN)
    status, result = _done(run, 60)
    assert status == GoalStatus.STATUS_ABORTED and result.state == "failed"
    assert "did not report segment" in result.reason
    assert wait_until(lambda: "cancel requested for dead-1#0" in log_tail(logs, "drone_dead/executor"), 10)
    assert client.wait_for(idle, 15), client.seen.metrics[-1:]


def test_robot_whose_action_server_vanishes_mid_segment_fails_the_task(sim_fleet, tmp_path):
    """Detected within about a second, long before the 4 s report deadline."""
    from timelyllm_ros.ros.launch_runner import NodeGroup

    _, client, _ = sim_fleet
    gone = NodeGroup([executor_spec("drone_gone", time_scale=2.0)], log_dir=tmp_path, echo=False).start()
    try:
        wait_for_executors(client, ["drone_gone"])
        run = client.plan("gone-1", "drone_gone", DRONE_PLAN)
        assert wait_until(lambda: "executing gone-1#0" in log_tail(tmp_path, "drone_gone/executor"), 30)
        # It goes away mid-segment without answering (a SIGKILL is noticed only when DDS's
        # lease expires, 20 s by default; the report deadline would fail the task first).
        os.killpg(gone.procs["drone_gone/executor"].pid, signal.SIGTERM)
        status, result = _done(run, 30)
    finally:
        gone.stop()
    assert status == GoalStatus.STATUS_ABORTED and result.state == "failed"
    assert "/drone_gone/execute_segment vanished mid-segment" in result.reason
    assert client.wait_for(idle, 15), client.seen.metrics[-1:]


CLIENT_THAT_VANISHES = """
import os, sys, time
from timelyllm_ros.ros.client import PlannerClient
c = PlannerClient(node_name="vanishing_client")
assert c.wait_for_action(30)
run = c.plan("orphan-1", "drone_1", sys.argv[1])
print("accepted", flush=True)
os._exit(0)   # gone without cancelling, without even shutting rclpy down
"""


def test_client_that_disconnects_without_cancel_leaves_nothing_behind(sim_fleet, tmp_path):
    _, client, _ = sim_fleet
    script = tmp_path / "vanish.py"
    script.write_text(CLIENT_THAT_VANISHES)
    out = subprocess.run([sys.executable, str(script), DRONE_PLAN], capture_output=True, text=True,
                         timeout=60, cwd=REPO_ROOT)
    assert "accepted" in out.stdout, out.stderr[-2000:]
    final = client.wait_terminal(["orphan-1"], 60)["orphan-1"]
    assert final is not None and final.state == "done", final
    assert client.wait_for(idle, 15), client.seen.metrics[-1:]


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "timelyllm_ros.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)


def test_cli_submit_cancel_update_and_top(sim_fleet):
    _, client, _ = sim_fleet
    out = _cli("submit", "--robot", "drone_1", "--urgency", "urgent", "--id", "cli-1", DRONE_PLAN)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "segment 0:" in out.stdout and "cli-1: done" in out.stdout, out.stdout
    out = _cli("cancel", "cli-1")
    assert out.returncode == 1 and "already ended (done)" in out.stderr
    out = _cli("update", "cli-1", "--urgency", "urgent")
    assert out.returncode == 1 and "already ended" in out.stderr
    out = _cli("update", "nope", "--ert", "nan", "--slope", "1", "--utility", "1")
    assert out.returncode == 1 and "expected_response_time_s" in out.stderr
    out = _cli("top", "--iterations", "2")
    assert out.returncode == 0, out.stderr
    assert "queued" in out.stdout and "cli-1" in out.stdout and "kv" in out.stdout
