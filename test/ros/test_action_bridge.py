"""The action bridge backend end to end, against a small action server written here (same
process, its own context, node and executor thread), using our ExecuteSegment action type:

    goal.sequence = n        -> result.started.sec = fib(n), result.success = True
    goal.text == "reject"    -> the goal is rejected
    goal.text == "hang"      -> runs until cancelled (records the cancel)
    goal.text == "fail"      -> ends ABORTED
"""

from __future__ import annotations

import os
import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy")
try:
    from timelyllm_ros.action import ExecuteSegment  # noqa: F401
except ImportError:  # our msgs are being rebuilt, or never were
    pytest.skip("timelyllm_ros.action is not built", allow_module_level=True)

from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.core.skills.interpreter import SkillFailure
from timelyllm_ros.robots.action_bridge import ActionBridgeBackend, build_action_bridge
from timelyllm_ros.robots.action_bridge_config import load_skill_map

TYPE = "timelyllm_ros/action/ExecuteSegment"
ACTION = f"bridge_test_{os.getpid()}/segment"


def fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


SKILL_MAP = {
    "node_name": f"bridge_{os.getpid()}",
    "defaults": {"timeout_s": 10, "server_timeout_s": 10},
    "skills": {
        "fibonacci": {"abbrev": "fb", "args": ["int"], "action": ACTION, "type": TYPE,
                      "goal": {"sequence": "$1", "text": "fib of $1"},
                      "success": {"status": "SUCCEEDED", "equals": {"success": True}},
                      "returns": "started.sec"},
        "reject": {"abbrev": "rj", "action": ACTION, "type": TYPE, "goal": {"text": "reject"}},
        "hang": {"abbrev": "hg", "action": ACTION, "type": TYPE, "goal": {"text": "hang"},
                 "timeout_s": 0.5},
        "hold": {"abbrev": "ho", "action": ACTION, "type": TYPE, "goal": {"text": "hang"},
                 "timeout_s": 30},
        "fail": {"abbrev": "fl", "action": ACTION, "type": TYPE, "goal": {"text": "fail"}},
        "log": {"topic": f"bridge_test_{os.getpid()}/log", "type": "std_msgs/msg/String",
                "goal": {"data": "$1"}},
        "robot_state": {"abbrev": "rs", "service": f"bridge_test_{os.getpid()}/get_state",
                        "type": "lifecycle_msgs/srv/GetState",
                        "returns": "current_state.label"},
        "slow_state": {"abbrev": "ss", "service": f"bridge_test_{os.getpid()}/slow_state",
                       "type": "lifecycle_msgs/srv/GetState", "timeout_s": 0.3},
    },
}


class Server:
    def __init__(self):
        from rclpy.action import ActionServer, CancelResponse, GoalResponse
        from rclpy.callback_groups import ReentrantCallbackGroup
        from rclpy.executors import MultiThreadedExecutor

        self.goals: list[str] = []
        self.cancels: list[str] = []
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node(f"bridge_server_{os.getpid()}", context=self.context)

        def on_goal(goal):
            self.goals.append(goal.text)
            return GoalResponse.REJECT if goal.text == "reject" else GoalResponse.ACCEPT

        def on_cancel(handle):
            self.cancels.append(handle.request.text)
            return CancelResponse.ACCEPT

        self.action = ActionServer(self.node, ExecuteSegment, ACTION, self._execute,
                                   goal_callback=on_goal, cancel_callback=on_cancel,
                                   callback_group=ReentrantCallbackGroup())
        from lifecycle_msgs.srv import GetState

        def get_state(_request, response):
            response.current_state.label = "active"
            return response

        def slow_state(_request, response):
            time.sleep(1.0)
            return response

        group = ReentrantCallbackGroup()
        self.services = [
            self.node.create_service(GetState, f"bridge_test_{os.getpid()}/get_state", get_state,
                                     callback_group=group),
            self.node.create_service(GetState, f"bridge_test_{os.getpid()}/slow_state",
                                     slow_state, callback_group=group)]
        self.logged: list[str] = []
        from std_msgs.msg import String

        self.node.create_subscription(String, f"bridge_test_{os.getpid()}/log",
                                      lambda m: self.logged.append(m.data), 10)
        self.executor = MultiThreadedExecutor(num_threads=4, context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _execute(self, handle):
        goal = handle.request
        result = ExecuteSegment.Result()
        if goal.text == "hang":
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not handle.is_cancel_requested:
                time.sleep(0.01)
            handle.canceled()
            result.message = "cancelled"
            return result
        if goal.text == "fail":
            handle.abort()
            result.message = "motor fault"
            return result
        result.success = True
        result.started.sec = fib(goal.sequence)
        handle.succeed()
        return result

    def close(self):
        for srv in self.services:
            self.node.destroy_service(srv)
        self.action.destroy()
        self.executor.shutdown(timeout_sec=2)
        self.thread.join(timeout=5)
        self.node.destroy_node()
        self.context.try_shutdown()


@pytest.fixture(scope="module")
def ros_env():
    old = {k: os.environ.get(k) for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE",
                                          "RMW_IMPLEMENTATION")}
    os.environ["ROS_DOMAIN_ID"] = str(100 + os.getpid() % 30)
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def server(ros_env):
    before = set(threading.enumerate())
    s = Server()
    yield s
    s.close()
    time.sleep(0.2)
    leaked = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not leaked, f"threads left running: {leaked}"


