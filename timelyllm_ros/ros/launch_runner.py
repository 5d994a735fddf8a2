"""Start a node-set description as processes on a pip-only machine: what `timelyllm launch FILE`
runs (its arguments are parsed in timelyllm_ros/cli/launch.py) and how `timelyllm demo` starts
its nodes.

Each node runs as `python -m <module> --ros-args ...` with the same remappings and parameters
a ROS 2 launch file would give it. Output lines are prefixed with the node's label. Ctrl-C (or
`NodeGroup.stop()`) sends SIGINT to every node, waits, then escalates to SIGTERM and SIGKILL.
"""

from __future__ import annotations

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
        for spec in self.specs:
            cmd = [sys.executable, "-m", spec.module, *spec.ros_args()]
            proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=self.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1)
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

    def stop(self, timeout_s: float = 15.0) -> dict[str, int]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + timeout_s
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in self.procs.values():
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.send_signal(sig)
            deadline = time.monotonic() + 5
        for proc in self.procs.values():
            proc.wait()
        for pump in self._pumps:
            pump.join(timeout=2)
        return {label: p.returncode for label, p in self.procs.items()}

    def __enter__(self) -> "NodeGroup":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def run_until_exit(specs: list[NodeSpec], log_dir: Path | None = None) -> int:
    """Start the nodes and wait until all of them have exited or Ctrl-C; then stop them.
    Returns the highest positive exit status of a node, else 0."""
    group = NodeGroup(specs, log_dir=log_dir).start()
    print(f"started {', '.join(group.procs)}; Ctrl-C stops them", file=sys.stderr)
    try:
        while len(group.exited()) < len(group.procs):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    codes = group.stop()
    return max((c for c in codes.values() if c and c > 0), default=0)
