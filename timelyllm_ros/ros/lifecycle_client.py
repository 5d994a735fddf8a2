"""Driving a managed (lifecycle) node through its standard services, as `ros2 lifecycle` does:
/<node>/get_state and /<node>/change_state (lifecycle_msgs)."""

from __future__ import annotations

import time

from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState

TRANSITIONS = {
    "configure": Transition.TRANSITION_CONFIGURE,
    "activate": Transition.TRANSITION_ACTIVATE,
    "deactivate": Transition.TRANSITION_DEACTIVATE,
    "cleanup": Transition.TRANSITION_CLEANUP,
    "shutdown": Transition.TRANSITION_INACTIVE_SHUTDOWN,
    "inactive_shutdown": Transition.TRANSITION_INACTIVE_SHUTDOWN,
    "active_shutdown": Transition.TRANSITION_ACTIVE_SHUTDOWN,
    "unconfigured_shutdown": Transition.TRANSITION_UNCONFIGURED_SHUTDOWN,
}


# How often an unanswered get_state is sent again (LifecycleClient.state).
STATE_RESEND_S = 2.0


class LifecycleError(RuntimeError):
    pass


class LifecycleClient:
    """For a node spun elsewhere (its executor runs in another thread): every call waits on a
    future with a deadline."""

    def __init__(self, node, target: str):
        target = "/" + target.strip("/")
        self.target = target
        self._get = node.create_client(GetState, f"{target}/get_state")
        self._change = node.create_client(ChangeState, f"{target}/change_state")

    def wait_for_services(self, timeout_s: float, alive=lambda: True) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and alive():
            if self._get.service_is_ready() and self._change.service_is_ready():
                return True
            time.sleep(0.1)
        return False

    def state(self, timeout_s: float = 30.0) -> str:
        # An answer takes milliseconds; the timeout only catches a dead node. It is generous
        # because a node whose engine thread has just started (configure) on a loaded 2-core
        # machine was seen to answer after more than 5 s.
        # The request is sent again every STATE_RESEND_S while unanswered: a node restarted
        # under the same name can look ready through its dead predecessor's endpoint before
        # DDS has matched the new one, and a request sent then is lost, not queued. Asking a
        # state twice is harmless; the first answer counts (CI saw a restarted planner's
        # get_state go unanswered for 30 s while it was publishing its heartbeat).
        deadline = time.monotonic() + timeout_s
        pending = [self._get.call_async(GetState.Request())]
        resend_at = time.monotonic() + STATE_RESEND_S
        try:
            while True:
                for future in pending:
                    if future.done():
                        return future.result().current_state.label
                now = time.monotonic()
                if now >= deadline:
                    raise LifecycleError(f"{self.target}/get_state: no answer within "
                                         f"{timeout_s:.0f} s")
                if now >= resend_at:
                    pending.append(self._get.call_async(GetState.Request()))
                    resend_at = now + STATE_RESEND_S
                time.sleep(0.02)
        finally:
            for future in pending:  # (the client keeps unanswered requests until told)
                if not future.done():
                    self._get.remove_pending_request(future)

    def change(self, transition: str, timeout_s: float = 60.0) -> bool:
        """Trigger `transition`; True if the node took it (False: its callback failed)."""
        if transition not in TRANSITIONS:
            raise LifecycleError(f"transition: {transition!r} is not one of {', '.join(TRANSITIONS)}")
        request = ChangeState.Request()
        request.transition.id = TRANSITIONS[transition]
        return bool(_wait(self._change.call_async(request), timeout_s,
                          f"{self.target}/change_state {transition}").success)

    def drive_to_active(self, timeout_s: float = 900.0, alive=lambda: True) -> None:
        """configure (engine start-up) then activate; LifecycleError says what failed."""
        deadline = time.monotonic() + timeout_s
        if not self.wait_for_services(max(1.0, deadline - time.monotonic()), alive):
            raise LifecycleError(f"{self.target}: no lifecycle services")
        state = self.state()
        if state == "unconfigured":
            if not self.change("configure", max(1.0, deadline - time.monotonic())):
                raise LifecycleError(f"{self.target}: configure failed (see its log)")
            state = self.state()
        if state == "inactive":
            if not self.change("activate", max(1.0, deadline - time.monotonic())):
                raise LifecycleError(f"{self.target}: activate failed (see its log)")
            state = self.state()
        if state != "active":
            raise LifecycleError(f"{self.target}: ended in state {state!r}, not active")


def _wait(future, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not future.done():
        if time.monotonic() >= deadline:
            raise LifecycleError(f"{what}: no answer within {timeout_s:.0f} s")
        time.sleep(0.02)
    return future.result()
