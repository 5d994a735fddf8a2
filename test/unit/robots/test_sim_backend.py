"""Backend `sim` (robots/sim.py) through make_backend, and robots/ staying free of ROS."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.robots.factory import make_backend
from timelyllm_ros.robots.sim import SimulatedBackend


def test_sim_backend_sleeps_for_the_scaled_model_duration():
    backend = make_backend("sim", time_scale=0.001, seed=4)
    assert isinstance(backend, SimulatedBackend)
    ok, msg = backend.execute([SkillCall("move_forward", ("50",))])
    assert ok and msg.startswith("simulated ")
    assert backend.execute([]) == (True, "simulated 0.00 s")


def test_sim_backend_stops_when_the_executor_shuts_down():
    stop = threading.Event()
    stop.set()
    backend = make_backend("sim", time_scale=1.0, stop=stop)
    ok, msg = backend.execute([SkillCall("takeoff", ())])
    assert not ok and "shutting down" in msg


def test_sim_backend_rejects_foreign_parameters():
    with pytest.raises(ValueError, match="host: not a parameter of backend 'sim'"):
        make_backend("sim", host="127.0.0.1")
    with pytest.raises(ValueError, match="time_scale"):
        make_backend("sim", time_scale=0)


def test_robots_build_every_offline_kind_without_ros():
    # A fresh interpreter: this test process may already hold rclpy from other tests.
    code = (
        "import sys\n"
        "from timelyllm_ros.robots.factory import make_backend\n"
        "make_backend('sim', time_scale=0.01)\n"
        "make_backend('arm-sim', time_scale=0.01)\n"
        "make_backend('tello', host='127.0.0.1', port=8889, state_port=0, local_port=0).close()\n"
        "loaded = [m for m in sys.modules if m == 'rclpy' or m.startswith(('rclpy.', "
        "'timelyllm_ros.ros.', 'timelyllm_ros.msg'))]\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
