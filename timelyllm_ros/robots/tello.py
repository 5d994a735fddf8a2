"""A DJI/Ryze Tello backend for the executor node: MiniSpec skill calls -> Tello SDK commands.

The Tello SDK (2.0 User Guide) is a UDP text protocol. Commands go to the drone's port 8889 and
are answered, on the same socket, with `ok` or `error ...` **once the motion has completed**;
the drone streams its state (`key:value;` pairs) to UDP port 8890 of the client, 10 times a
second, once it is in SDK mode. Plain sockets, no third-party package.

Skill mapping (MiniSpec names, see timelyllm_ros/core/skills/minispec.py):

    takeoff                 takeoff
    land                    land
    move_forward(cm)        forward N        move_backward -> back, move_left -> left,
                                             move_right -> right, move_up -> up, move_down -> down
    turn_cw(deg)            cw N             turn_ccw -> ccw
    approach                forward 120      (TypeFly: approach = mf,120)
    delay(ms)               local sleep, nothing sent
    sweeping(obj)           cw 45, up to 8 times, until the detector sees obj (no detector: the
    sweeping_abstract(txt)  full 8 steps, i.e. one complete turn, result unknown)
    orienting(obj)          no motion (centring needs object_x from a detector; see `detector`)
    is_visible, object_x, object_y, object_width, object_height
                            no SDK command; answered by `detector` if one is given, else
                            reported as "unknown" (success: the drone did nothing wrong)
    picture / take_picture  no SDK command (this backend does not run the video stream)
    log(text)               logged locally;  query(text): nothing on the drone (an LLM call)

Argument ranges: the SDK takes 20-500 cm and 1-360 degrees per command. Longer moves are split
into equal parts (forward 1200 -> 3 x forward 400; cw 720 -> 2 x cw 360); moves shorter than
20 cm are ROUNDED UP to 20 cm (the drone overshoots by < 20 cm; the SDK cannot do less);
0 sends nothing; a negative argument means the opposite direction (move_forward(-50) ->
back 50). A non-numeric argument (a MiniSpec variable such as `_1`, whose value the robot does
not know) fails the segment before anything moves: every call of a segment is translated and
checked first, then executed.

Ordering and timeouts: one command is in flight at a time (a lock also covers the keep-alive),
and the next one is sent only after the reply to the previous one. Each command's timeout is
`timeout_factor x expected + timeout_margin_s` (default 2x + 3 s), the expected duration coming
from `TelloTimings` (the same figures as config/exec_model.yaml: 50 cm/s and 90 deg/s plus 1.0 s
per command). Timeouts are retried (`retries` times) ONLY for commands that are safe to repeat
(`command`, `speed N`, queries ending in `?`, `streamon/off`). A motion command that times out
is NOT retried: UDP replies carry no id, the drone may well have executed it (the reply may be
the thing that was lost), and repeating `forward 100` blindly could fly it 2 m. The segment
fails with a message saying so, and the operator/planner decides. Before each command, stale
datagrams (e.g. a late reply to a timed-out command) are drained so they are not taken for the
reply to the new command; a reply that arrives later than that drain would still be
mismatched, which is inherent to the protocol.

Safety notes: the Tello lands by itself after ~15 s without any command. While the backend is
connected and idle it sends `command` every `keepalive_s` (default 10 s) to prevent that. The
backend never lands the drone on its own (not on failure, not on shutdown): a plan's `land`
call or the operator does.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from timelyllm_ros.core.skills.base import SkillCall

DEFAULT_HOST = "192.168.10.1"
DEFAULT_PORT = 8889
DEFAULT_STATE_PORT = 8890

MIN_MOVE_CM, MAX_MOVE_CM = 20, 500
MIN_TURN_DEG, MAX_TURN_DEG = 1, 360
SWEEP_STEP_DEG, SWEEP_MAX_STEPS = 45, 8
APPROACH_CM = 120

_MOVES = {"move_forward": ("forward", "back"), "move_backward": ("back", "forward"),
          "move_left": ("left", "right"), "move_right": ("right", "left"),
          "move_up": ("up", "down"), "move_down": ("down", "up")}
_TURNS = {"turn_cw": ("cw", "ccw"), "turn_ccw": ("ccw", "cw")}
_VISION = ("is_visible", "object_x", "object_y", "object_width", "object_height")
_TRANSLATE_WORDS = {"forward", "back", "left", "right", "up", "down"}
_TURN_WORDS = {"cw", "ccw"}
# Commands that may be repeated after a timeout without moving the drone twice.
_SAFE_TO_RETRY = {"command", "speed", "streamon", "streamoff", "wifi", "mon", "moff", "keepalive"}

log = logging.getLogger("timelyllm.tello")


class TelloError(RuntimeError):
    """The drone answered something other than `ok`, or the link failed."""


class TelloTimeout(TelloError):
    """No reply within the command's timeout."""


class TelloAborted(TelloError):
    """The backend was stopped (executor shutting down) while waiting."""


