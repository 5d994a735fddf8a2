#!/usr/bin/env python3
"""A Tello SDK emulator on UDP: try the Tello executor without a drone.

Protocol-level only (no physics, no video): it listens for SDK text commands, answers `ok` /
`error ...` / a value when the "motion" has completed, and streams state packets at 10 Hz to the
client that sent `command`, like a Tello (SDK 2.0) does. Standard library only, so it runs with
any Python 3.9+:

    python tools/tello_emulator.py --port 0 --state-port 8890 --speed 50 --time-scale 0.2

prints `tello-emulator listening on 127.0.0.1:PORT` and serves until Ctrl-C. See tools/README.md.

Timing model (the same figures as config/exec_model.yaml's Tello entries), all multiplied by
`time_scale`:
    forward/back/left/right/up/down N   fixed_s + N / speed      (1.0 s + N / 50 cm/s)
    cw/ccw N                            fixed_s + N / turn_rate  (1.0 s + N / 90 deg/s)
    takeoff, land                       takeoff_s, land_s        (5.0 s, 4.0 s)
    command, speed N, queries (`battery?` ...), streamon/off, stop, emergency: immediately
Errors (exact firmware texts vary between versions; a client must treat anything other than
`ok` as failure): any command before `command` -> `error Not in SDK mode`; motion while not
flying -> `error Not joystick`; argument outside 20-500 cm / 1-360 deg / speed 10-100 ->
`error Out of range`; takeoff while flying -> `error Already flying`; unknown command ->
`error Unknown command`. A command that arrives while another is still executing is counted in
`overlaps` and answered `error Busy` (a correct client never does that). `rc a b c d` is
accepted without a reply, as on the real drone.

Test hooks (class only): `no_reply_to` (command words executed but never answered, to
exercise client timeouts), `error_replies` (command word -> forced reply), `log` (every command
with its receive and reply times), `overlaps`.
"""

from __future__ import annotations

import argparse
import math
import queue
import socket
import sys
import threading
import time
from dataclasses import dataclass

TRANSLATE = {"forward": (0, 1), "back": (0, -1), "left": (-1, 0), "right": (1, 0)}
VERTICAL = {"up": 1, "down": -1}
TURNS = {"cw": 1, "ccw": -1}
IMMEDIATE = {"command", "speed", "streamon", "streamoff", "stop", "emergency", "mon", "moff",
             "keepalive"}
TAKEOFF_HEIGHT_CM = 80


@dataclass
class CommandRecord:
    command: str
    received: float            # time.monotonic()
    replied: float | None = None
    reply: str | None = None
    source: tuple | None = None


