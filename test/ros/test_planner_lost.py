"""A robot whose planner vanishes holds position (ros/planner_liveness.py): a real planner
process (sim engine), an executor node and a fleet simulator; the planner is SIGKILLed while
segments run, and the robots must stop within `planner_lost_after_s` plus a margin, say why,
and serve the next planner normally. A live planner (even one whose Python is frozen) never
stops them.

The measured time to notice is printed (`-s` shows it): from the SIGKILL to the stopped
segment's `finished` stamp in its ExecutionReport (both on this machine's wall clock). The
robots' `planner_lost_after_s` is 1.5 s here; to measure the default:
`TIMELYLLM_TEST_PLANNER_LOST_S=4.0 pytest -s test/ros/test_planner_lost.py -k killed`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("rclpy")

from action_msgs.msg import GoalStatus  # noqa: E402
from fleet_helpers import (executor_spec, log_tail, planner_spec, use_domain,  # noqa: E402
                           wait_until)

from timelyllm_ros.ros_env import REPO_ROOT  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(120)]

DOMAIN = 203
# planner_lost_after_s of the robots here
LOST_S = float(os.environ.get("TIMELYLLM_TEST_PLANNER_LOST_S", "1.5"))
# A stop comes no later than LOST_S after the planner's last liveliness assertion, plus the
# robot reacting (event dispatch, the backend noticing its stop signal): measured 0.0-0.1 s;
# the margin allows for a loaded 2-core machine. It can come up to one assertion period (2/3
# of the planner's 0.5 s lease) sooner, as the planner died after its last assertion.
MARGIN_S = 1.0
EARLY_S = 0.5
SCALE = 2.0              # takeoff: 5 s modelled -> 10 s: a segment still running when we act
EXECUTOR = "drone_1"
FLEET = ("fleet_1", "fleet_2")
PLAN = "take off and look around"   # not a trace: the sim engine's fallback plan, tk first


@pytest.fixture(scope="module")
def robots(tmp_path_factory):
    """An executor node and a fleet simulator (two drones), both watching for the planner, and a
    test client; the planner is started by each test."""
    from timelyllm_ros.ros.client import PlannerClient
    from timelyllm_ros.ros.launch_description import NodeSpec
    from timelyllm_ros.ros.launch_runner import NodeGroup

    mp = pytest.MonkeyPatch()
    use_domain(mp, DOMAIN)
    logs = tmp_path_factory.mktemp("planner-lost-robots")
    specs = [executor_spec(EXECUTOR, time_scale=SCALE, planner_lost_after_s=LOST_S),
             NodeSpec(name="fleet_sim", module="timelyllm_ros.ros.fleet_sim_node",
                      executable="fleet_sim_node",
                      parameters={"robots": [f"{r}:drone" for r in FLEET], "time_scale": SCALE,
                                  "planner_lost_after_s": LOST_S})]
    group = NodeGroup(specs, log_dir=logs, echo=False).start()
    client = PlannerClient(robots=[EXECUTOR, *FLEET], node_name="lost_test_client")
    watch = _RobotWatch(client.node, [EXECUTOR, *FLEET])
    try:
        # Every robot topic this test reads is matched before any segment runs (a feedback or
        # report published before that would be missed).
        robot_topics = [s for s in client.node.subscriptions if s.topic_name.startswith(
            tuple(f"/{r}/" for r in (EXECUTOR, *FLEET))) and "skill_segments" not in s.topic_name]
        assert wait_until(lambda: all(s.get_publisher_count() > 0 for s in robot_topics), 60), \
            [s.topic_name for s in robot_topics if not s.get_publisher_count()]
        yield group, client, watch, logs
    finally:
        client.close()
        codes = group.stop()
        mp.undo()
    # The robots survived everything and shut down cleanly.
    assert codes == {f"{EXECUTOR}/executor": 0, "fleet_sim": 0}, codes


class _RobotWatch:
    """What the robots' action servers say: the feedback of each goal (a segment started) and
    the result of any goal, read with the action's own get_result service."""

    def __init__(self, node, robot_ids):
        from action_msgs.msg import GoalStatusArray
        from rclpy.qos import qos_profile_action_status_default

        from timelyllm_ros.action import ExecuteSegment

        self.started: dict[str, list] = {r: [] for r in robot_ids}
        self.statuses: dict[str, dict[bytes, int]] = {r: {} for r in robot_ids}
        self._results = {}
        for robot in robot_ids:
            node.create_subscription(
                GoalStatusArray, f"/{robot}/execute_segment/_action/status",
                lambda m, r=robot: self.statuses[r].update(
                    {bytes(s.goal_info.goal_id.uuid): s.status for s in m.status_list}),
                qos_profile_action_status_default)
            node.create_subscription(
                ExecuteSegment.Impl.FeedbackMessage, f"/{robot}/execute_segment/_action/feedback",
                lambda m, r=robot: self.started[r].append(m), 10)
            self._results[robot] = node.create_client(
                ExecuteSegment.Impl.GetResultService, f"/{robot}/execute_segment/_action/get_result")

    def result(self, robot: str, goal_id, timeout_s: float = 10.0):
        from timelyllm_ros.action import ExecuteSegment
        from unique_identifier_msgs.msg import UUID

        if isinstance(goal_id, bytes):
            goal_id = UUID(uuid=list(goal_id))
        client = self._results[robot]
        assert client.wait_for_service(timeout_sec=timeout_s)
        future = client.call_async(ExecuteSegment.Impl.GetResultService.Request(goal_id=goal_id))
        assert wait_until(future.done, timeout_s)
        return future.result()


