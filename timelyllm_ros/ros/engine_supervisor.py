"""What the planner does when its engine fails: ErrorProcessing, then (if allowed) a restart.

ROS 2's lifecycle reaches ErrorProcessing only from a transition whose callback returns ERROR,
so a fault at run time is turned into one: the supervisor triggers `deactivate` (from active) or
`cleanup` (from inactive), the node's callback sees the pending fault and returns ERROR, and the
node's `on_error` releases what is left and returns SUCCESS, which lands it in Unconfigured
(`/planner/transition_event` shows the path). The engine thread has already failed every task
with the cause (engine_loop.py) before any of this starts.

Restarts (`restart_engine` tries, `restart_backoff_s` doubling per try): configure and activate
again, as an operator would with `ros2 lifecycle set`. A failed configure counts as a try. The
count starts again once an engine has served for RESET_AFTER_S without failing, so a planner
whose engine fails once a day keeps restarting, and one whose engine fails at once gives up
after `restart_engine` tries and stays Unconfigured with the cause in /diagnostics.

Runs on a thread of its own: a configure loads a model for tens of seconds, and the ROS
executor must keep answering (goals are refused with the reason meanwhile).
"""

from __future__ import annotations

import threading
import time

from rclpy.lifecycle import TransitionCallbackReturn

# An engine that served this long without failing has earned a fresh set of restart tries.
RESET_AFTER_S = 600.0


class EngineSupervisor:
    def __init__(self, node, tries: int, backoff_s: float):
        self._node = node
        self.tries = int(tries)
        self.backoff_s = float(backoff_s)
        self.fault: str | None = None        # the last fault, until an engine is up again
        self.pending = False                 # a fault that still has to go through ErrorProcessing
        self.restarts_used = 0
        self.restarting = False
        self._engine_up_at = time.monotonic()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    # ------------------------------------------------------------------ node hooks
    def engine_up(self) -> None:
        """A configure brought an engine up."""
        self.fault = None
        self._engine_up_at = time.monotonic()

    def on_fault(self, reason: str) -> None:
        """The engine thread failed (called on it, after every task ended with `reason`)."""
        with self._lock:
            if time.monotonic() - self._engine_up_at >= RESET_AFTER_S:
                self.restarts_used = 0
            self.fault, self.pending = reason, True
            if self._closing.is_set() or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(target=self._handle, name="engine-supervisor",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        """The node is going away: no more restarts."""
        self._closing.set()

    def describe(self) -> str:
        """The fault and what happens next, for refusals and diagnostics."""
        if self.fault is None:
            return ""
        if self.restarting or (self.restarts_used < self.tries and not self._closing.is_set()):
            return (f"{self.fault}; restarting the engine (try {self.restarts_used + 1} of "
                    f"{self.tries})" if not self.restarting else
                    f"{self.fault}; restarting the engine (try {self.restarts_used} of "
                    f"{self.tries})")
        if self.tries <= 0:
            return f"{self.fault}; restart_engine is off: configure the planner to restart it"
        return f"{self.fault}; gave up after {self.restarts_used} restart(s)"

    # ------------------------------------------------------------------ supervisor thread
    def _handle(self) -> None:
        node, log = self._node, self._node.get_logger()
        state = node.lifecycle_state()
        if state == "active":
            node.trigger_deactivate()
        elif state == "inactive":
            node.trigger_cleanup()
        self.pending = False
        log.error(f"engine fault handled (ErrorProcessing), now {node.lifecycle_state()}: "
                  f"{self.fault}")
        while (self.restarts_used < self.tries and not self._closing.is_set()
               and node.lifecycle_state() == "unconfigured"):
            self.restarts_used += 1
            self.restarting = True
            delay = self.backoff_s * 2 ** (self.restarts_used - 1)
            log.warning(f"restarting the engine in {delay:.1f} s (try {self.restarts_used} of "
                        f"{self.tries})")
            if self._closing.wait(delay):
                break
            if (node.trigger_configure() == TransitionCallbackReturn.SUCCESS
                    and node.trigger_activate() == TransitionCallbackReturn.SUCCESS):
                log.info(f"engine restarted (try {self.restarts_used} of {self.tries}); active")
                self.restarting = False
                return
            if node.lifecycle_state() == "inactive":
                node.trigger_cleanup()
        self.restarting = False
