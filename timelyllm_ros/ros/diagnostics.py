"""`diagnostic_msgs/DiagnosticArray` on /diagnostics, once a second, from any node.

A node hands a function returning (level, message, values); this publishes it as one
`DiagnosticStatus` named `timelyllm_ros: <what>`, the convention diagnostic aggregators group by.
"""

from __future__ import annotations

from typing import Any, Callable

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from timelyllm_ros.ros import topics

OK = DiagnosticStatus.OK
WARN = DiagnosticStatus.WARN
ERROR = DiagnosticStatus.ERROR
PERIOD_S = 1.0


def status(name: str, hardware_id: str, level: bytes, message: str,
           values: dict[str, Any]) -> DiagnosticStatus:
    return DiagnosticStatus(
        level=level, name=f"timelyllm_ros: {name}", message=message, hardware_id=hardware_id,
        values=[KeyValue(key=str(k), value=_text(v)) for k, v in values.items()])


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


class Publisher:
    """Publishes `probe()` (level, message, values) every PERIOD_S on the node's clock."""

    def __init__(self, node, name: str, hardware_id: str,
                 probe: Callable[[], tuple[bytes, str, dict[str, Any]]], callback_group=None):
        self._node = node
        self._name = name
        self._hardware_id = hardware_id
        self._probe = probe
        self._pub = node.create_publisher(DiagnosticArray, topics.DIAGNOSTICS, 10)
        self._timer = node.create_timer(PERIOD_S, self.publish, callback_group=callback_group)

    def publish(self) -> None:
        try:
            level, message, values = self._probe()
        except Exception as err:  # noqa: BLE001 - a diagnostic must never take the node down
            level, message, values = ERROR, f"diagnostics failed: {err}", {}
        self._pub.publish(DiagnosticArray(
            header=_header(self._node), status=[status(self._name, self._hardware_id, level,
                                                       message, values)]))


def _header(node):
    from std_msgs.msg import Header

    return Header(stamp=node.get_clock().now().to_msg())
