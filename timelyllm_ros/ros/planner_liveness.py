"""A robot whose planner vanishes holds position: the planner's sign of life, and the robot
side that watches it.

A planner killed with SIGKILL (or one that shut down cleanly while its cancels were lost)
cancels nothing, and its robots would go on executing segments nobody waits for. The planner
therefore holds a publisher on /timelyllm/planner_alive with DDS liveliness AUTOMATIC and a
lease of topics.PLANNER_LEASE_S (`PlannerAnnouncer`); every robot process subscribes with its
own requested lease, `planner_lost_after_s` (`PlannerWatch`). DDS tracks the lease on the robot
side and raises a liveliness-changed event when no assertion came for that long (a killed
planner) or at once when the writer is removed (a planner node that was destroyed). The robot
then stops the segments that planner gave it (robot_server.RobotServer.planner_lost).

Why DDS liveliness and not a heartbeat message (Nav2's bond): with AUTOMATIC liveliness the
planner's DDS participant asserts liveliness from its own C++ thread, so nothing depends on
the planner's executor threads (a 200-robot fleet keeps them busy) or on its Python interpreter
(measured: a planner holding the GIL for 6 s stayed alive; a heartbeat published by a Python
thread or a ROS timer would have missed a 4 s lease). The robot's side needs no timer either:
DDS detects the lease expiry and only the reaction runs on the robot's executor, so a busy
executor delays a stop and cannot cause one. What can cause one is a lease shorter than the
worst gap in delivered assertions: at 0.5 s a 200-robot soak on 2 cores saw a live planner
lapse once in 90 s, hence the floor of 1 s and the default of 4 s (Nav2's bond timeout). The
price of AUTOMATIC: a planner process that is alive but hung still counts as alive (its
segments end by themselves; the planner's own timeouts are its business).

One planner per ROS domain is the system's contract (/timelyllm/plan_task is one name). A goal
cannot say which client sent it, so a robot ties its goals to a planner by time: when the last
live planner goes, every goal accepted before that moment is the lost planner's. When a planner
goes while another is alive (a restarted planner that came up before the old one's lease ran
out), the goals accepted before the live one appeared are the lost planner's. Nothing is
stopped unless a planner that was alive goes: goals sent while no planner ever existed (a test
client, `ros2 action send_goal`) run as before.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.event_handler import QoSLivelinessChangedInfo, SubscriptionEventCallbacks
from rclpy.node import Node
from std_msgs.msg import String

from timelyllm_ros.ros import topics

PARAMETER = "planner_lost_after_s"
DEFAULT_LOST_AFTER_S = 4.0
# DDS cannot match a request below the planner's lease; and at the lease itself (0.5 s) a live
# planner was seen to lapse for about 0.5 s under a 200-robot soak on 2 cores (one segment
# stopped in 90 s), while 1.0 s and 1.5 s saw no lapse. So at least two leases.
MIN_LOST_AFTER_S = 2 * topics.PLANNER_LEASE_S
MAX_LOST_AFTER_S = 3600.0

# on_lost(reason, accepted_before): stop the goals accepted before `accepted_before`
# (time.monotonic()); returns how many goals it stopped or dropped.
OnLost = Callable[[str, float], int]


class PlannerAnnouncer:
    """The planner's side: a publisher whose DDS liveliness robots watch, and one (latched)
    message naming the planner. Nothing periodic runs in Python."""

    def __init__(self, node: Node):
        self._pub = node.create_publisher(String, topics.PLANNER_ALIVE,
                                          topics.planner_alive_qos(topics.PLANNER_LEASE_S))
        self._pub.publish(String(data=node.get_fully_qualified_name()))


def declare_lost_after(node: Node) -> float:
    """Declare `planner_lost_after_s` on a robot node (executor, fleet simulator) and return
    it; ValueError (naming the parameter) for a value DDS could not honour."""
    from rcl_interfaces.msg import FloatingPointRange, ParameterDescriptor, ParameterType
    from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException

    descriptor = ParameterDescriptor(
        name=PARAMETER, type=ParameterType.PARAMETER_DOUBLE, read_only=True,
        description=(
            "Seconds without a sign of life from the planner (DDS liveliness on "
            f"{topics.PLANNER_ALIVE}) after which a robot stops the planner's segments "
            "(running: stopped as a cancel stops it, the robot holds position; queued: dropped) "
            "and ends their goals ABORTED, 'planner lost: ...'. A planner that leaves cleanly "
            f"is noticed at once. 0 turns the watch off; otherwise at least {MIN_LOST_AFTER_S} "
            "(twice the lease the planner offers)."),
        floating_point_range=[FloatingPointRange(from_value=0.0, to_value=MAX_LOST_AFTER_S)])
    allowed = (f"0 (off) or a double between {MIN_LOST_AFTER_S} (twice the planner's liveliness "
               f"lease) and {MAX_LOST_AFTER_S:.0f}")
    try:
        value = float(node.declare_parameter(PARAMETER, DEFAULT_LOST_AFTER_S, descriptor).value)
    except (InvalidParameterTypeException, InvalidParameterValueException) as err:
        # (rclpy's exceptions are not ValueErrors: a node's main reports those as bad input.)
        raise ValueError(f"parameter {PARAMETER}: {err}; {allowed}") from None
    if value != 0.0 and not MIN_LOST_AFTER_S <= value <= MAX_LOST_AFTER_S:
        raise ValueError(f"parameter {PARAMETER}: {value} s; {allowed}")
    return value


class PlannerWatch:
    """The robot's side, one per robot process: `on_lost` when the planner is gone.

    Event callbacks run on the node's executor in a group of their own (one at a time); the
    reason is logged once per loss, here, not per robot."""

    def __init__(self, node: Node, lost_after_s: float, on_lost: OnLost,
                 clock: Callable[[], float] = time.monotonic):
        self._node = node
        self._lost_after_s = lost_after_s
        self._on_lost = on_lost
        self._clock = clock
        self._lock = threading.Lock()   # the fields below, read by diagnostics
        self.alive = 0                  # live planners (writers whose lease holds)
        self.planner = ""               # the name the planner announced
        self.losses = 0
        self._joined_at = 0.0           # when the latest planner became alive
        self._sub = node.create_subscription(
            String, topics.PLANNER_ALIVE, self._on_announce,
            topics.planner_alive_qos(lost_after_s),
            callback_group=MutuallyExclusiveCallbackGroup(),
            event_callbacks=SubscriptionEventCallbacks(liveliness=self._on_liveliness))

    def _on_announce(self, msg: String) -> None:
        with self._lock:
            self.planner = msg.data

    def _on_liveliness(self, info: QoSLivelinessChangedInfo) -> None:
        now = self._clock()
        # A writer that stops being alive: (alive -1, not_alive +1) when its lease ran out,
        # (alive -1, not_alive 0) when it was removed while alive. (0, not_alive -1) is a
        # dead writer finally removed; (+1, ...) a planner that appeared or came back.
        lapsed = info.not_alive_count_change > 0
        lost = lapsed or info.alive_count_change < 0
        with self._lock:
            was_alive = self.alive
            self.alive = info.alive_count
            if info.alive_count_change > 0:
                self._joined_at = now
            if not lost:
                if info.alive_count > 0 and not was_alive and self.losses:
                    self._node.get_logger().info(f"a planner is alive again on {topics.PLANNER_ALIVE}")
                return
            self.losses += 1
            accepted_before = now if info.alive_count == 0 else self._joined_at
            planner = self.planner or "the planner"
        how = (f"gave no sign of life for {self._lost_after_s:g} s ({PARAMETER})" if lapsed
               else "left")
        stopped = self._on_lost(f"planner lost: {planner} {how}; holding position",
                                accepted_before)
        log = self._node.get_logger()
        if stopped:
            log.warning(f"planner lost: {planner} {how}; holding position: stopped {stopped} "
                        "of its segment goal(s)")
        else:
            log.info(f"{planner} {how}; it had no segment running or queued here")

    def values(self) -> dict:
        """For diagnostics."""
        with self._lock:
            return {"planner_alive": self.alive > 0, "planner": self.planner or "none",
                    "planner_losses": self.losses}

    def close(self) -> None:
        self._node.destroy_subscription(self._sub)
