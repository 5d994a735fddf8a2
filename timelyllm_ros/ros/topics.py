"""Topic, action and service names and QoS, chosen once for every node.

Fleet-wide topics live under /timelyllm; per-robot topics live in the robot's namespace, so a
robot node started with namespace `drone_1` uses the relative names below unchanged.

QoS choices:
- goals, segments, reports: RELIABLE + VOLATILE, depth 50. Losing any of them loses a task or
  stalls a robot, so best-effort is wrong; late joiners must not replay stale plans, so no
  TRANSIENT_LOCAL. Depth 50 absorbs bursts of the paper's workloads (up to 16 tasks per event).
- task status: RELIABLE + TRANSIENT_LOCAL, depth 200. A monitor that starts late still sees the
  most recent state changes.
- planner metrics: BEST_EFFORT, depth 5. Periodic; only the newest sample matters.
- planner liveness: RELIABLE + TRANSIENT_LOCAL, depth 1, liveliness AUTOMATIC with a lease
  (planner_alive_qos). DDS itself asserts the planner's liveliness and tells robots when it
  lapses (ros/planner_liveness.py); the one message only names the planner.
"""

from __future__ import annotations

from rclpy.duration import Duration
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos import LivelinessPolicy

TASK_GOALS = "/timelyllm/task_goals"
# Actions and services (see action/ and srv/).
PLAN_TASK = "/timelyllm/plan_task"
UPDATE_TASK = "/timelyllm/update_task"
CANCEL_TASK = "/timelyllm/cancel_task"
DIAGNOSTICS = "/diagnostics"
# A finished goal's result is kept this long for a client that asks late, then dropped (a
# client that vanished must not leave results behind forever).
ACTION_RESULT_TIMEOUT_S = 60
TASK_STATUS = "/timelyllm/task_status"
PLANNER_METRICS = "/timelyllm/planner_metrics"
# The planner's sign of life for robots (ros/planner_liveness.py).
PLANNER_ALIVE = "/timelyllm/planner_alive"
# The liveliness lease the planner offers: its DDS participant asserts liveliness about every
# 2/3 of it. A robot requests its own, longer lease (its `planner_lost_after_s`); DDS refuses to
# match a reader that requests less than the writer offers.
PLANNER_LEASE_S = 0.5
# Relative to the robot's namespace.
# skill_segments and execution_reports are records of what was dispatched and executed (for
# LRTrace's rosbag2 recorder and monitors); the command path is the execute_segment action.
SKILL_SEGMENTS = "skill_segments"
EXECUTION_REPORTS = "execution_reports"
EXECUTE_SEGMENT = "execute_segment"

COMMAND_QOS = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.VOLATILE, history=HistoryPolicy.KEEP_LAST)
STATUS_QOS = QoSProfile(depth=200, reliability=ReliabilityPolicy.RELIABLE,
                        durability=DurabilityPolicy.TRANSIENT_LOCAL, history=HistoryPolicy.KEEP_LAST)
# The services behind an action (send_goal, cancel_goal, get_result): reliable and KEEP_ALL, so
# a burst of goals is never dropped before the server takes it. (KEEP_LAST 100 lost 137 of 240
# goals sent at once to a busy planner: `timelyllm faults`, deep overload; the default 10 lost
# goals of a 16-task event.) Depth is ignored under KEEP_ALL; it stays for QoS printouts.
ACTION_SERVICE_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE,
                                durability=DurabilityPolicy.VOLATILE, history=HistoryPolicy.KEEP_ALL)
METRICS_QOS = QoSProfile(depth=5, reliability=ReliabilityPolicy.BEST_EFFORT,
                         durability=DurabilityPolicy.VOLATILE, history=HistoryPolicy.KEEP_LAST)


def robot_topic(robot_id: str, name: str) -> str:
    return f"/{robot_id}/{name}"


def action_qos() -> dict:
    """Keyword arguments for rclpy's ActionServer / ActionClient (see ACTION_SERVICE_QOS)."""
    return {"goal_service_qos_profile": ACTION_SERVICE_QOS,
            "result_service_qos_profile": ACTION_SERVICE_QOS,
            "cancel_service_qos_profile": ACTION_SERVICE_QOS}


def planner_alive_qos(lease_s: float) -> QoSProfile:
    """QoS of /timelyllm/planner_alive: the planner offers PLANNER_LEASE_S, a robot requests its
    `planner_lost_after_s`. AUTOMATIC liveliness: asserted by the DDS participant's own thread,
    not by the node's executor or any Python code."""
    return QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL, history=HistoryPolicy.KEEP_LAST,
                      liveliness=LivelinessPolicy.AUTOMATIC,
                      liveliness_lease_duration=Duration(nanoseconds=int(lease_s * 1e9)))
