"""MiniSpec skill calls -> Tello SDK steps (pure: no sockets, no time).

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
not know) raises TranslationError, which is why the backend translates every call of a segment
before it executes any.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from timelyllm_ros.core.skills.base import SkillCall

MIN_MOVE_CM, MAX_MOVE_CM = 20, 500
MIN_TURN_DEG, MAX_TURN_DEG = 1, 360
SWEEP_STEP_DEG, SWEEP_MAX_STEPS = 45, 8
APPROACH_CM = 120

# skill -> (SDK word for a positive argument, SDK word for a negative one)
_MOVES = {"move_forward": ("forward", "back"), "move_backward": ("back", "forward"),
          "move_left": ("left", "right"), "move_right": ("right", "left"),
          "move_up": ("up", "down"), "move_down": ("down", "up")}
_TURNS = {"turn_cw": ("cw", "ccw"), "turn_ccw": ("ccw", "cw")}
VISION_SKILLS = ("is_visible", "object_x", "object_y", "object_width", "object_height")


class TranslationError(ValueError):
    """A skill call that cannot be turned into SDK commands (unknown skill, bad argument)."""


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
    if name in VISION_SKILLS or name in ("orienting", "picture", "take_picture", "log", "query"):
        return [LocalStep(name, tuple(call.args), wire)]
    raise TranslationError(f"{wire}: unknown drone skill {name!r}")


def translate_all(calls: Sequence[SkillCall]) -> list[Step]:
    steps: list[Step] = []
    for c in calls:
        steps.extend(translate(c))
    return steps
