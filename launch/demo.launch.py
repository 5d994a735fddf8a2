"""ROS 2 launch file for the demo node set (needs a ROS 2 install with launch_ros).

    ros2 launch timelyllm_ros demo.launch.py

The nodes, namespaces and parameters come from demo.nodes.yaml in the package's share
directory, the same description `timelyllm launch` starts on a pip-only machine; every
executable and file it names is installed by `colcon build` (CMakeLists.txt). Nodes marked
`lifecycle: true` (the planner) are started as managed nodes and driven to active: configure
at start, activate once configure has succeeded (the engine is loaded and warm).
"""

from pathlib import Path

import yaml
from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import EmitEvent, RegisterEventHandler
from launch.events import matches_action
from launch_ros.actions import LifecycleNode, Node
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from lifecycle_msgs.msg import Transition


def _managed(entry, parameters):
    node = LifecycleNode(
        package="timelyllm_ros", executable=entry["executable"], name=entry["name"],
        namespace=entry.get("namespace", ""), parameters=parameters, output="screen")
    configure = EmitEvent(event=ChangeState(
        lifecycle_node_matcher=matches_action(node), transition_id=Transition.TRANSITION_CONFIGURE))
    activate = RegisterEventHandler(OnStateTransition(
        target_lifecycle_node=node, start_state="configuring", goal_state="inactive",
        entities=[EmitEvent(event=ChangeState(
            lifecycle_node_matcher=matches_action(node),
            transition_id=Transition.TRANSITION_ACTIVATE))]))
    return [node, activate, configure]


def generate_launch_description():
    share = Path(get_package_share_directory("timelyllm_ros"))
    description = yaml.safe_load((share / "launch" / "demo.nodes.yaml").read_text())
    actions = []
    for entry in description["nodes"]:
        parameters = []
        if entry.get("parameters_file"):
            parameters.append(str(share / entry["parameters_file"]))
        if entry.get("parameters"):
            parameters.append(entry["parameters"])
        if entry.get("lifecycle"):
            actions.extend(_managed(entry, parameters))
        else:
            actions.append(Node(
                package="timelyllm_ros", executable=entry["executable"], name=entry["name"],
                namespace=entry.get("namespace", ""), parameters=parameters, output="screen"))
    return LaunchDescription(actions)