@pytest.fixture(scope="module")
def bridge(server):
    threads = set(threading.enumerate())
    stop = threading.Event()
    b = build_action_bridge(skill_map=SKILL_MAP, stop=stop, time_scale=1.0, seed=0)
    yield b
    b.close()
    time.sleep(0.1)
    leaked = [t for t in set(threading.enumerate()) - threads if t.is_alive()
              and t.name == "action-bridge"]
    assert not leaked, f"threads left running: {leaked}"


def test_success_returns_the_result_field(bridge, server):
    assert bridge.runtime.call("fibonacci", (10,)) == 55
    assert "fib of 10" in server.goals
    # The flat-call path (wire arguments are text).
    ok, msg = bridge.execute([SkillCall("fibonacci", ("6",)), SkillCall("log", ("'hi'",))])
    assert ok, msg
    assert "fibonacci(6) -> 8" in msg


def test_service_and_topic_skills(bridge, server):
    out = bridge.interpreter().run_segment("_1=rs;?_1=='active'{log,'ready'}")
    assert out.success, out.message
    assert out.values["_1"] == "active"
    deadline = time.monotonic() + 5
    while "ready" not in server.logged and time.monotonic() < deadline:
        bridge.runtime.call("log", ("ready",))      # a topic: the first may precede discovery
        time.sleep(0.1)
    assert "ready" in server.logged
    with pytest.raises(SkillFailure, match=r"slow_state: no result .* within timeout_s 0.3 s"):
        bridge.runtime.call("slow_state", ())


def test_rejected_goal(bridge):
    with pytest.raises(SkillFailure, match=r"reject: goal rejected"):
        bridge.runtime.call("reject", ())


def test_aborted_goal_is_a_failure(bridge):
    with pytest.raises(SkillFailure, match=r"fail: goal ended ABORTED, not SUCCEEDED"):
        bridge.runtime.call("fail", ())


def test_timeout_cancels_the_goal(bridge, server):
    n = len(server.cancels)
    t0 = time.monotonic()
    with pytest.raises(SkillFailure, match=r"hang: no result .* within timeout_s 0.5 s"):
        bridge.runtime.call("hang", ())
    assert time.monotonic() - t0 < 5
    deadline = time.monotonic() + 5
    while len(server.cancels) == n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.cancels[n:] == ["hang"]


def test_safe_stop_cancels_a_running_goal(bridge, server):
    n_goals, n = len(server.goals), len(server.cancels)
    errors: list[Exception] = []

    def run():
        try:
            bridge.runtime.call("hold", ())
        except SkillFailure as err:
            errors.append(err)

    caller = threading.Thread(target=run)
    caller.start()
    deadline = time.monotonic() + 10
    while len(server.goals) == n_goals and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)              # the goal is accepted and running on the server
    bridge.runtime.safe_stop()
    caller.join(timeout=10)
    assert not caller.is_alive()
    assert errors and "hold: stopped" in str(errors[0])
    assert server.cancels[n:] == ["hang"]
    # The runtime stays usable after a safe stop.
    assert bridge.runtime.call("fibonacci", (3,)) == 2


def test_stop_signal_cancels_a_running_goal(server, ros_env):
    stop = threading.Event()
    backend = build_action_bridge(skill_map={**SKILL_MAP, "node_name": "bridge_stop_test"},
                                  stop=stop)
    try:
        n = len(server.cancels)
        threading.Timer(0.5, stop.set).start()
        t0 = time.monotonic()
        ok, msg = backend.execute([SkillCall("hold")])
        assert not ok and "hold: stopped" in msg
        assert time.monotonic() - t0 < 5
        deadline = time.monotonic() + 5
        while len(server.cancels) == n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.cancels[n:] == ["hang"]
    finally:
        backend.close()


