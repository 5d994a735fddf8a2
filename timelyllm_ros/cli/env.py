"""`timelyllm env`: shell exports so a user's own Python can import rclpy and our msg types."""

from __future__ import annotations

import sys

from timelyllm_ros import ros_env


def main(argv: list[str] | None = None) -> int:
    if not ros_env.interfaces_built():
        print("timelyllm env: msg types are not built yet; run scripts/bootstrap.sh", file=sys.stderr)
        return 1
    print(ros_env.shell_exports())
    return 0
