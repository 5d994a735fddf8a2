"""Test-suite wiring shared by every test.

- `test/` is on sys.path, so tests import the shared fakes with `from fakes import ...`.
- Markers follow the folder: everything under test/ros/ starts ROS 2 nodes or uses rclpy and is
  marked `ros`, so `pytest -m "not ros"` (`make test-fast`) runs the plain-Python suite only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROS_DIR = Path(__file__).resolve().parent / "ros"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if ROS_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.ros)