class TelloEmulator:
    """One emulated Tello. `start()` binds and serves in daemon threads; `stop()` ends them.

    host/port: where it listens for commands (port 0: any free port; see `.port`).
    state_port: the client's port to stream state to (a Tello always uses 8890); may be changed
        while running (tests bind the client's state socket to a free port and set it here).
    state_host: where to send state; default: the address that sent `command`.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, state_port: int | None = 8890, *,
                 state_host: str | None = None, speed_cm_s: float = 50.0, fixed_s: float = 1.0,
                 turn_deg_s: float = 90.0, takeoff_s: float = 5.0, land_s: float = 4.0,
                 time_scale: float = 1.0, state_hz: float = 10.0, battery: int = 87,
                 verbose: bool = False):
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if not 10 <= speed_cm_s <= 100:
            raise ValueError(f"speed must be 10-100 cm/s, got {speed_cm_s}")
        self.host, self._req_port = host, port
        self.state_port = state_port
        self.state_host = state_host
        self.speed_cm_s = float(speed_cm_s)
        self.fixed_s = float(fixed_s)
        self.turn_deg_s = float(turn_deg_s)
        self.takeoff_s = float(takeoff_s)
        self.land_s = float(land_s)
        self.time_scale = float(time_scale)
        self.state_hz = float(state_hz)
        self.verbose = verbose
        # Drone state.
        self.sdk_mode = False
        self.flying = False
        self.height_cm = 0
        self.yaw = 0
        self.x_cm = 0.0
        self.y_cm = 0.0
        self.battery = int(battery)
        self.flight_time_s = 0.0
        self._took_off_at: float | None = None
        # Test hooks and observations.
        self.no_reply_to: set[str] = set()
        self.error_replies: dict[str, str] = {}
        self.log: list[CommandRecord] = []
        self.overlaps = 0
        self.state_packets_sent = 0
        self._client: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._busy = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._sock is not None, "start() first"
        return self._sock.getsockname()[1]

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def start(self) -> "TelloEmulator":
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((self.host, self._req_port))
        self._sock.settimeout(0.1)
        for target, name in ((self._receive_loop, "rx"), (self._work_loop, "work"),
                             (self._state_loop, "state")):
            t = threading.Thread(target=target, name=f"tello-emulator-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> "TelloEmulator":
        return self.start() if self._sock is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- model -----------------------------------------------------------------------------

    def duration(self, command: str) -> float:
        """Seconds until the reply to `command` (already multiplied by time_scale)."""
        word, _, rest = command.partition(" ")
        try:
            n = abs(float(rest.split()[0])) if rest else 0.0
        except ValueError:
            n = 0.0
        if word in TRANSLATE or word in VERTICAL:
            base = self.fixed_s + n / self.speed_cm_s
        elif word in TURNS:
            base = self.fixed_s + n / self.turn_deg_s
        elif word == "takeoff":
            base = self.takeoff_s
        elif word == "land":
            base = self.land_s
        else:
            base = 0.0
        return base * self.time_scale

    def _check(self, command: str) -> str | None:
        """Reply to send immediately instead of executing (an error), or None to execute."""
        word, _, rest = command.partition(" ")
        args = rest.split()
        if word == "command":
            return None
        if not self.sdk_mode:
            return "error Not in SDK mode"
        if word.endswith("?") or word in ("emergency", "stop", "streamon", "streamoff",
                                          "mon", "moff", "keepalive"):
            return None
        if word == "speed":
            return None if self._int_in(args, 10, 100) else "error Out of range"
        if word == "takeoff":
            return "error Already flying" if self.flying else None
        if word in TRANSLATE or word in VERTICAL or word in TURNS or word == "land":
            if not self.flying:
                return "error Not joystick"
            if word == "land":
                return None
            lo, hi = (1, 360) if word in TURNS else (20, 500)
            return None if self._int_in(args, lo, hi) else "error Out of range"
        return "error Unknown command"

    @staticmethod
    def _int_in(args: list[str], lo: int, hi: int) -> bool:
        if len(args) != 1:
            return False
        try:
            v = int(args[0])
        except ValueError:
            return False
        return lo <= v <= hi

    def _apply(self, command: str) -> str:
        """Change the drone's state for a completed command; return the reply."""
        word, _, rest = command.partition(" ")
        n = int(rest.split()[0]) if rest.split() and rest.split()[0].lstrip("-").isdigit() else 0
        with self._lock:
            if word == "command":
                self.sdk_mode = True
            elif word == "speed":
                self.speed_cm_s = float(n)
            elif word == "takeoff":
                self.flying, self.height_cm = True, TAKEOFF_HEIGHT_CM
                self._took_off_at = time.monotonic()
            elif word in ("land", "emergency"):
                self._land()
            elif word in TRANSLATE:
                fx, fy = TRANSLATE[word]
                rad = math.radians(self.yaw)
                # Body frame (forward = +y, right = +x) rotated by yaw (cw positive).
                self.x_cm += n * (fx * math.cos(rad) + fy * math.sin(rad))
                self.y_cm += n * (fy * math.cos(rad) - fx * math.sin(rad))
            elif word in VERTICAL:
                self.height_cm = max(10, self.height_cm + VERTICAL[word] * n)
            elif word in TURNS:
                self.yaw = (self.yaw + TURNS[word] * n + 180) % 360 - 180
            elif word.endswith("?"):
                return self._query(word)
        return "ok"

    def _land(self) -> None:
        if self._took_off_at is not None:
            self.flight_time_s += time.monotonic() - self._took_off_at
        self.flying, self.height_cm, self._took_off_at = False, 0, None

    def _query(self, word: str) -> str:
        values = {"battery?": self.battery, "speed?": f"{self.speed_cm_s:.1f}",
                  "time?": f"{int(self._flight_time())}s", "height?": f"{self.height_cm // 10}dm",
                  "tof?": f"{self.height_cm * 10 + 100}mm", "temp?": "60~62C",
                  "attitude?": f"pitch:0;roll:0;yaw:{self.yaw};", "baro?": "0.000000",
                  "wifi?": "90", "sdk?": "20", "sn?": "0TQEMULATOR0001"}
        return str(values.get(word, "error Unknown command"))

    def _flight_time(self) -> float:
        extra = time.monotonic() - self._took_off_at if self._took_off_at is not None else 0.0
        return self.flight_time_s + extra

    def state_packet(self) -> bytes:
        with self._lock:
            t = self._flight_time()
            bat = max(0, self.battery - int(t / 30))   # ~1 % per 30 s of flight
            h = self.height_cm
            text = (f"mid:-1;x:-100;y:-100;z:-100;mpry:0,0,0;pitch:0;roll:0;yaw:{self.yaw};"
                    f"vgx:0;vgy:0;vgz:0;templ:60;temph:62;tof:{h + 10 if h else 10};h:{h};"
                    f"bat:{bat};baro:{h / 100:.2f};time:{int(t)};agx:0.00;agy:0.00;"
                    f"agz:-1000.00;\r\n")
        return text.encode("ascii")

    # -- threads ---------------------------------------------------------------------------

    def _receive_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                data, src = self._sock.recvfrom(1024)
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            command = data.decode("utf-8", errors="replace").strip()
            record = CommandRecord(command, time.monotonic(), source=src)
            self.log.append(record)
            if self.verbose:
                print(f"[tello-emulator] <- {command!r} from {src[0]}:{src[1]}", file=sys.stderr,
                      flush=True)
            if command.startswith("rc "):
                continue  # joystick input: no reply
            if command == "emergency" and self.sdk_mode:
                with self._lock:
                    self._land()  # motors off at once, whatever is in progress
                self._reply(record, "ok")
                continue
            with self._lock:
                busy = self._busy
                if not busy:
                    self._busy = True
            if busy:
                self.overlaps += 1
                self._reply(record, "error Busy")
                continue
            self._queue.put(record)

    def _work_loop(self) -> None:
        while not self._stop.is_set():
            try:
                record = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            command = record.command
            word = command.split(" ", 1)[0]
            error = self._check(command)
            if error is None and word in self.error_replies:
                error = self.error_replies[word]
            if error is None:
                if self._stop.wait(self.duration(command)):
                    return
                reply = self._apply(command)
                if word == "command" and record.source is not None:
                    self._client = (record.source[0], record.source[1])
            else:
                reply = error
            with self._lock:
                self._busy = False
            if word in self.no_reply_to:
                if self.verbose:
                    print(f"[tello-emulator] (reply {reply!r} to {command!r} dropped)",
                          file=sys.stderr, flush=True)
                continue
            self._reply(record, reply)

    def _reply(self, record: CommandRecord, reply: str) -> None:
        record.replied, record.reply = time.monotonic(), reply
        try:
            self._sock.sendto(reply.encode("ascii"), record.source)
        except OSError:
            pass
        if self.verbose:
            print(f"[tello-emulator] -> {reply!r} ({record.command!r}, "
                  f"{record.replied - record.received:.2f} s)", file=sys.stderr, flush=True)

    def _state_loop(self) -> None:
        period = 1.0 / self.state_hz
        out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            while not self._stop.wait(period):
                if not self.sdk_mode or self._client is None or not self.state_port:
                    continue
                target = (self.state_host or self._client[0], int(self.state_port))
                try:
                    out.sendto(self.state_packet(), target)
                    self.state_packets_sent += 1
                except OSError:
                    pass
        finally:
            out.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Tello SDK emulator on UDP (see tools/README.md)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8889, help="command port; 0 = any free port")
    ap.add_argument("--state-port", type=int, default=8890,
                    help="client port to stream state to (default 8890, as a Tello)")
    ap.add_argument("--state-host", default=None,
                    help="address to stream state to (default: whoever sent `command`)")
    ap.add_argument("--speed", type=float, default=50.0, help="translation speed, cm/s (10-100)")
    ap.add_argument("--fixed", type=float, default=1.0, help="per-motion overhead, s")
    ap.add_argument("--turn-rate", type=float, default=90.0, help="rotation rate, deg/s")
    ap.add_argument("--takeoff", type=float, default=5.0, help="takeoff duration, s")
    ap.add_argument("--land", type=float, default=4.0, help="landing duration, s")
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="multiply every duration (0.1 = ten times faster than a drone)")
    ap.add_argument("--state-hz", type=float, default=10.0)
    ap.add_argument("--quiet", action="store_true", help="do not log commands to stderr")
    args = ap.parse_args(argv)
    try:
        emu = TelloEmulator(args.host, args.port, args.state_port, state_host=args.state_host,
                            speed_cm_s=args.speed, fixed_s=args.fixed, turn_deg_s=args.turn_rate,
                            takeoff_s=args.takeoff, land_s=args.land, time_scale=args.time_scale,
                            state_hz=args.state_hz, verbose=not args.quiet).start()
    except (ValueError, OSError) as err:
        print(f"tello-emulator: {err}", file=sys.stderr)
        return 2
    print(f"tello-emulator listening on {args.host}:{emu.port} (state -> client port "
          f"{args.state_port}, time_scale {args.time_scale})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        emu.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
