"""`eval "$(timelyllm env)"` lets a user's own Python script use rclpy and our msg types."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from timelyllm_ros import ros_env

pytestmark = pytest.mark.ros

USER_SCRIPT = textwrap.dedent('''
    import sys, time
    import rclpy
    from rclpy.node import Node
    from timelyllm_ros.msg import TaskGoal

    rclpy.init()
    node = Node("user_script")
    got = []
    node.create_subscription(TaskGoal, "/user_check", got.append, 10)
    pub = node.create_publisher(TaskGoal, "/user_check", 10)
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        pub.publish(TaskGoal(task_id="from-user-script", instruction="hello"))
        rclpy.spin_once(node, timeout_sec=0.2)
    print("received", got[0].task_id if got else None)
    node.destroy_node()
    rclpy.shutdown()
    sys.exit(0 if got else 1)
''')


def test_user_script_imports_rclpy_and_msgs_after_eval(tmp_path: Path):
    if not ros_env.interfaces_built():
        pytest.skip("msg types not built (run scripts/bootstrap.sh)")
    script = tmp_path / "user_script.py"
    script.write_text(USER_SCRIPT)
    timelyllm = Path(sys.prefix) / "bin" / "timelyllm"
    # A clean environment and a directory outside the repository: only the exports may help.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ROS_DOMAIN_ID": "7",
           "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}
    result = subprocess.run(
        ["bash", "-c", f'eval "$({timelyllm} env)" && python {script}'],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "received from-user-script" in result.stdout


def test_env_prints_exports_for_the_install_tree():
    exports = ros_env.shell_exports()
    assert f"{ros_env.PY_SITE}" in exports and "LD_LIBRARY_PATH" in exports
    assert all(line.startswith("export ") for line in exports.splitlines())