class TranslationError(ValueError):
    """A skill call that cannot be turned into SDK commands (unknown skill, bad argument)."""


@dataclass(frozen=True)
class TelloTimings:
    """Expected command durations, used to derive timeouts (not to pace anything).

    Defaults match config/exec_model.yaml (translation 50 cm/s + 1.0 s, rotation 90 deg/s +
    1.0 s). exec_model.yaml has no takeoff/land entries (they fall back to its 1.0 s default);
    a real Tello needs several seconds for either, hence 5 s and 4 s here.
    """

    speed_cm_s: float = 50.0
    fixed_s: float = 1.0
    turn_deg_s: float = 90.0
    turn_fixed_s: float = 1.0
    takeoff_s: float = 5.0
    land_s: float = 4.0
    other_s: float = 0.5

    @classmethod
    def from_exec_model(cls, model) -> "TelloTimings":
        """Take translation/rotation figures from an ExecutionTimeModel (linear move_forward /
        turn_cw models); anything missing or not linear keeps the default."""
        kw = {}
        try:
            mf = model.model_for("move_forward")
            if getattr(mf, "kind", "") == "linear" and mf.per_unit_s > 0:
                kw.update(speed_cm_s=1.0 / mf.per_unit_s, fixed_s=mf.fixed_s)
            tc = model.model_for("turn_cw")
            if getattr(tc, "kind", "") == "linear" and tc.per_unit_s > 0:
                kw.update(turn_deg_s=1.0 / tc.per_unit_s, turn_fixed_s=tc.fixed_s)
        except AttributeError:
            pass
        return cls(**kw)

    def expected(self, command: str, speed_cm_s: float | None = None) -> float:
        word, _, rest = command.partition(" ")
        try:
            n = abs(float(rest.split()[0])) if rest else 0.0
        except ValueError:
            n = 0.0
        if word in _TRANSLATE_WORDS:
            return self.fixed_s + n / (speed_cm_s or self.speed_cm_s)
        if word in _TURN_WORDS:
            return self.turn_fixed_s + n / self.turn_deg_s
        if word == "takeoff":
            return self.takeoff_s
        if word == "land":
            return self.land_s
        return self.other_s


# --- translation (pure) ---------------------------------------------------------------------

@dataclass(frozen=True)
class SdkStep:
    command: str
    call: str


@dataclass(frozen=True)
class SleepStep:
    seconds: float
    call: str


@dataclass(frozen=True)
class LocalStep:
    """Nothing is sent to the drone: a vision query, a log line, a picture, a query."""

    skill: str
    args: tuple[str, ...]
    call: str


@dataclass(frozen=True)
class SweepStep:
    target: str
    call: str


Step = SdkStep | SleepStep | LocalStep | SweepStep


def _number(call: SkillCall, index: int = 0) -> float:
    if len(call.args) <= index:
        raise TranslationError(f"{call.to_wire()}: missing argument {index + 1}")
    raw = call.args[index].strip()
    try:
        v = float(raw)
    except ValueError:
        raise TranslationError(
            f"{call.to_wire()}: argument {raw!r} is not a number (variables cannot be resolved "
            f"on the robot)") from None
    if not math.isfinite(v):
        raise TranslationError(f"{call.to_wire()}: argument {raw!r} is not finite")
    return v


