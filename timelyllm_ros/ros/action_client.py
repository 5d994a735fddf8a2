"""An rclpy ActionClient that may be created while its node is spinning on other threads.

rclpy (Kilted) registers a new ActionClient with its node before it creates the client's
`_lock`; an executor thread that builds its wait set in that window calls `get_num_entities`
and dies with "'ActionClient' object has no attribute '_lock'" (seen in the planner when 200
robots' clients were created lazily on their first segments). Creating the lock first closes
the window; rclpy then replaces it with its own, and both only guard reads of the handle.
"""

from __future__ import annotations

import threading

from rclpy.action import ActionClient


class SpinSafeActionClient(ActionClient):
    def __init__(self, *args, **kwargs):
        self._lock = threading.Lock()
        super().__init__(*args, **kwargs)
