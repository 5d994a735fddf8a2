"""`timelyllm lrtrace record`: run the recorder node until Ctrl-C / SIGTERM / --duration, close
the bag properly, then write the per-skill timing table beside it.

Signals: rclpy's own handlers are disabled (SignalHandlerOptions.NO) and SIGINT/SIGTERM only set
a stop flag, so the loop always reaches the clean shutdown: drain the messages that have already
arrived, close the bag (MCAP summary + metadata.yaml), write skill_timings.csv.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

# After a stop request, keep taking callbacks for this long: messages that already arrived at
# the DDS reader are recorded too.
DRAIN_S = 0.3


def _install_stop_handlers(stop: threading.Event) -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def on_signal(signum, frame):  # noqa: ARG001
        stop.set()

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        old[sig] = signal.signal(sig, on_signal)
    return old


def _restore(old: dict) -> None:
    for sig, handler in old.items():
        signal.signal(sig, handler)


def run_node(argv: Sequence[str] | None = None, *, parameter_overrides=None,
             stop: threading.Event | None = None, log: Callable[[str], None] | None = None) -> int:
    """Start rclpy, run an LrtraceRecorderNode until stopped, close the bag, write the table.

    `argv` may carry `--ros-args` (parameters of the node); `parameter_overrides` are rclpy
    Parameters given in code (what the CLI uses)."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    from timelyllm_ros.lrtrace.bag import BagError
    from timelyllm_ros.ros.lrtrace_recorder_node import LrtraceRecorderNode

    log = log or (lambda line: print(line, flush=True))
    stop = stop or threading.Event()
    old = _install_stop_handlers(stop)
    context = rclpy.Context()
    rclpy.init(args=list(argv) if argv is not None else [], context=context,
               signal_handler_options=SignalHandlerOptions.NO)
    node = None
    try:
        try:
            node = LrtraceRecorderNode(log=log, context=context,
                                       parameter_overrides=list(parameter_overrides or []))
        except (BagError, ValueError) as err:
            print(f"lrtrace record: error: {err}", file=sys.stderr, flush=True)
            return 1
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        deadline = time.monotonic() + node.duration_s if node.duration_s > 0 else None
        while not stop.is_set() and context.ok():
            if deadline is not None and time.monotonic() >= deadline:
                break
            executor.spin_once(timeout_sec=0.1)
        drain_until = time.monotonic() + DRAIN_S
        while context.ok() and time.monotonic() < drain_until:
            executor.spin_once(timeout_sec=0.05)
        executor.remove_node(node)
    finally:
        if node is not None:
            node.writer.close()
            node.destroy_node()
        rclpy.try_shutdown(context=context)
        _restore(old)
    return finish(node, log)


def finish(node, log: Callable[[str], None]) -> int:
    """After the bag is closed: report it and write the timing table beside it."""
    from timelyllm_ros.lrtrace import bag as bagmod
    from timelyllm_ros.lrtrace import timing_table

    writer = node.writer
    per_topic = ", ".join(f"{t} {n}" for t, n in sorted(writer.counts.items()) if n)
    log(f"[lrtrace] closed {writer.bag_dir}/ ({writer.mcap_path.name} + metadata.yaml): "
        f"{sum(writer.counts.values())} messages" + (f" ({per_topic})" if per_topic else ""))
    if node.write_errors:
        log(f"[lrtrace] {node.write_errors} messages could not be recorded (see the log)")
    if not node.write_table:
        return 0
    try:
        build, _ = timing_table.table_from_bag(writer.bag_dir)
    except bagmod.BagError as err:
        print(f"lrtrace record: error: reading the bag back failed: {err}", file=sys.stderr, flush=True)
        return 1
    path = timing_table.write_csv(build.rows, Path(writer.bag_dir) / timing_table.TABLE_NAME)
    log(f"[lrtrace] wrote {path}: {build.summary()}")
    return 0


def record(output: str, robots: Sequence[str] = (), duration_s: float = 0.0, *,
           write_table: bool = True, discovery_period_s: float | None = None,
           stop: threading.Event | None = None, log: Callable[[str], None] | None = None) -> int:
    """Record until stopped (Ctrl-C, SIGTERM, `stop`, or `duration_s` > 0 elapsed)."""
    from rclpy.parameter import Parameter

    from timelyllm_ros.ros.lrtrace_recorder_node import DISCOVERY_PERIOD_S

    overrides = [
        Parameter("output", value=str(output)),
        Parameter("robots", value=",".join(robots)),
        Parameter("duration_s", value=float(duration_s)),
        Parameter("write_table", value=bool(write_table)),
        Parameter("discovery_period_s", value=float(discovery_period_s or DISCOVERY_PERIOD_S)),
    ]
    return run_node(None, parameter_overrides=overrides, stop=stop, log=log)
