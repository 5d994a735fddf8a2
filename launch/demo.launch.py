"""ROS 2 launch file for the demo node set (needs a ROS 2 install with launch_ros).

    ros2 launch timelyllm_ros demo.launch.py

The nodes, namespaces and parameters come from demo.nodes.yaml beside this file, the same
description `timelyllm launch` starts on a pip-only machine.
"""

from pathlib import Path

import yaml
from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch_ros.actions import Node


def generate_launch_description():
    share = Path(get_package_share_directory("timelyllm_ros"))
    description = yaml.safe_load((share / "launch" / "demo.nodes.yaml").read_text())
    nodes = []
    for entry in description["nodes"]:
        parameters = []
        if entry.get("parameters_file"):
            parameters.append(str(share / entry["parameters_file"]))
        if entry.get("parameters"):
            parameters.append(entry["parameters"])
        nodes.append(Node(
            package="timelyllm_ros", executable=entry["executable"], name=entry["name"],
            namespace=entry.get("namespace", ""), parameters=parameters, output="screen"))
    return LaunchDescription(nodes)
