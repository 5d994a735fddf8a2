"""End to end over real ROS 2 topics with the real vLLM engine (CPU) and the bundled model.

One planner and three simulated drones start once for the module (engine start-up dominates);
drone_dead accepts segments but never reports, to exercise the planner's dead-robot handling.
"""

from __future__ import annotations

import math
import os

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("vllm")

from timelyllm_ros.experiments.demo import isolate_ros_network  # noqa: E402
from timelyllm_ros.ros.launch_description import NodeSpec  # noqa: E402
from timelyllm_ros.core.engine.model_prep import DEFAULT_MODEL_DIR  # noqa: E402
from timelyllm_ros.ros_env import REPO_ROOT  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.vllm, pytest.mark.timeout(900)]

ROBOTS = ["drone_1", "drone_2", "drone_dead"]
REPORT_TIMEOUT_MIN_S = 3.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip("bundled model not prepared (run scripts/bootstrap.sh)")
    isolate_ros_network()
    from timelyllm_ros.ros.client import PlannerClient
    from timelyllm_ros.ros.launch_runner import NodeGroup

    logs = tmp_path_factory.mktemp("fleet-logs")
    specs = [NodeSpec(
        name="planner", module="timelyllm_ros.ros.planner_node", executable="planner_node",
        parameters_file=REPO_ROOT / "config" / "planner.yaml", lifecycle=True,
        # timelyllm: suspends at every segment boundary, so resumes (and their prefix-cache
        # hits) happen even on an idle engine (the work-conserving default would not suspend).
        parameters={"policy": "timelyllm",
                    "robots": [f"{r}:drone" for r in ROBOTS], "report_timeout_factor": 1.0,
                    "report_timeout_min_s": REPORT_TIMEOUT_MIN_S})]
    for i, robot in enumerate(ROBOTS):
        specs.append(NodeSpec(
            name="executor", namespace=robot, module="timelyllm_ros.ros.executor_node",
            executable="drone_executor_node",
            parameters={"robot_id": robot, "time_scale": 0.05, "seed": i,
                        "never_report": robot == "drone_dead"}))
    group = NodeGroup(specs, log_dir=logs, echo=False).start()
    client = PlannerClient(robots=ROBOTS, node_name="e2e_client")
    try:
        client.lifecycle.drive_to_active(420, alive=lambda: "planner" not in group.exited())
        if not client.wait_for_planner(60, alive=lambda: "planner" not in group.exited()):
            log = (logs / "planner.log").read_text()[-3000:]
            pytest.fail(f"planner did not come up; exited={group.exited()}\n{log}")
        yield client, group
    finally:
        client.close()
        codes = group.stop()
        assert codes.get("planner") == 0, f"planner did not shut down cleanly: {codes}"


def _reason(client, task_id):
    status = client.wait_terminal([task_id], 60)[task_id]
    assert status is not None, f"no status for {task_id}"
    return status


def test_task_is_generated_in_segments_executed_and_done(fleet):
    client, _ = fleet
    client.submit("seg-1", "drone_1", "take off, fly forward one meter, turn right and land")
    status = client.wait_terminal(["seg-1"], 300)["seg-1"]
    assert status is not None and status.state == "done", status
    segments = client.seen.segments["seg-1"]
    assert len(segments) >= 2
    assert [s.sequence for s in segments] == list(range(len(segments)))
    assert segments[-1].is_last and not any(s.is_last for s in segments[:-1])
    assert all(s.calls for s in segments[:-1]), "every non-closing segment carries skill calls"
    assert client.wait_for(lambda seen: len(seen.reports["seg-1"]) == len(segments), 10)
    reports = sorted(client.seen.reports["seg-1"], key=lambda r: r.sequence)
    assert all(r.success for r in reports)
    assert status.segments_completed == len(segments)
    assert status.resumes >= 1 and status.cached_tokens_total > 0
    assert math.isfinite(status.response_time_s) and status.response_time_s > 0
    assert math.isfinite(status.waiting_time_s)


