"""The Tello as the plan interpreter's SkillRuntime (core/skills/interpreter.py): loops,
conditionals, variables and high-level skills are interpreted on the executor, and each
low-level skill becomes SDK commands (translate.py) sent one at a time.

Differences from the flat-call path (TelloBackend.execute):

- arguments must be inside the SDK's ranges (20-500 cm per move, 1-360 degrees per turn);
  anything else fails the call, and the interpreter checks every literal argument before the
  segment starts, so `mf,900` fails before the drone moves (the flat path splits long moves);
- vision skills (is_visible, object_x, object_y, object_width, object_height) and query
  return UNKNOWN until a vision source is configured (`detector`, which answers is_visible;
  positions stay UNKNOWN). A comparison with UNKNOWN is False whatever the comparator
  (core/skills/values.py), so `?_1==True{...}`, `?_1==False{...}` and `?_1!=False{...}` all
  skip their block, and TypeFly's sweeping (defined in MiniSpec) turns a full circle and
  returns False;
- after a failure the interpreter calls `safe_stop()`: the SDK's `stop`, the drone hovers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.core.skills.interpreter import SkillFailure
from timelyllm_ros.core.skills.values import UNKNOWN, Value, format_value
from timelyllm_ros.robots.tello.sdk import TelloError, TelloTimeout
from timelyllm_ros.robots.tello.translate import (MAX_MOVE_CM, MAX_TURN_DEG, MIN_MOVE_CM,
                                                  MIN_TURN_DEG, VISION_SKILLS, SdkStep,
                                                  SleepStep, TranslationError, translate)

if TYPE_CHECKING:
    from timelyllm_ros.robots.tello.backend import TelloBackend

_MOTIONS = ("move_forward", "move_backward", "move_left", "move_right", "move_up", "move_down")
_TURNS = ("turn_cw", "turn_ccw")
_LOCAL = ("log", "picture", "take_picture", "query", "delay", "takeoff", "land")


class TelloRuntime:
    def __init__(self, tello: "TelloBackend"):
        self.tello = tello

    def now(self) -> float:
        return time.monotonic()

    def check_call(self, name: str, args: tuple) -> None:
        if name in _MOTIONS or name in _TURNS:
            lo, hi, unit = ((MIN_MOVE_CM, MAX_MOVE_CM, "cm") if name in _MOTIONS
                            else (MIN_TURN_DEG, MAX_TURN_DEG, "degrees"))
            v = args[0] if len(args) == 1 else None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                shown = format_value(v) if len(args) == 1 else f"{len(args)} arguments"
                raise SkillFailure(f"{name}: argument {shown} out of range {lo}-{hi} {unit} "
                                   "(Tello SDK)")
        elif name == "delay":
            if len(args) != 1 or not isinstance(args[0], (int, float)) or args[0] < 0:
                raise SkillFailure("delay: needs a number of ms >= 0")
        elif name not in VISION_SKILLS and name not in _LOCAL:
            raise SkillFailure(f"the Tello has no skill {name!r}")

    def call(self, name: str, args: tuple) -> Value:
        self.check_call(name, args)
        tello = self.tello
        if name in VISION_SKILLS:
            if name == "is_visible" and tello.detector is not None:
                return bool(tello.detector(str(args[0])))
            return UNKNOWN
        if name == "query":
            return UNKNOWN
        if name == "log":
            tello._log.info(f"tello log: {format_value(args[0]) if args else ''}")
            return None
        if name in ("picture", "take_picture"):
            return None
        try:
            steps = translate(SkillCall(name, tuple(str(a) for a in args)))
        except TranslationError as err:
            raise SkillFailure(str(err)) from None
        try:
            if not tello.connected:
                tello.connect()
            for step in steps:
                if tello._stop.is_set():
                    raise SkillFailure(f"{name}: stopped (segment cancelled or executor "
                                       "shutting down)")
                if isinstance(step, SdkStep):
                    tello.send_command(step.command)
                elif isinstance(step, SleepStep) and tello._stop.wait(step.seconds):
                    raise SkillFailure("delay: stopped")
        except TelloError as err:
            if isinstance(err, TelloTimeout):
                tello.mark_disconnected()
            raise SkillFailure(f"{name}: {err}") from None
        return None

    def safe_stop(self) -> None:
        """Hover: the SDK's `stop` (only when connected: a drone never reached is safe)."""
        if self.tello.connected:
            self.tello.cancel()
