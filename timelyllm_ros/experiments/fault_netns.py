"""A robot behind a real network link that can be cut: a Linux network namespace joined to the
host by a veth pair, for the fault runner's "DDS-level disconnect" row (experiments/faults.py).

Why this and not SIGSTOP: a frozen process still holds its sockets and its shared-memory
segments, and the kernel still answers for it; a cut link is what a robot out of Wi-Fi range
is. DDS must really go over IP for the cut to matter, so every process of the scenario runs
with `FASTDDS_BUILTIN_TRANSPORTS=UDPv4` (Fast DDS's shared-memory transport would carry the
traffic past the link) and finds the other side through `ROS_STATIC_PEERS` (discovery stays
`LOCALHOST`: no multicast leaves the machine, the one peer address is added by hand).

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip`; `available()` says whether
both are there. Addresses come from TEST-NET-2 (198.51.100.0/24, RFC 5737, never routed), one
/30 per ROS domain so that concurrent runs on other domains do not collide.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

NET = "198.51.100"


def available() -> str | None:
    """None when a namespace can be made here, else why not."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "not root (creating a network namespace needs CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    return None


class RobotNamespace:
    """`tag` names the namespace and both veth ends; `slot` (0-63) picks the /30."""

    def __init__(self, tag: str, slot: int):
        self.ns = f"tlf{tag}"
        self.host_if, self.ns_if = f"tlf{tag}h", f"tlf{tag}n"
        base = 4 * (slot % 64)
        self.host_addr, self.ns_addr = f"{NET}.{base + 1}", f"{NET}.{base + 2}"
        self.proc: subprocess.Popen | None = None
        self._log = None

    # ------------------------------------------------------------------ the link
    def create(self) -> "RobotNamespace":
        self.destroy()  # leftovers of a run that was killed
        for cmd in (["netns", "add", self.ns],
                    ["link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if],
                    ["link", "set", self.ns_if, "netns", self.ns],
                    ["addr", "add", f"{self.host_addr}/30", "dev", self.host_if],
                    ["link", "set", self.host_if, "up"],
                    ["-n", self.ns, "addr", "add", f"{self.ns_addr}/30", "dev", self.ns_if],
                    ["-n", self.ns, "link", "set", self.ns_if, "up"],
                    ["-n", self.ns, "link", "set", "lo", "up"]):
            _ip(*cmd)
        return self

    def cut(self) -> None:
        """Take the host end down: both ends lose carrier, nothing crosses in either way."""
        _ip("link", "set", self.host_if, "down")

    def restore(self) -> None:
        _ip("link", "set", self.host_if, "up")

    def destroy(self) -> None:
        self.stop()
        # Deleting the namespace deletes its veth end, and with it the pair.
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)

    # ------------------------------------------------------------------ the robot in it
    def host_env(self) -> dict[str, str]:
        """For every process on the host side of the link (planner, other robots, client)."""
        return {"FASTDDS_BUILTIN_TRANSPORTS": "UDPv4", "ROS_STATIC_PEERS": self.ns_addr}

    def start(self, spec, env: dict[str, str], log_path: Path) -> subprocess.Popen:
        """Run a NodeSpec inside the namespace (as launch_runner.NodeGroup would, in a process
        group of its own), its output to `log_path`."""
        from timelyllm_ros.ros_env import REPO_ROOT

        env = {**env, "FASTDDS_BUILTIN_TRANSPORTS": "UDPv4", "ROS_STATIC_PEERS": self.host_addr,
               "PYTHONUNBUFFERED": "1"}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("w")
        # `ip netns exec` execs the command: the pid is the node's own.
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, "-m", spec.module, *spec.ros_args()],
            cwd=REPO_ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)
        return self.proc

    def stop(self, grace_s: float = 5.0) -> int | None:
        proc = self.proc
        if proc is not None:
            for sig in (signal.SIGINT, signal.SIGKILL):
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, sig)
                    except ProcessLookupError:
                        pass
                    try:
                        proc.wait(grace_s)
                    except subprocess.TimeoutExpired:
                        pass
            proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode if proc is not None else None


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip() or out.returncode}")
