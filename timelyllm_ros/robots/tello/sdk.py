"""The Tello SDK's UDP protocol: one client that sends commands, waits for replies and keeps
the latest state packet. It knows SDK commands only; skill calls are the backend's business
(backend.py).

The Tello SDK (2.0 User Guide) is a UDP text protocol. Commands go to the drone's port 8889 and
are answered, on the same socket, with `ok` or `error ...` **once the motion has completed**;
the drone streams its state (`key:value;` pairs) to UDP port 8890 of the client, 10 times a
second, once it is in SDK mode. Plain sockets, no third-party package.

Ordering and timeouts: one command is in flight at a time (a lock also covers the keep-alive),
and the next one is sent only after the reply to the previous one. Each command's timeout is
`timeout_factor x expected + timeout_margin_s` (default 2x + 3 s), the expected duration coming
from `TelloTimings` (the same figures as config/exec_model.yaml: 50 cm/s and 90 deg/s plus 1.0 s
per command). Timeouts are retried (`retries` times) ONLY for commands that are safe to repeat
(`command`, `speed N`, queries ending in `?`, `streamon/off`). A motion command that times out
is NOT retried: UDP replies carry no id, the drone may well have executed it (the reply may be
the thing that was lost), and repeating `forward 100` blindly could fly it 2 m. The caller gets
a TelloTimeout saying so, and the operator/planner decides. Before each command, stale
datagrams (e.g. a late reply to a timed-out command) are drained so they are not taken for the
reply to the new command; a reply that arrives later than that drain would still be
mismatched, which is inherent to the protocol.

Keep-alive: the Tello lands by itself after ~15 s without any command. While the client is
connected and idle it sends `command` every `keepalive_s` (default 10 s) to prevent that.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Self

from timelyllm_ros.robots.tello.timings import TelloTimings

DEFAULT_HOST = "192.168.10.1"
DEFAULT_PORT = 8889
DEFAULT_STATE_PORT = 8890

# Commands that may be repeated after a timeout without moving the drone twice.
_SAFE_TO_RETRY = {"command", "speed", "streamon", "streamoff", "wifi", "mon", "moff", "keepalive"}

log = logging.getLogger("timelyllm.tello")


class TelloError(RuntimeError):
    """The drone answered something other than `ok`, or the link failed."""


class TelloTimeout(TelloError):
    """No reply within the command's timeout."""


class TelloAborted(TelloError):
    """The client was stopped (executor shutting down) while waiting."""


def parse_state(packet: bytes | str) -> dict[str, object]:
    """`mid:-1;x:0;...;mpry:0,0,0;pitch:0;...;bat:87;baro:12.34;...\\r\\n` -> dict.

    Values become int or float where they parse as such, a tuple for comma lists (mpry),
    otherwise stay strings. Malformed pairs are skipped."""
    text = packet.decode("ascii", errors="replace") if isinstance(packet, bytes) else packet
    out: dict[str, object] = {}
    for pair in text.strip().split(";"):
        key, sep, value = pair.partition(":")
        key = key.strip()
        if not sep or not key:
            continue
        out[key] = _state_value(value.strip())
    return out


def _state_value(value: str):
    if "," in value:
        return tuple(_state_value(v) for v in value.split(","))
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


@dataclass
class CommandRecord:
    command: str
    sent: float           # time.monotonic()
    replied: float | None
    reply: str | None
    attempts: int = 1