def _start_planner(logs: Path, client, label: str):
    from timelyllm_ros.ros.launch_runner import NodeGroup

    # A SIGKILLed planner's services stay in the graph until its DDS participant's lease runs
    # out (about 20 s): a request sent before the new planner's servers are discovered would go
    # to the dead one only. So wait for one more get_state server than before.
    servers = client.node.count_services("/planner/get_state")
    group = NodeGroup([planner_spec(robots=[f"{r}:drone" for r in (EXECUTOR, *FLEET)])],
                      log_dir=logs / label, echo=False).start()
    try:
        assert wait_until(lambda: client.node.count_services("/planner/get_state") > servers, 60)
        client.lifecycle.drive_to_active(120, alive=lambda: "planner" not in group.exited())
        assert client.wait_for_action(30), log_tail(logs / label, "planner")
    except BaseException:
        group.stop()
        raise
    return group


def _run_segments(client, watch, tag: str, robots) -> dict:
    """A PlanTask goal per robot; returns robot -> its run once each robot executes a segment."""
    before = {r: len(watch.started[r]) for r in robots}
    runs = {r: client.plan(f"{tag}-{r}", r, PLAN) for r in robots}
    assert wait_until(lambda: all(len(watch.started[r]) > before[r] for r in robots), 30), \
        {r: len(watch.started[r]) for r in robots}
    return runs


def _reports(client, task_id: str) -> list:
    with client._lock:
        return list(client.seen.reports.get(task_id, []))


def test_live_planner_never_stops_running_segments(robots):
    """Segments run for 3 x planner_lost_after_s under a live planner: no robot stops; then a
    cancel still stops them as a cancel (not as a lost planner)."""
    group, client, watch, logs = robots
    planner = _start_planner(logs, client, "live")
    try:
        runs = _run_segments(client, watch, "live", (EXECUTOR, FLEET[0]))
        time.sleep(3 * LOST_S)
        assert not any(_reports(client, f"live-{r}") for r in runs), \
            {r: _reports(client, f"live-{r}") for r in runs}
        for robot in runs:
            assert client.cancel_task(f"live-{robot}").success
        assert wait_until(lambda: all(_reports(client, f"live-{r}") for r in runs), 10)
        for robot in runs:
            report = _reports(client, f"live-{robot}")[0]
            assert report.message.startswith("cancelled after"), report.message
    finally:
        planner.stop()
    for label in (f"{EXECUTOR}/executor", "fleet_sim"):
        assert "planner lost" not in log_tail(logs, label, 100_000), label


