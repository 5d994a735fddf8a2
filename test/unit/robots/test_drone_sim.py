"""Backend `drone-sim`: a drone in a scene running interpreted MiniSpec (robots/drone_sim.py,
robots/scene.py), the control-flow-aware execution estimate against its measured durations,
and `timelyllm plan run`."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from timelyllm_ros.cli.plan import main as plan_main
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.skills.minispec import MINISPEC
from timelyllm_ros.robots.drone_sim import SimDrone, SimDroneBackend
from timelyllm_ros.robots.factory import make_backend
from timelyllm_ros.robots.scene import Pose, Scene, SceneError, SceneObject, load_scene
from timelyllm_ros.ros_env import REPO_ROOT

ROOM = REPO_ROOT / "config" / "scenes" / "drone_room.yaml"
MODEL = ExecutionTimeModel.from_yaml()


def scene_with(*objects, heading=0.0):
    return Scene(pose=Pose(heading=heading), objects=tuple(objects))


def drone(*objects, heading=0.0):
    return SimDroneBackend(SimDrone(scene_with(*objects, heading=heading), MODEL))


def test_visibility_and_image_coordinates_follow_the_pose():
    sc = scene_with(SceneObject("cup", x=100, y=300, z=80, width=10, height=10))
    view = sc.view(sc.objects[0])
    assert view.visible and 0.5 < view.x < 0.75       # a little to the right
    assert math.isclose(view.y, 0.5)
    sc.pose.heading = 90                                # now it is 71 degrees to the left
    assert not sc.view(sc.objects[0]).visible
    sc.pose.heading = 180
    assert not sc.view(sc.objects[0]).visible           # behind
    assert sc.describe() == "[]"
    sc.pose.heading = 18.4
    assert sc.describe().startswith("[cup x:0.50")


def test_sweep_stops_when_the_object_comes_into_view():
    # The bottle is at 135 degrees: visible (fov 82.6) after three 45-degree turns.
    b = drone(SceneObject("bottle", x=212, y=-212, z=80))
    out = b.interpreter().run_segment("_1=s,bottle;")
    turns = [c for c in out.calls_executed if c.name == "turn_cw"]
    assert len(turns) == 3 and out.values == {"_1": True}
    assert b.runtime.scene.pose.heading == 135
    missing = drone().interpreter().run_segment("_1=s,unicorn")
    assert missing.values == {"_1": False}
    assert sum(c.name == "turn_cw" for c in missing.calls_executed) == 8


def test_orienting_centres_the_object_then_approach_moves_to_it():
    b = drone(SceneObject("chair", x=120, y=300, z=80, width=40, height=80))
    out = b.interpreter().run_segment("o,chair;_1=ox,chair;a")
    assert out.success
    assert 0.4 < out.values["_1"] < 0.6
    assert [c.name for c in out.calls_executed if c.depth == 1][:2] == ["object_x", "turn_cw"]
    pose = b.runtime.scene.pose
    assert math.hypot(pose.x, pose.y) == pytest.approx(120)


def test_query_answers_from_the_scene():
    b = drone(SceneObject("apple", x=0, y=200, z=80, tags=("edible",)),
              SceneObject("cup", x=-30, y=250, z=80, tags=("drinkable",)))
    b.runtime.scene.answers["how many people are there?"] = 2
    out = b.interpreter().run_segment(
        "_1=q,'what's the edible target?';_2=q,'anything drinkable?';"
        "_3=q,'any animal?';_4=q,'how many people are there?'")
    assert out.values == {"_1": "apple", "_2": "cup", "_3": False, "_4": 2}


def test_typefly_plan_with_early_return_ends_the_plan():
    b = SimDroneBackend(SimDrone(load_scene(ROOM), MODEL))
    interp = b.interpreter()
    out = interp.run_segment(
        "8{_1=q,'what's the edible target?';?_1!=False{o,_1;a;->True}tc,45}->False")
    assert out.ended_by_return and out.returned_value is True
    assert out.values["_1"] == "apple"
    assert interp.run_segment("mf,100").calls_executed == ()


def test_ranges_and_flight_state_fail_safely():
    b = drone()
    out = b.interpreter().run_segment("mf,50;mf,600")
    assert not out.success and "out of range 20-500 cm" in out.message
    assert out.calls_executed == ()                     # checked before the first motion
    stops = b.runtime.safe_stops
    out = b.interpreter().run_segment("ld;mf,50")
    assert not out.success and "not flying" in out.message
    assert b.runtime.safe_stops == stops + 1


def test_scene_yaml_and_errors(tmp_path):
    room = load_scene(ROOM)
    assert {o.name for o in room.objects} >= {"bottle", "apple", "chair_13"}
    assert room.find("chair").name == "chair_13"
    bad = tmp_path / "bad.yaml"
    bad.write_text("objects:\n  - {name: cup, x: 1}\n")
    with pytest.raises(SceneError, match="objects\\[0\\]: needs x and y"):
        load_scene(bad)
    bad.write_text("drone: {fov: wide}\n")
    with pytest.raises(SceneError, match="drone.fov"):
        load_scene(bad)


def test_make_backend_builds_drone_sim_with_a_scene():
    b = make_backend("drone-sim", scene=str(ROOM), max_loop_count=5)
    out = b.interpreter().run_segment("6{tc,10}")
    assert not out.success and "maximum 5" in out.message
    ok, msg = b.execute(MINISPEC.parse("tc,90;s,bottle").calls)
    assert ok, msg
    with pytest.raises(ValueError, match="colour"):
        make_backend("drone-sim", colour="red")


# ---------------------------------------------------------------------------------------------
# The segment estimate (ExecutionTimeModel + core/skills/flow.py) vs measured durations


def _estimate(segment):
    return MODEL.estimate_segment_nominal(MINISPEC.parse(segment).calls)


@pytest.mark.parametrize("segment", ["mf,100;tc,90", "4{mf,100;tc,90}", "3{2{d,500};mu,30}",
                                     "_1=iv,cup;l,_1"])
def test_estimate_equals_measured_without_branches(segment):
    measured = drone().interpreter().run_segment(segment).duration_s
    assert _estimate(segment) == pytest.approx(measured)
    # The scheduler's minimum multiplies loops too (it used to count a loop's body once).
    assert MODEL.estimate_segment_min(MINISPEC.parse(segment).calls) == pytest.approx(measured)


def test_conditional_estimate_is_the_taken_branch():
    segment = "?_1==True{mf,100;tc,90}"
    runs = []
    for seen in (True, False):
        interp = drone().interpreter()
        interp.env["_1"] = seen
        runs.append(interp.run_segment(segment).duration_s)
    assert runs[1] == 0 and runs[0] > 0
    assert _estimate(segment) == pytest.approx(runs[0])   # documented rule: counted as taken


def test_early_exit_loop_estimate_is_close_to_the_mean_over_object_positions():
    segment = "8{_1=iv,cup;?_1==True{->True}tc,45}"
    measured = []
    for k in range(8):                                  # cup found after k turns
        angle = math.radians(45 * k)
        cup = SceneObject("cup", x=300 * math.sin(angle), y=300 * math.cos(angle), z=80)
        out = drone(cup).interpreter().run_segment(segment)
        assert out.ended_by_return
        measured.append(out.duration_s)
    mean = sum(measured) / len(measured)
    # (n+1)/2 iterations of the whole body: counts the turn of the exiting iteration too.
    assert _estimate(segment) == pytest.approx(mean, rel=0.25)
    assert min(measured) < _estimate(segment) < max(measured)


# ---------------------------------------------------------------------------------------------
# timelyllm plan run


def test_plan_run_prints_calls_and_outcome(capsys):
    rc = plan_main(["run", "3{tc,30};_1=s,bottle;?_1==True{o,bottle;_2=oh,bottle;l,_2}",
                    "--scene", str(ROOM)])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert sum(line.strip() == "turn_cw(30) -> None" for line in lines) == 3
    assert "  sweeping('bottle') -> True" in lines
    assert "    is_visible('bottle') -> True" in lines
    assert any(line.startswith("  log(") for line in lines)
    assert "outcome: done" in lines


def test_plan_run_reports_returns_and_failures(capsys):
    assert plan_main(["run", "_1=iv,apple;?_1==False{->l,'No'};mf,50", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "  log('No') -> None" in out and "returned None (the plan ended early)" in out
    assert "move_forward" not in out
    assert plan_main(["run", "mf,50;zz,1", "--quiet"]) == 1
    assert "failed: segment does not parse: statement `zz,1`" in capsys.readouterr().out


def test_plan_run_arm_with_its_scene(capsys):
    scene = str(REPO_ROOT / "config" / "scenes" / "arm_table.yaml")
    assert plan_main(["run", "pick(cup)->place(cup,bin)->check(bin)", "--skill-set", "arm",
                      "--scene", scene]) == 0
    assert plan_main(["run", "pick(banana)", "--skill-set", "arm", "--scene", scene]) == 1
    assert "no object 'banana' in the arm's scene" in capsys.readouterr().out


def test_plan_command_is_registered():
    res = subprocess.run([sys.executable, "-m", "timelyllm_ros.cli.main", "plan", "run",
                          "4{mf,50;tc,90}", "--quiet"], capture_output=True, text=True,
                         timeout=120, cwd=REPO_ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("move_forward(50) -> None") == 4


def test_weighted_calls_keep_their_own_observed_minimum():
    model = ExecutionTimeModel.from_yaml()
    (looped,) = MINISPEC.parse("8{tc,45}").calls
    (once,) = MINISPEC.parse("tc,45").calls
    assert looped == once and looped.weight == 8 and once.weight == 1
    model.observe_segment([looped], 12.0)
    assert model.observed_min(once) is None               # 12 s is eight turns, not one
    assert model.estimate_segment_min([once]) == pytest.approx(1.4995)
    model.observe_segment([once], 1.2)
    assert model.estimate_segment_min([looped]) == pytest.approx(12.0)   # exact segment seen