def test_minispec_loop_and_conditional_on_returned_values(bridge, server):
    interp = bridge.interpreter()
    out = interp.run_segment("_1=fb,5;?_1>3{_2=fb,7};2{fb,1};?_1<3{fb,8}")
    assert out.success, out.message
    assert out.values["_1"] == 5 and out.values["_2"] == 13
    assert [c.line() for c in out.calls_executed] == [
        "fibonacci(5) -> 5", "fibonacci(7) -> 13", "fibonacci(1) -> 1", "fibonacci(1) -> 1"]
    # A failing skill fails the segment, naming the statement.
    out = bridge.interpreter().run_segment("fb,2;rj")
    assert not out.success and "`rj`" in out.message and "rejected" in out.message


def test_unmapped_skill_fails_before_anything_runs(bridge, server):
    n = len(server.goals)
    out = bridge.interpreter().run_segment("fb,4;mf,50")
    assert not out.success and "maps no skill 'move_forward'" in out.message
    assert len(server.goals) == n


@pytest.mark.parametrize("change, message", [
    ({"type": "nosuch_pkg/action/Nope"}, r"skill 'fibonacci': type: unknown type"),
    ({"type": "std_msgs/msg/String"}, r"skill 'fibonacci': type: .* needs a pkg/action"),
    ({"goal": {"nope": "$1"}}, r"skill 'fibonacci': goal.nope: .* no field 'nope'"),
    ({"goal": {"sequence": "$x"}}, r"skill 'fibonacci': goal.sequence: bad placeholder"),
    ({"goal": {"sequence": "$2"}}, r"skill 'fibonacci': goal: placeholder \$2"),
    ({"goal": {"sequence": "n$1"}}, r"goal.sequence: .* only fits a string field"),
    ({"goal": {"sequence": -1}}, r"goal.sequence: -1 out of range for uint32"),
    ({"returns": "started.nope"}, r"skill 'fibonacci': returns: .* no field 'nope'"),
    ({"success": {"status": "GREAT"}}, r"skill 'fibonacci': success.status"),
    ({"timeout_s": 0}, r"skill 'fibonacci': timeout_s: must be"),
    ({"colour": "red"}, r"skill 'fibonacci': colour: unknown field"),
    ({"action": None}, r"skill 'fibonacci': action / service / topic"),
])
def test_bad_skill_map_names_skill_and_field(change, message):
    body = {**SKILL_MAP["skills"]["fibonacci"], **change}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        load_skill_map({"skills": {"fibonacci": body}})


def test_bad_skill_map_other_errors(ros_env):
    with pytest.raises(ValueError, match=r"skill 'fibonacci': type: missing"):
        load_skill_map({"skills": {"fibonacci": {"action": ACTION}}})
    with pytest.raises(ValueError, match=r"skill 'sweeping': .* high-level skill"):
        load_skill_map({"skills": {"sweeping": {"action": ACTION, "type": TYPE}}})
    with pytest.raises(ValueError, match=r"abbrev: 'mf' already names move_forward"):
        load_skill_map({"skills": {"go": {"abbrev": "mf", "action": ACTION, "type": TYPE}}})
    with pytest.raises(ValueError, match="skill_map: required"):
        build_action_bridge()


def test_example_skill_map_loads():
    from timelyllm_ros.ros_env import REPO_ROOT

    path = REPO_ROOT / "config" / "action_bridge" / "example.yaml"
    smap = load_skill_map(path)
    assert smap.skills["move_forward"].goal_for((50,)).text == "mf,50;"
    assert smap.specs["rs"].name == "robot_state"


def test_entry_point_registered():
    from timelyllm_ros.robots.factory import builder_for

    assert builder_for("action-bridge") is build_action_bridge


def test_backend_from_yaml_text(server):
    text = ("skills:\n  fibonacci:\n    abbrev: fb\n    args: [int]\n"
            f"    action: {ACTION}\n    type: {TYPE}\n    goal: {{sequence: \"$1\"}}\n"
            "    returns: started.sec\n")
    backend = ActionBridgeBackend(text)
    try:
        assert backend.runtime.call("fibonacci", (12,)) == 144
    finally:
        backend.close()
