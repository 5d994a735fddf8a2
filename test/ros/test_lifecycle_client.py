"""The lifecycle client's get_state is sent again while unanswered (ros/lifecycle_client.py): a
node restarted under the same name can look ready through its dead predecessor's endpoint, and
a request sent before DDS matches the new one is lost."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")

from rclpy.task import Future  # noqa: E402

from timelyllm_ros.ros import lifecycle_client  # noqa: E402
from timelyllm_ros.ros.lifecycle_client import LifecycleClient, LifecycleError  # noqa: E402


class _Answer:
    def __init__(self, label):
        self.current_state = type("State", (), {"label": label})()


class _Service:
    """A service client whose first `lost` requests are never answered."""

    def __init__(self, lost, label="active"):
        self.lost, self.label = lost, label
        self.sent, self.removed = [], []

    def call_async(self, request):
        future = Future()
        self.sent.append(future)
        if len(self.sent) > self.lost:
            future.set_result(_Answer(self.label))
        return future

    def remove_pending_request(self, future):
        self.removed.append(future)


def _client(service):
    node = type("Node", (), {"create_client": lambda self, kind, name: service})()
    return LifecycleClient(node, "planner")


def test_an_unanswered_get_state_is_sent_again_and_the_lost_one_dropped(monkeypatch):
    monkeypatch.setattr(lifecycle_client, "STATE_RESEND_S", 0.05)
    service = _Service(lost=2)
    assert _client(service).state(timeout_s=5.0) == "active"
    assert len(service.sent) == 3  # two lost, the third answered
    assert service.removed == service.sent[:2]  # the client forgets what will never come


def test_a_node_that_never_answers_is_still_an_error(monkeypatch):
    monkeypatch.setattr(lifecycle_client, "STATE_RESEND_S", 0.05)
    service = _Service(lost=10**6)
    with pytest.raises(LifecycleError, match="/planner/get_state: no answer within 0 s"):
        _client(service).state(timeout_s=0.3)
    assert len(service.sent) >= 3 and service.removed == service.sent