def test_killed_planner_stops_its_robots_within_planner_lost_after_s(robots):
    group, client, watch, logs = robots
    planner = _start_planner(logs, client, "killed")
    earlier = {r: set(watch.statuses[r]) for r in (EXECUTOR, FLEET[0])}   # other tests' goals
    try:
        runs = _run_segments(client, watch, "kill", (EXECUTOR, FLEET[0]))
        killed_at = time.time()
        os.killpg(planner.procs["planner"].pid, signal.SIGKILL)
        assert wait_until(lambda: all(_reports(client, f"kill-{r}") for r in runs),
                          LOST_S + MARGIN_S + 5), "no robot stopped"
    finally:
        planner.stop()
    stopped = {}
    for robot in runs:
        report = _reports(client, f"kill-{robot}")[0]
        noticed_s = report.finished.sec + report.finished.nanosec * 1e-9 - killed_at
        kind = "executor node" if robot == EXECUTOR else "fleet sim node"
        print(f"\n{kind} {robot}: stopped {noticed_s:.2f} s after the planner's SIGKILL "
              f"(planner_lost_after_s {LOST_S})")
        assert not report.success
        assert report.message.startswith(
            f"planner lost: /planner gave no sign of life for {LOST_S:g} s"), report.message
        assert "holding position; stopped after" in report.message
        assert LOST_S - EARLY_S <= noticed_s <= LOST_S + MARGIN_S, noticed_s
        # The goal ended ABORTED, its result saying why (the dead planner never reads it).
        goal_id = watch.started[robot][-1].goal_id
        response = watch.result(robot, goal_id)
        assert response.status == GoalStatus.STATUS_ABORTED
        assert response.result.message == report.message
        # The plan's later segments the planner had sent (it sends each as soon as it is
        # generated) were queued on the robot: dropped, ABORTED, saying why; no goal of the dead
        # planner is left open.
        assert wait_until(lambda: GoalStatus.STATUS_ACCEPTED not in watch.statuses[robot].values()
                          and GoalStatus.STATUS_EXECUTING not in watch.statuses[robot].values(), 5)
        ours = {g: st for g, st in watch.statuses[robot].items() if g not in earlier[robot]}
        aborted = [g for g, st in ours.items() if st == GoalStatus.STATUS_ABORTED]
        assert len(aborted) == len(ours), ours
        messages = [watch.result(robot, g).result.message for g in aborted]
        assert all(m.startswith("planner lost:") for m in messages), messages
        assert sum(m.endswith("(before it started)") for m in messages) == len(messages) - 1
        stopped[robot] = len(messages)
    # Logged once per loss, by the node that noticed, not per robot or per goal.
    for label, robot in ((f"{EXECUTOR}/executor", EXECUTOR), ("fleet_sim", FLEET[0])):
        log = log_tail(logs, label, 100_000)
        assert log.count("planner lost") == 1, log[-2000:]
        assert f"stopped {stopped[robot]} of its segment goal(s)" in log
    assert "failed:" not in log_tail(logs, f"{EXECUTOR}/executor", 100_000)

    # A new planner: its goals are served as usual (and its own cancel stops them).
    planner = _start_planner(logs, client, "back")
    try:
        _run_segments(client, watch, "back", (EXECUTOR, FLEET[0]))
        for robot in (EXECUTOR, FLEET[0]):
            assert client.cancel_task(f"back-{robot}").success
        assert wait_until(lambda: all(_reports(client, f"back-{r}") for r in (EXECUTOR, FLEET[0])), 10)
        for robot in (EXECUTOR, FLEET[0]):
            assert _reports(client, f"back-{robot}")[0].message.startswith("cancelled after")
    finally:
        planner.stop()


FROZEN_PLANNER = """
import ctypes, sys, time
import rclpy
from rclpy.node import Node
from timelyllm_ros.ros.planner_liveness import PlannerAnnouncer
rclpy.init()
node = Node("planner")
PlannerAnnouncer(node)
print("alive", flush=True)
sys.stdin.readline()
print("frozen", flush=True)
ctypes.PyDLL(None).sleep(int(sys.argv[1]))   # holds the GIL: no Python thread runs
print("thawed", flush=True)
sys.stdin.readline()
print(f"leaving {time.time()}", flush=True)
node.destroy_node()     # a clean exit that cancels nothing
rclpy.shutdown()
"""


def test_frozen_planner_stays_alive_and_a_clean_exit_without_cancel_stops_the_robot(robots, tmp_path):
    """A planner whose interpreter is frozen (GIL held) for 2 x planner_lost_after_s is still
    alive: its liveliness is asserted by DDS, not by Python. When it then leaves without
    cancelling, its running and queued segments end at once, ABORTED, saying why; a later
    segment of the same task ends at once too; a new task is served."""
    from timelyllm_ros.action import ExecuteSegment
    from timelyllm_ros.ros.action_client import SpinSafeActionClient

    _, client, watch, logs = robots
    script = tmp_path / "frozen_planner.py"
    script.write_text(FROZEN_PLANNER)
    fake = subprocess.Popen([sys.executable, str(script), str(int(2 * LOST_S + 0.5))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT, start_new_session=True)
    action = SpinSafeActionClient(client.node, ExecuteSegment, f"/{EXECUTOR}/execute_segment")
    try:
        assert fake.stdout.readline().strip() == "alive"
        assert wait_until(lambda: _planner_seen(client, EXECUTOR), 15), "the robot never saw it"
        assert action.wait_for_server(timeout_sec=15)

        def send(task, sequence, calls):
            goal = ExecuteSegment.Goal(task_id=task, robot_id=EXECUTOR, sequence=sequence,
                                       text=";".join(calls), calls=calls)
            future = action.send_goal_async(goal)
            assert wait_until(future.done, 10)
            handle = future.result()
            assert handle.accepted
            return handle

        running = send("frz", 0, ["takeoff()"])
        queued = send("frz", 1, ["land()"])
        assert wait_until(lambda: _is_running(watch, running), 10)
        fake.stdin.write("\n")
        fake.stdin.flush()
        assert fake.stdout.readline().strip() == "frozen"
        assert fake.stdout.readline().strip() == "thawed"
        assert _reports(client, "frz") == [], "stopped while the planner was only frozen"
        fake.stdin.write("\n")
        fake.stdin.flush()
        left_at = float(fake.stdout.readline().split()[1])
        results = {}
        for name, handle in (("running", running), ("queued", queued)):
            future = handle.get_result_async()
            assert wait_until(future.done, 5), name
            results[name] = future.result()
        assert wait_until(lambda: _reports(client, "frz"), 5)
        report = _reports(client, "frz")[0]
        noticed_s = report.finished.sec + report.finished.nanosec * 1e-9 - left_at
        print(f"\nexecutor node: stopped {noticed_s:.2f} s after the planner left cleanly")
        assert noticed_s <= MARGIN_S
        for name, response in results.items():
            assert response.status == GoalStatus.STATUS_ABORTED, name
            assert response.result.message.startswith("planner lost: /planner left"), \
                response.result.message
        assert "stopped after" in results["running"].result.message
        assert results["running"].result.message == report.message
        assert results["queued"].result.message.endswith("(before it started)")
        assert len(_reports(client, "frz")) == 1      # the queued one never ran
        # The lost task's next segment ends at once; a new task runs as usual.
        late = send("frz", 2, ["land()"]).get_result_async()
        assert wait_until(late.done, 5) and late.result().status == GoalStatus.STATUS_ABORTED
        assert late.result().result.message.startswith("planner lost:")
        fresh = send("fresh", 0, ["land()"])   # 0.5 s modelled, x2
        fresh_result = fresh.get_result_async()
        assert wait_until(fresh_result.done, 15)
        assert fresh_result.result().status == GoalStatus.STATUS_SUCCEEDED
    finally:
        action.destroy()
        if fake.poll() is None:
            os.killpg(fake.pid, signal.SIGKILL)
        fake.wait(10)
    assert log_tail(logs, f"{EXECUTOR}/executor", 100_000).count("planner lost: /planner left") == 1


def _planner_seen(client, robot: str) -> bool:
    """The executor's /diagnostics say it sees a live planner."""
    return _diag_value(client, f"timelyllm_ros: executor {robot}", "planner_alive") == "true"


def _diag_value(client, name: str, key: str) -> str | None:
    from diagnostic_msgs.msg import DiagnosticArray

    seen = getattr(client, "_lost_test_diag", None)
    if seen is None:
        seen = client._lost_test_diag = {}
        client.node.create_subscription(
            DiagnosticArray, "/diagnostics",
            lambda m: seen.update({s.name: {kv.key: kv.value for kv in s.values}
                                   for s in m.status}), 10)
    return seen.get(name, {}).get(key)


def _is_running(watch, handle) -> bool:
    return any(bytes(f.goal_id.uuid) == bytes(handle.goal_id.uuid)
               for f in watch.started[EXECUTOR])


def test_planner_lost_after_s_is_validated(monkeypatch):
    """Below twice the planner's lease (DDS refuses to match below one lease; a live planner
    was seen to lapse at one lease under load): refused at start, naming it."""
    use_domain(monkeypatch, DOMAIN + 1)
    out = subprocess.run(
        [sys.executable, "-m", "timelyllm_ros.ros.executor_node", "--ros-args", "-p",
         "robot_id:=drone_v", "-p", "planner_lost_after_s:=0.6"],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "parameter planner_lost_after_s: 0.6 s; 0 (off) or a double between 1.0" in out.stderr


def test_watch_ties_goals_to_the_planner_by_time():
    """PlannerWatch's reading of DDS liveliness events (no DDS here: the events are fed in):
    which goals each loss covers, what it says, and that a dead writer's final removal or a
    planner coming back is no loss."""
    from types import SimpleNamespace as Event

    from timelyllm_ros.ros.planner_liveness import PlannerWatch

    now, losses, lines = [100.0], [], []

    class Node:
        def create_subscription(self, *args, **kwargs):
            return "subscription"

        def destroy_subscription(self, sub):
            lines.append(("destroyed", sub))

        def get_logger(self):
            return Event(info=lambda m: lines.append(("info", m)),
                         warning=lambda m: lines.append(("warning", m)))

    watch = PlannerWatch(Node(), 4.0, lambda reason, before: losses.append((reason, before)) or 3,
                         clock=lambda: now[0])

    def event(at, alive, not_alive, d_alive, d_not_alive):
        now[0] = at
        watch._on_liveliness(Event(alive_count=alive, not_alive_count=not_alive,
                                   alive_count_change=d_alive, not_alive_count_change=d_not_alive))

    event(100, 1, 0, +1, 0)                 # a planner appears
    watch._on_announce(Event(data="/planner"))
    assert watch.values() == {"planner_alive": True, "planner": "/planner", "planner_losses": 0}
    event(110, 0, 1, -1, +1)                # its lease runs out (SIGKILL): every goal so far
    assert losses == [("planner lost: /planner gave no sign of life for 4 s "
                       "(planner_lost_after_s); holding position", 110)]
    assert lines[-1] == ("warning", losses[0][0] + ": stopped 3 of its segment goal(s)")
    event(120, 1, 1, +1, 0)                 # a new planner
    event(125, 1, 0, 0, -1)                 # the dead one leaves the graph at last: no loss
    event(130, 2, 0, +1, 0)                 # restarted before the first one's lease ran out
    event(133, 1, 1, -1, +1)                # the older one lapses: goals before 130 are its
    assert len(losses) == 2 and losses[1][1] == 130
    event(134, 1, 0, 0, -1)
    event(140, 0, 0, -1, 0)                 # the last one leaves cleanly: noticed at once
    assert losses[2] == ("planner lost: /planner left; holding position", 140)
    assert watch.values()["planner_alive"] is False and watch.values()["planner_losses"] == 3
    event(150, 1, 0, +1, 0)
    assert lines[-1] == ("info", "a planner is alive again on /timelyllm/planner_alive")
    assert len(losses) == 3
    watch.close()
    assert lines[-1] == ("destroyed", "subscription")
