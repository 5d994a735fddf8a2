"""The package as a ROS user builds it: `colcon build` (no symlink install) in a temporary
workspace, `source install/setup.bash`, then the planner (sim engine) and a drone executor run
from the install space (not from the repository) and complete a task over the PlanTask action.
Config, skill sets and traces resolve through share/timelyllm_ros."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("rclpy")

from fleet_helpers import use_domain, wait_for_executors  # noqa: E402

from timelyllm_ros.lrtrace.traces import load_traces  # noqa: E402
from timelyllm_ros.ros_env import REPO_ROOT  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(900)]
PACKAGE_FILES = ["package.xml", "CMakeLists.txt", "msg", "srv", "action", "scripts", "launch",
                 "config", "lrtrace", "timelyllm_ros"]
VENV = Path(sys.prefix)


@pytest.fixture(scope="module")
def install(tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    src = ws / "src" / "timelyllm_ros"
    src.mkdir(parents=True)
    for name in PACKAGE_FILES:
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(path, src / name)
    env = {"PATH": f"{VENV / 'bin'}:/usr/bin:/bin", "HOME": str(ws),
           "AMENT_PREFIX_PATH": str(VENV), "CMAKE_PREFIX_PATH": str(VENV)}
    build = subprocess.run(
        [str(VENV / "bin" / "colcon"), "build", "--event-handlers", "console_cohesion-", "summary-",
         "--cmake-args", f"-DPython3_EXECUTABLE={sys.executable}"],
        cwd=ws, env=env, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    return ws / "install"


def _installed(install: Path, command: str, cwd: Path, **kwargs) -> subprocess.Popen:
    """`command` in a shell that sourced the install space (as a user's terminal would)."""
    script = f"source {install / 'setup.bash'} && exec {command}"
    return subprocess.Popen(["bash", "-c", script], cwd=cwd, start_new_session=True, **kwargs)


def test_install_space_has_the_executables_and_data(install):
    lib = install / "timelyllm_ros" / "lib" / "timelyllm_ros"
    for exe in ("planner_node", "drone_executor_node", "executor_node", "fleet_sim_node",
                "status_recorder_node", "lrtrace_recorder_node"):
        assert (lib / exe).is_file() and (lib / exe).stat().st_mode & 0o111, exe
    share = install / "timelyllm_ros" / "share" / "timelyllm_ros"
    for path in ("config/planner.yaml", "config/skillsets/drone.yaml", "lrtrace/traces.yaml",
                 "launch/demo.launch.py", "launch/demo.nodes.yaml"):
        assert (share / path).is_file(), path
    # Every executable the launch file starts is installed.
    import yaml

    nodes = yaml.safe_load((share / "launch" / "demo.nodes.yaml").read_text())["nodes"]
    assert all((lib / n["executable"]).is_file() for n in nodes)
    assert all((share / n["parameters_file"]).is_file() for n in nodes if n.get("parameters_file"))


def test_planner_and_executor_from_the_install_space_complete_a_task(install, tmp_path, monkeypatch):
    use_domain(monkeypatch, 155)
    env = {"PATH": f"{VENV / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "ROS_DOMAIN_ID": "155",
           "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp",
           "PYTHONUNBUFFERED": "1"}
    where = subprocess.run(["bash", "-c", f"source {install / 'setup.bash'} && python -c "
                            "'import timelyllm_ros.ros.share as s; print(s.__file__); print(s.config_dir())'"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    module_file, config = where.stdout.split()
    assert module_file.startswith(str(install)) and config.startswith(str(install)), where.stdout
    lib = install / "timelyllm_ros" / "lib" / "timelyllm_ros"
    share = install / "timelyllm_ros" / "share" / "timelyllm_ros"
    logs = {n: (tmp_path / f"{n}.log").open("w") for n in ("planner", "executor")}
    procs = [
        _installed(install, f"{lib / 'planner_node'} --ros-args -r __node:=planner --params-file "
                   f"{share / 'config' / 'planner.yaml'} -p engine.kind:=sim", tmp_path, env=env,
                   stdout=logs["planner"], stderr=subprocess.STDOUT),
        _installed(install, f"{lib / 'drone_executor_node'} --ros-args -r __ns:=/drone_1 "
                   "-r __node:=executor -p robot_id:=drone_1 -p time_scale:=0.05", tmp_path, env=env,
                   stdout=logs["executor"], stderr=subprocess.STDOUT),
    ]
    from timelyllm_ros.ros.client import PlannerClient

    client = PlannerClient(robots=["drone_1"], node_name="install_client")
    try:
        client.lifecycle.drive_to_active(120, alive=lambda: all(p.poll() is None for p in procs))
        assert client.wait_for_action(30)
        wait_for_executors(client, ["drone_1"])
        trace = load_traces()[1]
        status, result = client.plan("installed-1", "drone_1", trace.instruction).result(120)
        assert result.state == "done", result
        assert "".join(s.text for s in client.seen.segments["installed-1"]) == trace.plan
    finally:
        client.close()
        for p in procs:
            p.send_signal(2)
        for p in procs:
            p.wait(timeout=10)
    assert [p.returncode for p in procs] == [0, 0], (tmp_path / "planner.log").read_text()[-3000:]
