"""The Tello under the plan interpreter (robots/tello/runtime.py) against the SDK emulator:
loops and conditionals on the executor, "unknown" vision, range failures, hovering after a
failure, and the emulator's state packets following the commanded motions."""

from __future__ import annotations

import time

from test_tello import commands, emulator  # noqa: F401  (the fixture)
from test_tello import make_backend as make_tello

from timelyllm_ros.core.skills.interpreter import TaskInterpreter
from timelyllm_ros.core.skills.minispec import MINISPEC
from timelyllm_ros.robots.tello.sdk import parse_state


def run(backend, *segments):
    interp = TaskInterpreter(MINISPEC, backend.runtime)
    return [interp.run_segment(s) for s in segments]


def test_loop_and_conditional_run_on_the_executor(emulator):  # noqa: F811
    seen = iter([True, False])
    tello = make_tello(emulator, detector=lambda obj: next(seen))
    try:
        outs = run(tello, "tk;3{tc,30}", "_1=iv,cup;?_1==True{mf,40}",
                   "_2=iv,cup;?_2==True{mb,40}")
        assert all(o.success for o in outs), [o.message for o in outs]
        assert commands(emulator) == ["command", "takeoff", "cw 30", "cw 30", "cw 30",
                                      "forward 40"]
    finally:
        tello.close()


def test_vision_is_unknown_without_a_source_and_conditionals_skip(emulator):  # noqa: F811
    tello = make_tello(emulator)
    try:
        (out,) = run(tello, "tk;_1=iv,cup;_2=ox,cup;?_1==True{mf,40};?_1==False{mb,40};"
                            "?_2>0.5{tc,20};l,_1")
        assert out.success, out.message
        assert str(out.values["_1"]) == "unknown" and str(out.values["_2"]) == "unknown"
        assert commands(emulator) == ["command", "takeoff"]
    finally:
        tello.close()


def test_out_of_range_fails_before_moving_and_dynamic_failures_hover(emulator):  # noqa: F811
    tello = make_tello(emulator)
    try:
        (out,) = run(tello, "tk;mf,600")
        assert not out.success and "out of range 20-500 cm" in out.message
        assert "nothing executed" in out.message and commands(emulator) == []
        (out,) = run(tello, "tk;_1=900;tc,90;mf,_1")
        assert not out.success and "`mf,_1`" in out.message
        deadline = time.monotonic() + 3.0
        while "stop" not in commands(emulator) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert commands(emulator)[-3:] == ["takeoff", "cw 90", "stop"]   # hovers
    finally:
        tello.close()


def test_emulator_state_follows_commanded_motions(emulator):  # noqa: F811
    tello = make_tello(emulator)
    try:
        assert parse_state(emulator.state_packet())["h"] == 0
        (out,) = run(tello, "tk;mu,40;tc,90;tu,30")
        assert out.success, out.message
        state = parse_state(emulator.state_packet())
        assert state["h"] == 120 and state["yaw"] == 60 and state["tof"] == 130
        time.sleep(1.1)
        assert parse_state(emulator.state_packet())["time"] >= 1   # flight time runs
        (out,) = run(tello, "ld")
        assert out.success
        state = parse_state(emulator.state_packet())
        assert state["h"] == 0 and emulator.flying is False
    finally:
        tello.close()
