"""Running a node until Ctrl-C or SIGTERM, and shutting it down without tracebacks."""

from __future__ import annotations

import signal
from typing import Callable

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node


def spin_until_shutdown(node: Node, cleanup: Callable[[], None] = lambda: None,
                        until: Callable[[], bool] = lambda: False) -> None:
    """Spin `node` until SIGINT/SIGTERM (or `until()`), then clean up and destroy it.

    A process manager stops nodes with SIGTERM; treating it like Ctrl-C gives the node the same
    orderly shutdown (the recorder closes its files, the planner releases its engine).
    """
    signal.signal(signal.SIGTERM, lambda *_: rclpy.try_shutdown())
    try:
        while rclpy.ok() and not until():
            rclpy.spin_once(node, timeout_sec=0.2)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        cleanup()
        node.destroy_node()
        rclpy.try_shutdown()
