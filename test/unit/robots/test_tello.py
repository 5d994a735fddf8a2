"""Tello backend vs the protocol emulator (tools/tello_emulator.py) on loopback UDP.

Durations are scaled down (the emulator's time_scale and the client's expected timings alike),
so timing checks compare ratios and lower bounds with generous slack, never exact times.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time

import pytest

from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.robots.tello.backend import TelloBackend
from timelyllm_ros.robots.tello.sdk import TelloError, parse_state
from timelyllm_ros.robots.tello.timings import TelloTimings
from timelyllm_ros.robots.tello.translate import (
    LocalStep,
    SdkStep,
    SleepStep,
    SweepStep,
    TranslationError,
    split_amount,
    translate,
)
from timelyllm_ros.ros_env import REPO_ROOT

SCALE = 0.05
EMULATOR_PATH = REPO_ROOT / "tools" / "tello_emulator.py"


def _load_emulator_module():
    name = "tello_emulator"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EMULATOR_PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


TelloEmulator = _load_emulator_module().TelloEmulator


def C(name, *args):
    return SkillCall(name, tuple(str(a) for a in args))


def scaled_timings(scale: float) -> TelloTimings:
    t = TelloTimings()
    return TelloTimings(speed_cm_s=t.speed_cm_s / scale, fixed_s=t.fixed_s * scale,
                        turn_deg_s=t.turn_deg_s / scale, turn_fixed_s=t.turn_fixed_s * scale,
                        takeoff_s=t.takeoff_s * scale, land_s=t.land_s * scale,
                        other_s=t.other_s * scale)


def sdk(steps):
    return [s.command for s in steps if isinstance(s, SdkStep)]


@pytest.fixture
def emulator():
    emu = TelloEmulator("127.0.0.1", 0, state_port=None, time_scale=SCALE).start()
    yield emu
    emu.stop()


def make_backend(emu, **kw):
    kw.setdefault("timings", scaled_timings(SCALE))
    kw.setdefault("timeout_margin_s", 2.0)   # generous: the machine is shared
    kw.setdefault("keepalive_s", None)
    backend = TelloBackend("127.0.0.1", emu.port, state_port=0, local_port=0, **kw)
    emu.state_port = backend.state_port
    return backend


@pytest.fixture
def tello(emulator):
    backend = make_backend(emulator)
    yield backend
    backend.close()


def commands(emu):
    return [r.command for r in emu.log]


# --- translation (no sockets) --------------------------------------------------------------

def test_skill_to_sdk_mapping():
    assert sdk(translate(C("takeoff"))) == ["takeoff"]
    assert sdk(translate(C("land"))) == ["land"]
    for name, word in [("move_forward", "forward"), ("move_backward", "back"),
                       ("move_left", "left"), ("move_right", "right"), ("move_up", "up"),
                       ("move_down", "down")]:
        assert sdk(translate(C(name, 120))) == [f"{word} 120"]
    assert sdk(translate(C("turn_cw", 90))) == ["cw 90"]
    assert sdk(translate(C("turn_ccw", 45))) == ["ccw 45"]
    assert sdk(translate(C("approach"))) == ["forward 120"]
    # Negative arguments mean the opposite direction.
    assert sdk(translate(C("move_forward", -50))) == ["back 50"]
    assert sdk(translate(C("turn_cw", -30))) == ["ccw 30"]
    assert translate(C("delay", 250)) == [SleepStep(0.25, "delay(250)")]
    assert isinstance(translate(C("sweeping", "bottle"))[0], SweepStep)
    for name in ("is_visible", "object_x", "picture", "log", "query", "orienting"):
        steps = translate(C(name, "bottle") if name != "picture" else C(name))
        assert len(steps) == 1 and isinstance(steps[0], LocalStep), name


def test_out_of_range_arguments_are_split_or_rounded():
    assert sdk(translate(C("move_forward", 1200))) == ["forward 400"] * 3
    assert sdk(translate(C("move_up", 510))) == ["up 255", "up 255"]
    assert sdk(translate(C("move_forward", 500))) == ["forward 500"]
    assert sdk(translate(C("move_left", 10))) == ["left 20"]     # rounded up to the SDK minimum
    assert sdk(translate(C("move_left", 0))) == []
    assert sdk(translate(C("turn_cw", 720))) == ["cw 360", "cw 360"]
    assert sdk(translate(C("turn_ccw", 400))) == ["ccw 200", "ccw 200"]
    for total, lo, hi in [(501, 20, 500), (1999, 20, 500), (361, 1, 360), (7, 20, 500)]:
        parts = split_amount(total, lo, hi)
        assert all(lo <= p <= hi for p in parts)
        assert sum(parts) == max(total, lo)


def test_untranslatable_calls_are_rejected():
    with pytest.raises(TranslationError, match="not a number"):
        translate(C("move_forward", "_1"))
    with pytest.raises(TranslationError, match="missing argument"):
        translate(C("turn_cw"))
    with pytest.raises(TranslationError, match="unknown drone skill"):
        translate(C("backflip"))


def test_parse_state_packet():
    s = parse_state(b"mid:-1;x:-100;y:-100;z:-100;mpry:0,0,0;pitch:0;roll:0;yaw:-45;vgx:0;"
                    b"vgy:0;vgz:0;templ:60;temph:62;tof:90;h:80;bat:87;baro:12.34;time:3;"
                    b"agx:0.00;agy:0.00;agz:-1000.00;\r\n")
    assert s["bat"] == 87 and s["h"] == 80 and s["tof"] == 90 and s["yaw"] == -45
    assert s["baro"] == pytest.approx(12.34) and s["mpry"] == (0, 0, 0)
    assert parse_state("garbage;;bat:5") == {"bat": 5}


# --- against the emulator ------------------------------------------------------------------

def test_commands_are_strictly_sequential(tello, emulator):
    calls = [C("takeoff"), C("move_forward", 50), C("turn_cw", 90), C("move_backward", 30),
             C("land")]
    ok, msg = tello.execute(calls)
    assert ok, msg
    assert commands(emulator) == ["command", "takeoff", "forward 50", "cw 90", "back 30", "land"]
    assert emulator.overlaps == 0
    log = emulator.log
    for prev, cur in zip(log, log[1:]):
        assert prev.replied is not None and cur.received >= prev.replied, (prev, cur)
    # Each command was answered only after its modelled duration.
    for rec in log:
        assert rec.reply == "ok"
        assert rec.replied - rec.received >= 0.9 * emulator.duration(rec.command), rec
    assert [r.reply for r in tello.history] == ["ok"] * 6


def _timed(backend, calls):
    t0 = time.monotonic()
    ok, msg = backend.execute(calls)
    assert ok, msg
    return time.monotonic() - t0


def test_durations_follow_the_emulator_model(emulator):
    emulator.time_scale = 0.1
    backend = make_backend(emulator, timings=scaled_timings(0.1))
    try:
        assert backend.execute([C("takeoff")])[0]
        # Best of two runs: the machine is shared, so single timings are noisy.
        short = min(_timed(backend, [C("move_forward", 50)]) for _ in range(2))
        long = min(_timed(backend, [C("move_forward", 200)]) for _ in range(2))
        turn = min(_timed(backend, [C("turn_cw", 180)]) for _ in range(2))
    finally:
        backend.close()
    # Model: (1.0 + 50/50) s = 2.0 s and (1.0 + 200/50) s = 5.0 s, times 0.1; turn 1.0 + 2.0 s.
    exp_short, exp_long, exp_turn = 0.2, 0.5, 0.3
    assert short >= 0.9 * exp_short and long >= 0.9 * exp_long and turn >= 0.9 * exp_turn
    assert short < exp_short + 0.6 and long < exp_long + 0.6 and turn < exp_turn + 0.6
    ratio = long / short
    assert 1.7 < ratio < 3.5, (short, long)


def test_long_moves_are_split_and_each_part_waits(tello, emulator):
    ok, msg = tello.execute([C("takeoff"), C("move_forward", 1200), C("move_up", 10)])
    assert ok, msg
    assert commands(emulator)[2:] == ["forward 400", "forward 400", "forward 400", "up 20"]
    assert emulator.overlaps == 0
    assert "5 SDK command(s)" in msg


def test_error_reply_fails_the_segment_with_the_reply(tello, emulator):
    ok, msg = tello.execute([C("move_forward", 50)])     # not flying yet
    assert not ok
    assert "Not joystick" in msg and "move_forward(50)" in msg
    ok, msg = tello.execute([C("takeoff"), C("turn_cw", 90), C("move_left", 40), C("land")])
    assert ok, msg
    emulator.error_replies["takeoff"] = "error Motor stop"
    ok, msg = tello.execute([C("takeoff"), C("move_forward", 50)])
    assert not ok and "Motor stop" in msg and "after 0 of 2" in msg
    assert "forward 50" not in commands(emulator)[-2:], "nothing is sent after a failure"
    del emulator.error_replies["takeoff"]
    assert tello.execute([C("takeoff")])[0]
    with pytest.raises(TelloError, match="Out of range"):
        tello.send_command("forward 600")


def test_bad_argument_fails_before_anything_moves(tello, emulator):
    ok, msg = tello.execute([C("takeoff"), C("move_forward", "_2")])
    assert not ok and "nothing executed" in msg
    assert commands(emulator) == []


def test_motion_timeout_fails_without_retry(emulator):
    backend = make_backend(emulator, timeout_factor=1.5, timeout_margin_s=0.3)
    try:
        assert backend.execute([C("takeoff")])[0]
        emulator.no_reply_to.add("forward")
        t0 = time.monotonic()
        ok, msg = backend.execute([C("move_forward", 50), C("turn_cw", 90)])
        took = time.monotonic() - t0
        assert not ok
        assert "no reply" in msg and "not retried" in msg
        assert took < 5.0
        assert commands(emulator).count("forward 50") == 1, "motion must not be re-sent"
        assert "cw 90" not in commands(emulator)
        # The link still works afterwards.
        emulator.no_reply_to.clear()
        ok, msg = backend.execute([C("turn_cw", 90)])
        assert ok, msg
    finally:
        backend.close()


def test_command_is_retried_on_timeout(emulator):
    emulator.no_reply_to.add("command")
    backend = make_backend(emulator, timeout_margin_s=0.2, retries=2)
    try:
        ok, msg = backend.execute([C("takeoff")])
        assert not ok and "SDK mode" in msg and "3 attempts" in msg
        assert commands(emulator) == ["command"] * 3
    finally:
        backend.close()


def test_state_is_parsed_into_latest_dict(tello, emulator):
    assert tello.state == {}
    assert tello.execute([C("takeoff"), C("turn_cw", 90)])[0]
    state = tello.wait_for_state(3.0)
    assert {"bat", "h", "tof", "yaw", "pitch", "roll"} <= set(state)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and not (tello.state.get("h") == 80
                                               and tello.state.get("yaw") == 90):
        time.sleep(0.05)
    assert tello.state["h"] == 80 and tello.state["yaw"] == 90
    assert tello.state_age_s is not None and tello.state_age_s < 1.0


def test_local_skills_send_no_motion(tello, emulator):
    assert tello.execute([C("takeoff")])[0]
    before = len(emulator.log)
    t0 = time.monotonic()
    ok, msg = tello.execute([C("is_visible", "bottle"), C("log", "'hi'"), C("picture"),
                             C("query", "'what?'"), C("orienting", "bottle"), C("delay", 200)])
    assert ok, msg
    assert time.monotonic() - t0 >= 0.19            # the delay is a local sleep
    assert len(emulator.log) == before
    assert "unknown (no detector)" in msg


def test_sweeping_turns_until_the_detector_sees_the_object(emulator):
    seen = iter([False, False, True])
    backend = make_backend(emulator, detector=lambda obj: next(seen))
    try:
        ok, msg = backend.execute([C("takeoff"), C("sweeping", "bottle")])
        assert ok, msg
        assert commands(emulator)[2:] == ["cw 45", "cw 45"]
        assert "sweeping(bottle)=True" in msg
    finally:
        backend.close()


def test_stop_aborts_a_command_in_flight(emulator):
    stop = threading.Event()
    emulator.time_scale = 1.0
    backend = make_backend(emulator, stop=stop)
    try:
        threading.Timer(0.3, stop.set).start()
        t0 = time.monotonic()
        ok, msg = backend.execute([C("takeoff")])       # 5 s on the emulator
        assert not ok and "stopped" in msg
        assert time.monotonic() - t0 < 2.0
    finally:
        backend.close()


def test_keepalive_does_not_disturb_ordering(emulator):
    backend = make_backend(emulator, keepalive_s=0.2)
    try:
        assert backend.execute([C("takeoff")])[0]
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and commands(emulator).count("command") < 2:
            time.sleep(0.05)
        assert commands(emulator).count("command") >= 2, "keep-alive `command` was sent"
        ok, msg = backend.execute([C("move_forward", 100), C("land")])
        assert ok, msg
        assert emulator.overlaps == 0
    finally:
        backend.close()


def test_emulator_cli_prints_port_and_answers():
    import socket

    proc = subprocess.Popen([sys.executable, str(EMULATOR_PATH), "--port", "0", "--state-port",
                             "0", "--quiet", "--time-scale", "0.01"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() else "")
        port = int(line.split("127.0.0.1:")[1].split()[0])
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(10)
        try:
            replies = []
            for cmd in (b"takeoff", b"command", b"takeoff", b"forward 10", b"battery?"):
                sock.sendto(cmd, ("127.0.0.1", port))
                replies.append(sock.recvfrom(1024)[0].decode())
        finally:
            sock.close()
        assert replies[0].startswith("error") and replies[1] == "ok" and replies[2] == "ok"
        assert replies[3].startswith("error") and replies[4] == "87"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
