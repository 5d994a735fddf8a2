"""LRTrace on an emulated Tello: run segments on the Tello backend against the protocol emulator,
record the run to a rosbag2 file, fit the execution-time model from the bag, and get the
emulator's own timing model back (fixed cost + distance / speed, fixed cost + angle / turn rate).

Everything real but the drone: the executor node speaks the SDK over UDP on loopback, the
recorder writes MCAP, and `timelyllm lrtrace fit` reads it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("rosbags")

from timelyllm_ros.core.exec_model import ExecutionTimeModel  # noqa: E402
from timelyllm_ros.core.skills.base import SkillCall  # noqa: E402
from timelyllm_ros.ros.launch_description import NodeSpec  # noqa: E402
from timelyllm_ros.ros_env import REPO_ROOT  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(400)]

DOMAIN = "141"
SCALE = 0.2           # emulator time scale: a 100 cm move takes 0.2 * (1 + 100/50) = 0.6 s
ROBOT = "tello_1"
MOVES = [40, 80, 120, 160, 200, 260]
TURNS = [45, 90, 180, 270]

PUBLISHER = '''
import sys, time
import rclpy
from rclpy.action import ActionClient
from rclpy.node import Node
from timelyllm_ros.action import ExecuteSegment
from timelyllm_ros.msg import SkillSegment, ExecutionReport
from timelyllm_ros.ros import topics

# A stand-in planner: each segment goes to the robot as an ExecuteSegment goal and is published
# as the SkillSegment record the real planner keeps for LRTrace.
calls = [["takeoff()"]] + [[f"move_forward({d})"] for d in MOVES] + \\
        [[f"turn_cw({a})"] for a in TURNS] + [["land()"]]
rclpy.init()
node = Node("tello_bag_publisher")
reports = []
node.create_subscription(ExecutionReport, topics.robot_topic(ROBOT, topics.EXECUTION_REPORTS),
                         reports.append, topics.COMMAND_QOS)
pub = node.create_publisher(SkillSegment, topics.robot_topic(ROBOT, topics.SKILL_SEGMENTS),
                            topics.COMMAND_QOS)
action = ActionClient(node, ExecuteSegment, topics.robot_topic(ROBOT, topics.EXECUTE_SEGMENT), **topics.action_qos())
deadline = time.monotonic() + 60
while (pub.get_subscription_count() < 1 or not action.server_is_ready()) and time.monotonic() < deadline:
    rclpy.spin_once(node, timeout_sec=0.2)
for seq, c in enumerate(calls):
    last = seq == len(calls) - 1
    pub.publish(SkillSegment(task_id="fly", robot_id=ROBOT, sequence=seq, text=";".join(c),
                             calls=c, is_last=last))
    action.send_goal_async(ExecuteSegment.Goal(task_id="fly", robot_id=ROBOT, sequence=seq,
                                               text=";".join(c), calls=c, is_last=last))
deadline = time.monotonic() + 240
while len(reports) < len(calls) and time.monotonic() < deadline:
    rclpy.spin_once(node, timeout_sec=0.2)
print("reports", len(reports), "ok", sum(r.success for r in reports), flush=True)
node.destroy_node()
rclpy.shutdown()
sys.exit(0 if len(reports) == len(calls) and all(r.success for r in reports) else 1)
'''


def _emulator_class():
    spec = importlib.util.spec_from_file_location("tello_emulator_for_fit",
                                                  REPO_ROOT / "tools" / "tello_emulator.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module.TelloEmulator


def test_recorded_tello_run_fits_back_to_the_emulator_timing(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("ROS_DOMAIN_ID", DOMAIN)
    from timelyllm_ros.experiments.demo import isolate_ros_network
    from timelyllm_ros.ros.launch_runner import NodeGroup

    isolate_ros_network()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    emulator = _emulator_class()("127.0.0.1", 0, state_port=None, time_scale=SCALE).start()
    bag = tmp_path / "tello.mcap"
    recorder = subprocess.Popen(
        [sys.executable, "-m", "timelyllm_ros.cli.main", "lrtrace", "record", "-o", str(bag),
         "--robots", ROBOT], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    executor = NodeGroup([NodeSpec(
        name="executor", namespace=ROBOT, module="timelyllm_ros.ros.executor_node",
        executable="drone_executor_node",
        parameters={"robot_id": ROBOT, "backend": "tello", "tello_host": "127.0.0.1",
                    "tello_port": emulator.port, "tello_state_port": 0})],
        log_dir=tmp_path / "logs", echo=False).start()
    try:
        script = tmp_path / "publish.py"
        script.write_text(f"ROBOT = {ROBOT!r}\nMOVES = {MOVES!r}\nTURNS = {TURNS!r}\n" + PUBLISHER)
        time.sleep(2.0)  # let the recorder discover the robot's topics
        run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
    finally:
        executor.stop()
        recorder.send_signal(signal.SIGINT)
        out, _ = recorder.communicate(timeout=60)
        emulator.stop()
    assert recorder.returncode == 0, out

    model_path = tmp_path / "model.yaml"
    fit = subprocess.run(
        [sys.executable, "-m", "timelyllm_ros.cli.main", "lrtrace", "fit", str(bag), "-o",
         str(model_path), "--allow-sparse"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert fit.returncode == 0, fit.stdout + fit.stderr
    model = ExecutionTimeModel.from_yaml(model_path)

    def predicted(name: str, arg: int) -> float:
        return model.estimate_min(SkillCall(name, (str(arg),)))

    # Slopes are what the emulator's speed and turn rate set; the fixed part also absorbs the
    # UDP round trip and the executor's own overhead, so it only has a lower bound.
    move_slope = (predicted("move_forward", 260) - predicted("move_forward", 40)) / 220
    turn_slope = (predicted("turn_cw", 270) - predicted("turn_cw", 45)) / 225
    assert move_slope == pytest.approx(SCALE / 50, rel=0.25)
    assert turn_slope == pytest.approx(SCALE / 90, rel=0.25)
    assert predicted("move_forward", 100) >= SCALE * (1.0 + 100 / 50) * 0.9
