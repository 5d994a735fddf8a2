"""The planner's ROS-to-engine clock bridge keeps a segment's start before its finish even while
the offset between the two clocks drifts between readings."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("rclpy")

from timelyllm_ros.ros.conversions import ClockBridge  # noqa: E402


def test_one_offset_reading_keeps_start_before_finish():
    # The engine clock lags the ROS clock a little more at each reading (a paced simulated
    # engine): converting start and finish with two readings reversed an instant segment.
    ros = itertools.count(1000.0, 0.0)
    engine = itertools.count(0.0, -0.01)
    bridge = ClockBridge(engine_now=lambda: next(engine), ros_now=lambda: next(ros))
    started = finished = 1000.0
    start, finish = bridge.to_engine(started), bridge.to_engine(finished)
    assert finish < start  # two readings: the drift the bug came from
    offset = bridge.offset()
    assert bridge.to_engine(started, offset) == bridge.to_engine(finished, offset)
    assert bridge.to_engine(1001.0, offset) - bridge.to_engine(1000.0, offset) == pytest.approx(1.0)
