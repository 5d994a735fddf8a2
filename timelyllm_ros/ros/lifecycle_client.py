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
        return _wait(self._get, GetState.Request, timeout_s, f"{self.target}/get_state",
                     resend_s=STATE_RESEND_S).current_state.label

    def change(self, transition: str, timeout_s: float = 60.0) -> bool:
        """Trigger `transition`; True if the node took it (False: its callback failed)."""
        if transition not in TRANSITIONS:
            raise LifecycleError(f"transition: {transition!r} is not one of {', '.join(TRANSITIONS)}")
        request = ChangeState.Request()
        request.transition.id = TRANSITIONS[transition]
        return bool(_wait(self._change, lambda: request, timeout_s,
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


def _wait(client, make_request, timeout_s: float, what: str, resend_s: float | None = None):
    """Send `make_request()` on `client` and wait for the first answer; with `resend_s`, send
    it again every `resend_s` while unanswered. Requests left unanswered are dropped from the
    client (it keeps them until told)."""
    now = time.monotonic()
    deadline = now + timeout_s
    resend_at = now + resend_s if resend_s is not None else float("inf")
    pending = [client.call_async(make_request())]
    try:
        while True:
            for future in pending:
                if future.done():
                    return future.result()
            now = time.monotonic()
            if now >= deadline:
                raise LifecycleError(f"{what}: no answer within {timeout_s:.0f} s")
            if now >= resend_at:
                pending.append(client.call_async(make_request()))
                resend_at = now + resend_s
            time.sleep(0.02)
    finally:
        for future in pending:
            if not future.done():
                client.remove_pending_request(future)