class TelloClient:
    """The command link and state stream of one Tello. Thread-safe.

    host/port: the drone's command address (default 192.168.10.1:8889).
    state_port: local UDP port the drone streams state to (8890 on a real drone; 0 = any free
        port, for emulators that are told where to send state).
    local_port: local port of the command socket (0 = any; the drone replies to the sender).
    bind_host: local address to bind; default 127.0.0.1 when host is a loopback address,
        else 0.0.0.0 (all interfaces, as the drone's Wi-Fi address is not known in advance).
    speed_cm_s: if set, `speed N` is sent after `command` and used for the timeouts.
    stop: an Event that aborts a wait for a reply (TelloAborted) when set.
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 state_port: int = DEFAULT_STATE_PORT, local_port: int = 0, *,
                 bind_host: str | None = None, timings: TelloTimings | None = None,
                 timeout_factor: float = 2.0, timeout_margin_s: float = 3.0, retries: int = 2,
                 keepalive_s: float | None = 10.0, speed_cm_s: float | None = None,
                 stop: threading.Event | None = None, logger: logging.Logger | None = None):
        for what, p in (("port", port), ("state_port", state_port), ("local_port", local_port)):
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 65535:
                raise ValueError(f"{what}: must be a port number 0-65535, got {p!r}")
        if port == 0:
            raise ValueError("port: the drone's command port cannot be 0")
        if not timeout_factor > 0 or not timeout_margin_s >= 0 or retries < 0:
            raise ValueError("timeout_factor must be > 0, timeout_margin_s >= 0, retries >= 0")
        if speed_cm_s is not None and not 10 <= speed_cm_s <= 100:
            raise ValueError(f"speed_cm_s: the SDK accepts 10-100, got {speed_cm_s}")
        try:
            addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
        except socket.gaierror as err:
            raise ValueError(f"host: cannot resolve {host!r}: {err}") from None
        self.drone = (addr[0], port)
        if bind_host is None:
            bind_host = "127.0.0.1" if ipaddress.ip_address(addr[0]).is_loopback else "0.0.0.0"
        self.timings = timings or TelloTimings()
        self.timeout_factor = float(timeout_factor)
        self.timeout_margin_s = float(timeout_margin_s)
        self.retries = int(retries)
        self.keepalive_s = keepalive_s
        self.speed_cm_s = speed_cm_s
        self._stop = stop or threading.Event()
        self._closed = threading.Event()
        self._log = logger or log

        self._cmd_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._state_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._cmd_sock.bind((bind_host, local_port))
            self._state_sock.bind((bind_host, state_port))
        except OSError as err:
            self._cmd_sock.close()
            self._state_sock.close()
            raise ValueError(f"cannot bind local UDP ports on {bind_host} "
                             f"(command {local_port}, state {state_port}): {err}") from None
        self._cmd_sock.settimeout(0.1)
        self._state_sock.settimeout(0.2)
        self.local_port = self._cmd_sock.getsockname()[1]
        self.state_port = self._state_sock.getsockname()[1]

        self._lock = threading.Lock()          # one command in flight
        self._state_lock = threading.Lock()
        self._state: dict[str, object] = {}
        self._state_at: float | None = None
        self.state_packets = 0
        self._connected = False
        self._last_send = 0.0
        # The last 1000 commands with send/reply times (diagnostics and tests).
        self.history: deque[CommandRecord] = deque(maxlen=1000)
        self._state_thread = threading.Thread(target=self._state_loop, name="tello-state", daemon=True)
        self._state_thread.start()
        self._keepalive_thread: threading.Thread | None = None

    # -- state ---------------------------------------------------------------------------------

    @property
    def state(self) -> dict[str, object]:
        """Latest state packet as a dict (bat, h, tof, yaw, ...); empty until one arrived."""
        with self._state_lock:
            return dict(self._state)

    @property
    def state_age_s(self) -> float | None:
        with self._state_lock:
            return None if self._state_at is None else time.monotonic() - self._state_at

    def wait_for_state(self, timeout_s: float) -> dict[str, object]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._closed.is_set():
            s = self.state
            if s:
                return s
            time.sleep(0.02)
        return self.state

    def _state_loop(self) -> None:
        while not self._closed.is_set():
            try:
                data, src = self._state_sock.recvfrom(2048)
            except socket.timeout:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(0.1)
                continue
            if src[0] != self.drone[0]:
                continue
            parsed = parse_state(data)
            if parsed:
                with self._state_lock:
                    self._state = parsed
                    self._state_at = time.monotonic()
                    self.state_packets += 1

    # -- commands ------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected

    def timeout_for(self, command: str) -> float:
        return (self.timeout_factor * self.timings.expected(command, self.speed_cm_s)
                + self.timeout_margin_s)

    def connect(self) -> None:
        """Enter SDK mode (`command`), and set the speed if configured. Raises TelloError."""
        self.send_command("command")
        if self.speed_cm_s is not None:
            self.send_command(f"speed {int(self.speed_cm_s)}")
        self._connected = True
        if self.keepalive_s and self._keepalive_thread is None:
            self._keepalive_thread = threading.Thread(target=self._keepalive_loop,
                                                      name="tello-keepalive", daemon=True)
            self._keepalive_thread.start()

    def mark_disconnected(self) -> None:
        """Forget that the drone is in SDK mode (`connected` is False until the next `connect`):
        after a timeout it may have rebooted or dropped out of SDK mode."""
        self._connected = False

    def send_command(self, command: str, timeout_s: float | None = None) -> str:
        """Send one command and wait for its reply; return the reply text.

        Raises TelloError for replies other than `ok` (queries ending in `?` return the value),
        TelloTimeout when nothing came back (after retries, for commands safe to repeat) and
        TelloAborted when the client is stopped meanwhile.
        """
        timeout = self.timeout_for(command) if timeout_s is None else timeout_s
        word = command.split(" ", 1)[0]
        query = command.endswith("?")
        tries = 1 + (self.retries if (query or word in _SAFE_TO_RETRY) else 0)
        with self._lock:
            record = CommandRecord(command, time.monotonic(), None, None, 0)
            self.history.append(record)
            for attempt in range(1, tries + 1):
                record.attempts = attempt
                reply = self._exchange(command, timeout)
                if reply is not None:
                    record.replied, record.reply = time.monotonic(), reply
                    break
                self._log.warning(f"tello: no reply to {command!r} within {timeout:.1f} s "
                                  f"(attempt {attempt}/{tries})")
            else:
                if tries == 1:
                    raise TelloTimeout(
                        f"no reply to {command!r} within {timeout:.1f} s; not retried: the drone "
                        f"may have executed it (UDP replies can be lost)")
                raise TelloTimeout(f"no reply to {command!r} within {timeout:.1f} s "
                                   f"({tries} attempts)")
        if query:
            if reply.lower().startswith("error"):
                raise TelloError(f"{command!r} -> {reply!r}")
            return reply
        if reply.lower() != "ok":
            raise TelloError(f"{command!r} -> {reply!r}")
        return reply

    def _exchange(self, command: str, timeout: float) -> str | None:
        """Under the lock: drain stale datagrams, send, wait for a datagram from the drone."""
        self._drain()
        try:
            self._cmd_sock.sendto(command.encode("ascii"), self.drone)
        except OSError as err:
            raise TelloError(f"cannot send {command!r} to {self.drone[0]}:{self.drone[1]}: {err}") from None
        self._last_send = time.monotonic()
        deadline = self._last_send + timeout
        while True:
            if self._stop.is_set() or self._closed.is_set():
                raise TelloAborted(f"stopped while waiting for the reply to {command!r}")
            if time.monotonic() >= deadline:
                return None
            try:
                data, src = self._cmd_sock.recvfrom(2048)
            except socket.timeout:
                continue
            except ConnectionRefusedError:
                # ICMP port unreachable (e.g. nothing listening on loopback): keep waiting.
                time.sleep(0.05)
                continue
            except OSError as err:
                raise TelloError(f"receive failed waiting for {command!r}: {err}") from None
            if src[0] != self.drone[0] or src[1] != self.drone[1]:
                continue
            self._last_send = time.monotonic()
            return data.decode("utf-8", errors="replace").strip()

    def _drain(self) -> None:
        self._cmd_sock.setblocking(False)
        try:
            while True:
                try:
                    data, _ = self._cmd_sock.recvfrom(2048)
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionRefusedError:
                    continue
                self._log.warning(f"tello: discarded stale reply {data!r}")
        finally:
            self._cmd_sock.settimeout(0.1)

    def _keepalive_loop(self) -> None:
        while not self._closed.wait(1.0):
            if self._stop.is_set() or not self._connected or not self.keepalive_s:
                continue
            if time.monotonic() - self._last_send < self.keepalive_s:
                continue
            if not self._lock.acquire(blocking=False):
                continue  # a command is in flight: that is traffic enough
            try:
                # Wait for the `ok` under the lock, so it cannot be taken for the reply to the
                # next real command.
                if self._exchange("command", self.timeout_for("command")) is None:
                    self._log.warning("tello: no reply to keep-alive `command`")
            except TelloError as err:
                self._log.warning(f"tello: keep-alive failed: {err}")
            finally:
                self._lock.release()

    def close(self) -> None:
        """Stop the state/keep-alive threads and close the sockets (the drone is left as is)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._state_thread.join(timeout=2)
        if self._keepalive_thread is not None:
            self._keepalive_thread.join(timeout=2)
        with self._lock:
            self._cmd_sock.close()
        self._state_sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
