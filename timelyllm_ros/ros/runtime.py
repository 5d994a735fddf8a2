"""Running a node until Ctrl-C or SIGTERM, and shutting it down without tracebacks.

Every node exits within EXIT_WITHIN_S of SIGINT or SIGTERM, even in the middle of a segment or
an engine step: the signal stops the spin loop and starts the node's cleanup, and a watchdog
ends the process (exit status 1, with a line on stderr) if the cleanup has not finished by then.
A second signal ends it at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.node import Node

EXIT_WITHIN_S = 1.8


def install_stop_handlers(stop: threading.Event, label: str,
                          exit_within_s: float = EXIT_WITHIN_S) -> None:
    """SIGINT/SIGTERM set `stop`; the process is gone `exit_within_s` later whatever happens."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_signal(signum, frame):  # noqa: ARG001
        if stop.is_set():
            os._exit(128 + signum)
        stop.set()

        def force_exit():
            print(f"{label}: cleanup did not finish within {exit_within_s:.1f} s of "
                  f"{signal.Signals(signum).name}; exiting", file=sys.stderr, flush=True)
            os._exit(1)

        timer = threading.Timer(exit_within_s, force_exit)
        timer.daemon = True
        timer.start()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


def spin_until_shutdown(node: Node, cleanup: Callable[[], None] = lambda: None,
                        until: Callable[[], bool] = lambda: False, threads: int = 1) -> None:
    """Spin `node` until SIGINT/SIGTERM (or `until()`), then clean up and destroy it.

    A process manager stops nodes with SIGTERM; treating it like Ctrl-C gives the node the same
    orderly shutdown (the recorder closes its files, the planner releases its engine).
    `threads` > 1 spins a MultiThreadedExecutor (nodes whose callbacks may wait, e.g. action
    servers answering while a lifecycle transition runs).
    """
    stop = threading.Event()
    install_stop_handlers(stop, node.get_name())
    executor = MultiThreadedExecutor(num_threads=threads) if threads > 1 else SingleThreadedExecutor()
    executor.add_node(node)
    try:
        while rclpy.ok() and not stop.is_set() and not until():
            executor.spin_once(timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        try:
            cleanup()
        finally:
            executor.shutdown(timeout_sec=0.2)
            node.destroy_node()
            rclpy.try_shutdown()


def run_node(make_node: Callable[[], Node], label: str, argv: list[str] | None,
             threads: int = 1) -> int:
    """A node's `main`: init rclpy, build the node (a ValueError is a bad parameter: printed,
    exit status 2), spin it until SIGINT/SIGTERM, then its `shutdown()`."""
    from timelyllm_ros.ros import share

    share.use_installed_config()
    rclpy.init(args=argv if argv is not None else sys.argv)
    try:
        node = make_node()
    except ValueError as err:
        print(f"{label}: {err}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    spin_until_shutdown(node, cleanup=node.shutdown, threads=threads)
    return 0