@pytest.mark.parametrize("task_id, goal, field", [
    ("bad-empty", dict(robot_id="drone_1", instruction="   "), "instruction"),
    ("bad-kind", dict(robot_id="drone_1", skill_set="submarine", instruction="dive"), "skill_set"),
    ("bad-robot", dict(robot_id="rover_9", instruction="drive"), "robot_id"),
    ("bad-nan", dict(robot_id="drone_1", instruction="fly", urgency="", ert_s=math.nan, slope=1.0,
                     initial_utility=1.0), "expected_response_time_s"),
    ("bad-neg", dict(robot_id="drone_1", instruction="fly", urgency="", ert_s=1.0, slope=-2.0,
                     initial_utility=1.0), "decline_slope_per_s"),
    ("bad-absurd", dict(robot_id="drone_1", instruction="fly", urgency="", ert_s=1e9, slope=2.0,
                        initial_utility=1.0), "expected_response_time_s"),
    ("bad-level", dict(robot_id="drone_1", instruction="fly", urgency="whenever"), "urgency"),
    ("bad-long", dict(robot_id="drone_1", instruction="fly over the hill " * 800), "instruction"),
])
def test_bad_goal_is_rejected_naming_the_field(fleet, task_id, goal, field):
    client, _ = fleet
    goal = dict(goal)
    client.submit(task_id, goal.pop("robot_id"), goal.pop("instruction"), **goal)
    status = _reason(client, task_id)
    assert status.state == "rejected"
    assert status.reason.startswith(field + ":"), status.reason


def test_duplicate_task_id_is_rejected_and_the_original_still_finishes(fleet):
    client, _ = fleet
    client.submit("dup-1", "drone_2", "take off and land")
    assert client.wait_for(lambda seen: seen.last("dup-1") is not None, 30)
    client.submit("dup-1", "drone_2", "fly somewhere else")
    assert client.wait_for(
        lambda seen: any(s.state == "rejected" and s.reason.startswith("task_id:")
                         for s in seen.statuses["dup-1"]), 30)
    # The rejection is published under the same task id; the original must still reach done.
    assert client.wait_for(lambda seen: any(s.state == "done" for s in seen.statuses["dup-1"]), 300)


def test_dead_robot_fails_the_task_and_frees_everything(fleet):
    client, _ = fleet
    client.submit("dead-1", "drone_dead", "take off, fly forward and land")
    status = client.wait_terminal(["dead-1"], 300)["dead-1"]
    assert status is not None and status.state == "failed", status
    assert "did not report segment" in status.reason
    # Other tests' tasks may still be running; once the fleet is idle nothing may be held.
    client.wait_terminal([t for t in list(client.seen.statuses)], 300)

    def idle(seen):
        m = seen.metrics[-1] if seen.metrics else None
        return m is not None and m.active_tasks == 0 and m.queued == 0 and m.running == 0 \
            and m.kv_free_blocks >= m.kv_total_blocks - 1
    assert client.wait_for(idle, 30), client.seen.metrics[-1:]


def test_planner_serves_tasks_after_bad_input(fleet):
    client, _ = fleet
    client.submit("after-bad", "drone_2", "take off and take a picture", urgency="urgent")
    status = client.wait_terminal(["after-bad"], 300)["after-bad"]
    assert status.state == "done" and status.segments_dispatched >= 1
    assert os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST"


def test_plan_task_action_on_vllm_feedback_result_and_cancel(fleet):
    """The PlanTask action on the real engine: feedback per segment and SUCCEEDED; then a goal
    cancelled mid-plan ends CANCELED with its engine request and KV released."""
    from action_msgs.msg import GoalStatus

    client, _ = fleet
    assert client.wait_for_action(30)
    run = client.plan("act-1", "drone_1", "take off, fly forward one meter, turn right and land")
    status, result = run.result(300)
    assert status == GoalStatus.STATUS_SUCCEEDED and result.state == "done", result
    texts = [s.text for s in client.seen.segments["act-1"]]
    by_count = {f.segments_dispatched: f.last_segment_text for f in run.feedback}
    assert result.segments == len(texts) >= 2
    assert [by_count.get(i + 1) for i in range(len(texts))] == texts

    run = client.plan("act-2", "drone_2", "fly a square, look for the red box, take a picture of it")
    assert client.wait_for(lambda seen: bool(run.feedback), 120)
    assert run.cancel().goals_canceling
    status, result = run.result(60)
    assert status == GoalStatus.STATUS_CANCELED and result.state == "cancelled", result
    client.wait_terminal([t for t in list(client.seen.statuses)], 300)

    def idle(seen):
        m = seen.metrics[-1] if seen.metrics else None
        return m is not None and m.active_tasks == 0 and m.queued == 0 and m.running == 0 \
            and m.kv_free_blocks >= m.kv_total_blocks - 1
    assert client.wait_for(idle, 30), client.seen.metrics[-1:]
