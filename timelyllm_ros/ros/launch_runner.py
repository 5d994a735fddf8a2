"""Start a node-set description as processes on a pip-only machine: what `timelyllm launch FILE`
runs (its arguments are parsed in timelyllm_ros/cli/launch.py) and how `timelyllm demo` starts
its nodes.

Each node runs as `python -m <module> --ros-args ...` with the same remappings and parameters
a ROS 2 launch file would give it, in a process group of its own (so whatever it starts, e.g.
vLLM's engine-core process, is stopped with it). Output lines are prefixed with the node's
label. Nodes marked `lifecycle: true` are driven to active (configure, then activate) as
`ros2 lifecycle` would.

Stopping (Ctrl-C, SIGTERM, `NodeGroup.stop()`, or the interpreter exiting): SIGINT to every
group, then SIGTERM, then SIGKILL, until every process it started is gone, whatever happened to
them.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from timelyllm_ros.ros.launch_description import NodeSpec
from timelyllm_ros.ros_env import REPO_ROOT

# Every node exits within 2 s of SIGINT (runtime.py); allow for a loaded machine.
GRACE_S = 5.0
TERM_GRACE_S = 2.0


class NodeGroup:
    def __init__(self, specs: list[NodeSpec], *, env: dict[str, str] | None = None,
                 log_dir: Path | None = None, echo: bool = True):
        self.specs = specs
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.log_dir = log_dir
        self.echo = echo
        self.procs: dict[str, subprocess.Popen] = {}
        self._pumps: list[threading.Thread] = []

    def start(self) -> "NodeGroup":
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.kill)
        for spec in self.specs:
            cmd = [sys.executable, "-m", spec.module, *spec.ros_args()]
            proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=self.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1,
                                    start_new_session=True)
            self.procs[spec.label] = proc
            log = (self.log_dir / f"{spec.label.replace('/', '__')}.log").open("w") if self.log_dir else None
            pump = threading.Thread(target=self._pump, args=(spec.label, proc.stdout, log), daemon=True)
            pump.start()
            self._pumps.append(pump)
        return self

    def _pump(self, label: str, stream: IO[str], log: IO[str] | None) -> None:
        for line in stream:
            if log:
                log.write(line)
                log.flush()
            if self.echo:
                sys.stderr.write(f"[{label}] {line}")
        if log:
            log.close()

    def exited(self) -> dict[str, int]:
        return {label: p.returncode for label, p in self.procs.items() if p.poll() is not None}

    def drive_lifecycle(self, timeout_s: float = 900.0) -> None:
        """Bring every `lifecycle: true` node to active; LifecycleError says which failed."""
        managed = [s for s in self.specs if s.lifecycle]
        if not managed:
            return
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.node import Node

        from timelyllm_ros.ros.lifecycle_client import LifecycleClient

        context = rclpy.Context()
        rclpy.init(context=context, signal_handler_options=_no_signals())
        node = Node("timelyllm_launch_lifecycle", context=context)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        try:
            for spec in managed:
                proc = self.procs[spec.label]
                LifecycleClient(node, spec.fqn).drive_to_active(
                    timeout_s, alive=lambda p=proc: p.poll() is None)
        finally:
            executor.shutdown(timeout_sec=1)
            node.destroy_node()
            rclpy.try_shutdown(context=context)

    def stop(self, timeout_s: float = GRACE_S) -> dict[str, int]:
        self._signal_all(signal.SIGINT)
        deadline = time.monotonic() + timeout_s
        for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, TERM_GRACE_S)):
            for proc in self.procs.values():
                try:
                    proc.wait(timeout=max(0.05, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _signal_group(proc, sig)
            deadline = time.monotonic() + grace
        for proc in self.procs.values():
            proc.wait()
        self._signal_all(signal.SIGKILL, leaders_too=True)  # stragglers of exited leaders
        for pump in self._pumps:
            pump.join(timeout=2)
        atexit.unregister(self.kill)
        return {label: p.returncode for label, p in self.procs.items()}

    def kill(self) -> None:
        """Last resort (interpreter exit): SIGKILL every process group still there."""
        self._signal_all(signal.SIGKILL, leaders_too=True)

    def _signal_all(self, sig: int, leaders_too: bool = False) -> None:
        for proc in self.procs.values():
            if proc.poll() is None or leaders_too:
                _signal_group(proc, sig)

    def __enter__(self) -> "NodeGroup":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)   # start_new_session: the group id is the leader's pid
    except (ProcessLookupError, PermissionError):
        pass


def _no_signals():
    from rclpy.signals import SignalHandlerOptions

    return SignalHandlerOptions.NO


def run_until_exit(specs: list[NodeSpec], log_dir: Path | None = None) -> int:
    """Start the nodes, drive the lifecycle ones to active, and wait until all of them have
    exited or Ctrl-C / SIGTERM; then stop them. Returns the highest positive exit status of a
    node, else 0 (1 if a lifecycle node could not be brought up)."""
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt) \
        if threading.current_thread() is threading.main_thread() else None
    group = NodeGroup(specs, log_dir=log_dir).start()
    failed = 0
    print(f"started {', '.join(group.procs)}; Ctrl-C stops them", file=sys.stderr)
    try:
        try:
            group.drive_lifecycle()
            if any(s.lifecycle for s in specs):
                print("lifecycle nodes active: "
                      f"{', '.join(s.fqn for s in specs if s.lifecycle)}", file=sys.stderr)
        except Exception as err:  # noqa: BLE001 - reported; the nodes are stopped below
            print(f"timelyllm launch: {err}", file=sys.stderr)
            failed = 1
        while not failed and len(group.exited()) < len(group.procs):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        codes = group.stop()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    return max([failed, *(c for c in codes.values() if c and c > 0)])


def _raise_interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt
