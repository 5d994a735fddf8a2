"""The planner's `scenes` parameter: each robot's scene file, described as TypeFly describes
what the drone sees, for its tasks' prompts (ros/planner_params.py parse_scenes)."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")

from timelyllm_ros.robots.scene import load_scene  # noqa: E402
from timelyllm_ros.ros_env import REPO_ROOT  # noqa: E402

CONFIG = REPO_ROOT / "config"


def test_scenes_are_described_from_each_robots_file():
    from timelyllm_ros.ros.planner_params import parse_scenes

    scenes = parse_scenes(["drone_1:scenes/drone_room.yaml"], CONFIG,
                          {"drone_1": "drone", "drone_2": "drone"})
    expected = load_scene(CONFIG / "scenes" / "drone_room.yaml").describe()
    # The drone starts facing the chair; the bottle behind it is not in view.
    assert scenes == {"drone_1": expected}
    assert "chair_13 x:" in expected and "bottle" not in expected


@pytest.mark.parametrize("entry, robots, message", [
    ("drone_1", None, "must be 'robot_id:scene.yaml'"),
    ("drone_1:", None, "must be 'robot_id:scene.yaml'"),
    ("drone_9:scenes/drone_room.yaml", {"drone_1": "drone"}, "robot 'drone_9' is not in"),
    ("drone_1:scenes/nowhere.yaml", None, "nowhere.yaml"),
])
def test_bad_scene_entries_name_the_parameter(entry, robots, message):
    from timelyllm_ros.ros.planner_params import parse_scenes

    with pytest.raises(ValueError, match="parameter scenes") as err:
        parse_scenes([entry], CONFIG, robots)
    assert message in str(err.value)
