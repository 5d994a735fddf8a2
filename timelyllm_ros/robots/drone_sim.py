"""Backend `drone-sim`: a simulated drone in a scene (robots/scene.py) that executes MiniSpec's
low-level skills, so that plans observe what they would observe in flight.

`SimDrone` is the interpreter's SkillRuntime (core/skills/interpreter.py):

- motions change the pose: move_* by cm along the heading, turn_cw / turn_ccw by degrees,
  takeoff / land (takeoff while flying is a no-op; motions while landed fail, as on a Tello);
- is_visible, object_x, object_y, object_width, object_height answer from the pose and the
  field of view (False when the object is not in view), so TypeFly's sweeping (defined in
  MiniSpec: turn 45 degrees until `iv` is True) stops when the object comes into view, and
  orienting turns until `ox` is in 0.4..0.6;
- query answers from the scene's `answers`, else with the name of the visible object nearest
  the image centre whose name or tags appear in the question (`'what's the edible target?'`
  finds an object tagged `edible`), else False;
- log and picture record what they were given / saw.

Arguments out of the simulated Tello's ranges (20-500 cm per move, 1-360 degrees per turn,
like the real SDK) fail the call. Time is virtual: each call advances `now()` by the
execution-time model's nominal duration (or a sampled one with `jitter`), and, with
`time_scale > 0`, also sleeps that long times `time_scale` (an executor that should take
time), ending early when `stop` is set.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Sequence

import numpy as np

from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.core.skills.interpreter import (InterpreterLimits, SkillFailure,
                                                   TaskInterpreter)
from timelyllm_ros.core.skills.minispec import MINISPEC
from timelyllm_ros.core.skills.values import Value, format_value
from timelyllm_ros.robots.scene import Scene

MOVE_RANGE_CM = (20, 500)
TURN_RANGE_DEG = (1, 360)
_MOVES = {"move_forward": (0, 1), "move_backward": (0, -1), "move_right": (1, 0),
          "move_left": (-1, 0)}
_VISION = {"object_x": "x", "object_y": "y", "object_width": "width", "object_height": "height"}


def _amount(name: str, args: tuple, lo: float, hi: float, unit: str) -> float:
    if len(args) != 1 or isinstance(args[0], bool) or not isinstance(args[0], (int, float)):
        raise SkillFailure(f"{name}: needs one number, got {', '.join(map(format_value, args))}")
    v = float(args[0])
    if not lo <= v <= hi:
        raise SkillFailure(f"{name}: argument {format_value(args[0])} out of range "
                           f"{lo:g}-{hi:g} {unit}")
    return v


class SimDrone:
    """A drone in a Scene; the interpreter's SkillRuntime. Not thread-safe (one task at a time,
    as on a real drone)."""

    SKILLS = ("takeoff", "land", "move_forward", "move_backward", "move_left", "move_right",
              "move_up", "move_down", "turn_cw", "turn_ccw", "delay", "is_visible", "object_x",
              "object_y", "object_width", "object_height", "log", "picture", "query")

    def __init__(self, scene: Scene | None = None, model: ExecutionTimeModel | None = None, *,
                 jitter: bool = False, seed: int = 0, time_scale: float = 0.0,
                 stop: threading.Event | None = None,
                 move_range: tuple[float, float] = MOVE_RANGE_CM,
                 turn_range: tuple[float, float] = TURN_RANGE_DEG):
        self.scene = (scene or Scene()).copy()
        self.model = model or ExecutionTimeModel.from_yaml()
        self.jitter = jitter
        self.time_scale = float(time_scale)
        self.move_range = move_range
        self.turn_range = turn_range
        self._rng = np.random.default_rng(seed)
        self._stop = stop or threading.Event()
        self.clock = 0.0
        self.history: list[tuple[str, tuple, Value]] = []
        self.logged: list[str] = []
        self.pictures: list[list[str]] = []
        self.safe_stops = 0

    # -- SkillRuntime ------------------------------------------------------------------------

    def now(self) -> float:
        return self.clock

    def safe_stop(self) -> None:
        """Hover where it is (the simulated drone has nothing in flight to stop)."""
        self.safe_stops += 1

    def check_call(self, name: str, args: tuple) -> None:
        if name not in self.SKILLS:
            raise SkillFailure(f"the simulated drone has no skill {name!r}")
        if name in _MOVES or name in ("move_up", "move_down"):
            _amount(name, args, *self.move_range, "cm")
        elif name in ("turn_cw", "turn_ccw"):
            _amount(name, args, *self.turn_range, "degrees")
        elif name == "delay":
            _amount(name, args, 0, 600_000, "ms")

    def call(self, name: str, args: tuple) -> Value:
        self.check_call(name, args)
        value = getattr(self, "_" + name)(*args)
        self._spend(name, args)
        self.history.append((name, tuple(args), value))
        return value

    # -- skills ------------------------------------------------------------------------------

    def _need_flying(self, name: str) -> None:
        if not self.scene.pose.flying:
            raise SkillFailure(f"{name}: not flying (take off first)")

    def _takeoff(self) -> bool:
        p = self.scene.pose
        p.flying, p.z = True, max(p.z, 80.0)
        return True

    def _land(self) -> bool:
        self._need_flying("land")
        self.scene.pose.flying, self.scene.pose.z = False, 0.0
        return True

    def _translate(self, name: str, cm: float) -> None:
        self._need_flying(name)
        sx, sf = _MOVES[name]
        p = self.scene.pose
        (fx, fy), (rx, ry) = p.forward(), p.right()
        p.x += cm * (sf * fx + sx * rx)
        p.y += cm * (sf * fy + sx * ry)

    def _move_forward(self, cm):
        self._translate("move_forward", cm)

    def _move_backward(self, cm):
        self._translate("move_backward", cm)

    def _move_left(self, cm):
        self._translate("move_left", cm)

    def _move_right(self, cm):
        self._translate("move_right", cm)

    def _move_up(self, cm):
        self._need_flying("move_up")
        self.scene.pose.z += cm

    def _move_down(self, cm):
        self._need_flying("move_down")
        self.scene.pose.z = max(10.0, self.scene.pose.z - cm)

    def _turn_cw(self, deg):
        self._need_flying("turn_cw")
        self.scene.pose.heading = (self.scene.pose.heading + deg) % 360

    def _turn_ccw(self, deg):
        self._need_flying("turn_ccw")
        self.scene.pose.heading = (self.scene.pose.heading - deg) % 360

    def _delay(self, ms):
        return None

    def _is_visible(self, obj) -> bool:
        found = self.scene.find(str(obj))
        return found is not None and self.scene.view(found).visible

    def _vision(self, obj, attr: str) -> float | bool:
        found = self.scene.find(str(obj))
        if found is None:
            return False
        view = self.scene.view(found)
        return round(getattr(view, attr), 3) if view.visible else False

    def _object_x(self, obj):
        return self._vision(obj, "x")

    def _object_y(self, obj):
        return self._vision(obj, "y")

    def _object_width(self, obj):
        return self._vision(obj, "width")

    def _object_height(self, obj):
        return self._vision(obj, "height")

    def _log(self, text) -> None:
        self.logged.append(text if isinstance(text, str) else format_value(text))

    def _picture(self) -> str:
        self.pictures.append([o.name for o, _ in self.scene.visible_objects()])
        return f"picture_{len(self.pictures)}"

    def _query(self, question) -> Any:
        q = str(question)
        if q in self.scene.answers:
            return self.scene.answers[q]
        words = set(re.findall(r"[a-z]+", q.lower()))
        for obj, _ in self.scene.visible_objects():
            names = {obj.name.lower(), obj.name.split("_")[0].lower(), *obj.tags}
            if names & words:
                return obj.name
        return False

    # -- time --------------------------------------------------------------------------------

    def duration(self, name: str, args: Sequence) -> float:
        call = SkillCall(name, tuple(format_value(a) if not isinstance(a, str) else a
                                     for a in args))
        if self.jitter:
            return self.model.sample(call, self._rng)
        return self.model.model_for(name).nominal(call.args)

    def _spend(self, name: str, args: Sequence) -> None:
        d = self.duration(name, args)
        self.clock += d
        if self.time_scale > 0 and self._stop.wait(d * self.time_scale):
            raise SkillFailure(f"{name}: stopped (segment cancelled or executor shutting down)")


class SimDroneBackend:
    """SkillBackend for the executor: `runtime` (a SimDrone) for the interpreter, `execute`
    for the older flat-call path (each call once, in order, no control flow)."""

    def __init__(self, drone: SimDrone, limits: InterpreterLimits = InterpreterLimits()):
        self.runtime = drone
        self.limits = limits

    def interpreter(self) -> TaskInterpreter:
        """A fresh per-task interpreter on this drone."""
        return TaskInterpreter(MINISPEC, self.runtime, self.limits)

    def execute(self, calls: Sequence[SkillCall]) -> tuple[bool, str]:
        # Full skill names are valid MiniSpec call names, and wire arguments are MiniSpec
        # values, so the flat calls are run as a one-off MiniSpec segment.
        text = ";".join(",".join([c.name, *c.args]) for c in calls)
        outcome = self.interpreter().run_segment(text)
        if not outcome.success:
            return False, f"drone-sim: {outcome.message}"
        return True, (f"drone-sim: {len(outcome.calls_executed)} call(s), "
                      f"{outcome.duration_s:.2f} s simulated")