def split_amount(total: int, lo: int, hi: int) -> list[int]:
    """Split a non-negative amount into SDK-sized parts: [] for 0, [lo] below lo (round up),
    else ceil(total/hi) near-equal parts, each within [lo, hi]."""
    if total <= 0:
        return []
    if total < lo:
        return [lo]
    n = -(-total // hi)
    base, extra = divmod(total, n)
    return [base + 1] * extra + [base] * (n - extra)


def translate(call: SkillCall) -> list[Step]:
    """The steps that execute one skill call. Raises TranslationError for unknown skills and
    for arguments that are not numbers where the SDK needs one."""
    wire = call.to_wire()
    name = call.name
    if name == "takeoff":
        return [SdkStep("takeoff", wire)]
    if name == "land":
        return [SdkStep("land", wire)]
    if name in _MOVES or name in _TURNS:
        pos, neg = _MOVES.get(name) or _TURNS[name]
        lo, hi = (MIN_MOVE_CM, MAX_MOVE_CM) if name in _MOVES else (MIN_TURN_DEG, MAX_TURN_DEG)
        v = _number(call)
        word = pos if v >= 0 else neg
        return [SdkStep(f"{word} {n}", wire) for n in split_amount(int(round(abs(v))), lo, hi)]
    if name == "approach":
        return [SdkStep(f"forward {APPROACH_CM}", wire)]
    if name == "delay":
        return [SleepStep(max(0.0, _number(call)) / 1000.0, wire)]
    if name in ("sweeping", "sweeping_abstract"):
        return [SweepStep(call.args[0] if call.args else "", wire)]
    if name in _VISION or name in ("orienting", "picture", "take_picture", "log", "query"):
        return [LocalStep(name, tuple(call.args), wire)]
    raise TranslationError(f"{wire}: unknown drone skill {name!r}")


def translate_all(calls: Sequence[SkillCall]) -> list[Step]:
    steps: list[Step] = []
    for c in calls:
        steps.extend(translate(c))
    return steps


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


# --- the backend ----------------------------------------------------------------------------

class TelloBackend:
    """Executor SkillBackend for one Tello. Thread-safe; `execute` never raises.

    host/port: the drone's command address (default 192.168.10.1:8889).
    state_port: local UDP port the drone streams state to (8890 on a real drone; 0 = any free
        port, for emulators that are told where to send state).
    local_port: local port of the command socket (0 = any; the drone replies to the sender).
    bind_host: local address to bind; default 127.0.0.1 when host is a loopback address,
        else 0.0.0.0 (all interfaces, as the drone's Wi-Fi address is not known in advance).
    detector: optional `detector(object_name) -> bool` (is the object in the current frame?),
        used by is_visible and sweeping.
    speed_cm_s: if set, `speed N` is sent after `command` and used for the timeouts.
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 state_port: int = DEFAULT_STATE_PORT, local_port: int = 0, *,
                 bind_host: str | None = None, timings: TelloTimings | None = None,
                 timeout_factor: float = 2.0, timeout_margin_s: float = 3.0, retries: int = 2,
                 keepalive_s: float | None = 10.0, speed_cm_s: float | None = None,
                 detector: Callable[[str], bool] | None = None,
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
        self.detector = detector
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

    def send_command(self, command: str, timeout_s: float | None = None) -> str:
        """Send one command and wait for its reply; return the reply text.

        Raises TelloError for replies other than `ok` (queries ending in `?` return the value),
        TelloTimeout when nothing came back (after retries, for commands safe to repeat) and
        TelloAborted when the backend is stopped meanwhile.
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

    # -- SkillBackend --------------------------------------------------------------------------

    def execute(self, calls: Sequence[SkillCall]) -> tuple[bool, str]:
        """Run the calls in order; (True, summary) or (False, what failed and why)."""
        started = time.monotonic()
        try:
            plan = [(call.to_wire(), translate(call)) for call in calls]
        except TranslationError as err:
            return False, f"tello: {err} (nothing executed)"
        try:
            if not self._connected:
                self.connect()
        except TelloError as err:
            return False, f"tello: entering SDK mode failed: {err} (nothing executed)"
        sent: list[str] = []
        notes: list[str] = []
        for done, (wire, steps) in enumerate(plan):
            try:
                for step in steps:
                    if isinstance(step, SdkStep):
                        self.send_command(step.command)
                        sent.append(step.command)
                    elif isinstance(step, SleepStep):
                        if self._stop.wait(step.seconds):
                            raise TelloAborted("stopped during delay")
                    elif isinstance(step, SweepStep):
                        found, _ = self._sweep(step.target, sent)
                        notes.append(f"{wire}={found}")
                    else:
                        note = self._local(step)
                        if note:
                            notes.append(note)
            except TelloError as err:
                if isinstance(err, TelloTimeout):
                    # The drone may have rebooted or dropped out of SDK mode: send `command`
                    # again before the next segment.
                    self._connected = False
                return False, (f"tello: {wire}: {err} (after {done} of {len(plan)} skill call(s); "
                               f"sent: {', '.join(sent) or 'nothing'})")
            except Exception as err:  # noqa: BLE001 - a detector's bug must not kill the executor
                return False, f"tello: {wire}: {type(err).__name__}: {err}"
        took = time.monotonic() - started
        summary = f"tello: {len(sent)} SDK command(s) [{', '.join(sent)}] in {took:.2f} s"
        if notes:
            summary += "; " + "; ".join(notes)
        return True, summary

    def _sweep(self, target: str, sent: list[str]) -> tuple[bool | str, int]:
        """TypeFly's sweeping: turn 45 deg until the target is visible, at most 8 times."""
        for turns in range(SWEEP_MAX_STEPS):
            if self.detector is not None and self.detector(target):
                return True, turns
            cmd = f"cw {SWEEP_STEP_DEG}"
            self.send_command(cmd)
            sent.append(cmd)
        if self.detector is not None:
            return bool(self.detector(target)), SWEEP_MAX_STEPS
        return "unknown (no detector)", SWEEP_MAX_STEPS

    def _local(self, step: LocalStep) -> str:
        if step.skill == "log":
            self._log.info(f"tello log: {','.join(step.args)}")
            return ""
        if step.skill == "is_visible":
            if self.detector is None:
                return f"{step.call}=unknown (no detector)"
            return f"{step.call}={bool(self.detector(step.args[0] if step.args else ''))}"
        if step.skill in _VISION:
            return f"{step.call}=unknown (no detector)"
        if step.skill in ("picture", "take_picture"):
            return f"{step.call}: no video stream in this backend, no picture taken"
        if step.skill == "orienting":
            return f"{step.call}: no motion (centring needs a detector with object positions)"
        return ""  # query: answered by the LLM side, nothing to do on the drone

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

    def __enter__(self) -> "TelloBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
