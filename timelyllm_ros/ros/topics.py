"""Topic names and QoS, chosen once for every node.

Fleet-wide topics live under /timelyllm; per-robot topics live in the robot's namespace, so a
robot node started with namespace `drone_1` uses the relative names below unchanged.

QoS choices:
- goals, segments, reports: RELIABLE + VOLATILE, depth 50. Losing any of them loses a task or
  stalls a robot, so best-effort is wrong; late joiners must not replay stale plans, so no
  TRANSIENT_LOCAL. Depth 50 absorbs bursts of the paper's workloads (up to 16 tasks per event).
- task status: RELIABLE + TRANSIENT_LOCAL, depth 200. A monitor that starts late still sees the
  most recent state changes.
- planner metrics: BEST_EFFORT, depth 5. Periodic; only the newest sample matters.
"""

from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

TASK_GOALS = "/timelyllm/task_goals"
TASK_STATUS = "/timelyllm/task_status"
PLANNER_METRICS = "/timelyllm/planner_metrics"
# Relative to the robot's namespace.
SKILL_SEGMENTS = "skill_segments"
EXECUTION_REPORTS = "execution_reports"

COMMAND_QOS = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.VOLATILE, history=HistoryPolicy.KEEP_LAST)
STATUS_QOS = QoSProfile(depth=200, reliability=ReliabilityPolicy.RELIABLE,
                        durability=DurabilityPolicy.TRANSIENT_LOCAL, history=HistoryPolicy.KEEP_LAST)
METRICS_QOS = QoSProfile(depth=5, reliability=ReliabilityPolicy.BEST_EFFORT,
                         durability=DurabilityPolicy.VOLATILE, history=HistoryPolicy.KEEP_LAST)


def robot_topic(robot_id: str, name: str) -> str:
    return f"/{robot_id}/{name}"
