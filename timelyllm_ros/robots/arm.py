"""Arm backends for the executor node: LLM^3-style skill calls -> your arm driver.

Bind your arm by subclassing `ArmDriver` (four blocking methods, see below) and handing it to
`ArmBackend`, which implements the executor's SkillBackend: it checks a segment's calls (known
skill, argument count, numeric coordinates) before moving anything, then dispatches them in
order and reports the first failure:

    class MyArm(ArmDriver):
        def pick(self, obj): ...            # grasp obj; return when done, raise on failure
        def place(self, obj, target): ...   # put the held obj on/at target
        def move(self, x, y, z): ...        # move the end effector (your units/frame)
        def check(self, obj): ...           # True if obj is where the plan expects it

    node = ExecutorNode(backend=ArmBackend(MyArm()))

`check` returning False fails the segment (`fail_on_check=False` only notes it in the report).
Raising an exception in any method fails the segment with its message; the executor node
never crashes on a driver error.

`SimulatedArmDriver` stands in for an arm (backend kind `arm-sim`). Each call sleeps for a
duration from the execution-time model (config/exec_model.yaml): pick 4.0 s, place 4.0 s,
move 2.0 s, check 1.0 s, each times a lognormal jitter (sigma 0.15, median 1) unless
`jitter=False`, all times `time_scale`. It tracks which object the gripper holds and where
each placed object is, so impossible plans fail as they would on a real arm (`strict`):
placing an object that is not held, picking while holding another one, picking an object
listed as `unreachable`.
"""

from __future__ import annotations

import abc
import math
import threading
import time
from typing import Iterable, Sequence

import numpy as np

from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.skills.arm import ARM, ARM_SKILLS
from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.core.skills.interpreter import TaskInterpreter


class ArmError(RuntimeError):
    """A driver could not do what was asked (the message goes into the execution report)."""


class ArmDriver(abc.ABC):
    """What a real arm must offer. Methods block until the motion is done; raise on failure."""

    @abc.abstractmethod
    def pick(self, obj: str) -> None: ...

    @abc.abstractmethod
    def place(self, obj: str, target: str) -> None: ...

    @abc.abstractmethod
    def move(self, x: float, y: float, z: float) -> None: ...

    @abc.abstractmethod
    def check(self, obj: str) -> bool: ...

    def close(self) -> None:
        """Release the hardware (optional)."""

    def stop(self) -> None:
        """Halt the arm now (optional); called from another thread when a segment is cancelled,
        while a method may be running (that method should then raise)."""


def _unquote(arg: str) -> str:
    a = arg.strip()
    if len(a) >= 2 and a[0] == a[-1] and a[0] in "'\"":
        return a[1:-1]
    return a


def _validate(call: SkillCall) -> tuple:
    """Driver arguments for one call; ValueError naming the call if it cannot be executed."""
    kinds = ARM_SKILLS.get(call.name)
    wire = call.to_wire()
    if kinds is None:
        raise ValueError(f"{wire}: unknown arm skill {call.name!r} (known: {', '.join(ARM_SKILLS)})")
    if len(call.args) != len(kinds):
        raise ValueError(f"{wire}: {call.name} takes {len(kinds)} argument(s), got {len(call.args)}")
    out: list = []
    for arg, kind in zip(call.args, kinds):
        if kind == "num":
            try:
                v = float(arg)
            except ValueError:
                raise ValueError(f"{wire}: argument {arg!r} is not a number") from None
            if not math.isfinite(v):
                raise ValueError(f"{wire}: argument {arg!r} is not finite")
            out.append(v)
        else:
            name = _unquote(arg)
            if not name:
                raise ValueError(f"{wire}: empty object name")
            out.append(name)
    return tuple(out)


class ArmBackend:
    """SkillBackend that dispatches pick/place/move/check calls to an ArmDriver."""

    def __init__(self, driver: ArmDriver, *, fail_on_check: bool = True,
                 stop: threading.Event | None = None):
        if not isinstance(driver, ArmDriver):
            raise TypeError(f"driver: expected an ArmDriver, got {type(driver).__name__}")
        self.driver = driver
        self.fail_on_check = fail_on_check
        self._stop = stop or threading.Event()
        # For the plan interpreter (core/skills/interpreter.py): TaskInterpreter(ARM, runtime).
        self.runtime = ArmRuntime(driver, fail_on_check=fail_on_check)

    def interpreter(self) -> TaskInterpreter:
        """A fresh per-task interpreter of the arm language on this arm."""
        return TaskInterpreter(ARM, self.runtime)

    def execute(self, calls: Sequence[SkillCall]) -> tuple[bool, str]:
        started = time.monotonic()
        try:
            plan = [(c, _validate(c)) for c in calls]
        except ValueError as err:
            return False, f"arm: {err} (nothing executed)"
        notes: list[str] = []
        for done, (call, args) in enumerate(plan):
            if self._stop.is_set():
                return False, "arm: executor shutting down"
            try:
                result = getattr(self.driver, call.name)(*args)
            except Exception as err:  # noqa: BLE001 - any driver failure becomes a report
                return False, (f"arm: {call.to_wire()}: {err or type(err).__name__} "
                               f"(after {done} of {len(plan)} call(s))")
            if call.name == "check":
                if not result and self.fail_on_check:
                    return False, (f"arm: {call.to_wire()} returned False "
                                   f"(after {done} of {len(plan)} call(s))")
                notes.append(f"{call.to_wire()}={bool(result)}")
        took = time.monotonic() - started
        msg = f"arm: {len(plan)} call(s) in {took:.2f} s"
        return True, msg + ("; " + "; ".join(notes) if notes else "")

    def cancel(self) -> None:
        """The executor cancelled the running segment: halt the arm."""
        self.driver.stop()

    def close(self) -> None:
        self.driver.close()


class SimulatedArmDriver(ArmDriver):
    """An arm that takes the modelled time and keeps a minimal world state (see module doc)."""

    def __init__(self, model: ExecutionTimeModel | None = None, *, time_scale: float = 1.0,
                 seed: int | None = 0, jitter: bool = True, strict: bool = True,
                 unreachable: Iterable[str] = (), stop: threading.Event | None = None,
                 objects: Iterable[str] | None = None):
        if not time_scale > 0:
            raise ValueError(f"time_scale: must be > 0, got {time_scale}")
        self.model = model or ExecutionTimeModel.from_yaml()
        self.time_scale = float(time_scale)
        self.jitter = jitter
        self.strict = strict
        self.unreachable = set(unreachable)
        # The arm's scene: the objects on the table (None: any name is taken to exist).
        self.objects = None if objects is None else set(objects)
        self.clock = 0.0                          # simulated seconds spent so far
        self._rng = np.random.default_rng(seed)
        self._stop = stop or threading.Event()
        self.held: str | None = None
        self.locations: dict[str, str] = {}      # object -> what it was placed on
        self.position: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self.calls: list[tuple[str, tuple, float]] = []   # (skill, args, seconds slept)

    def duration(self, name: str, args: Sequence[str] = ()) -> float:
        """Seconds one call takes (already times time_scale); sampled when jitter is on."""
        call = SkillCall(name, tuple(str(a) for a in args))
        base = (self.model.sample(call, self._rng) if self.jitter
                else self.model.model_for(name).nominal(call.args))
        return base * self.time_scale

    def _spend(self, name: str, args: tuple) -> None:
        d = self.duration(name, args)
        self.calls.append((name, args, d))
        self.clock += d / self.time_scale   # simulated seconds, whatever the time scale
        if self._stop.wait(d):
            raise ArmError("interrupted: executor shutting down")

    def _present(self, *names: str) -> None:
        for name in names:
            if self.objects is not None and name not in self.objects:
                raise ArmError(f"no object {name!r} in the arm's scene "
                               f"(there: {', '.join(sorted(self.objects)) or 'nothing'})")

    def pick(self, obj: str) -> None:
        self._spend("pick", (obj,))
        self._present(obj)
        if obj in self.unreachable:
            raise ArmError(f"cannot reach {obj!r}")
        if self.strict and self.held is not None and self.held != obj:
            raise ArmError(f"gripper already holds {self.held!r}")
        self.held = obj
        self.locations.pop(obj, None)

    def place(self, obj: str, target: str) -> None:
        self._spend("place", (obj, target))
        self._present(obj, target)
        if self.strict and self.held != obj:
            raise ArmError(f"not holding {obj!r} (holding {self.held!r})")
        if obj == target:
            raise ArmError(f"cannot place {obj!r} on itself")
        self.held = None
        self.locations[obj] = target

    def move(self, x: float, y: float, z: float) -> None:
        self._spend("move", (x, y, z))
        self.position = (float(x), float(y), float(z))

    def check(self, obj: str) -> bool:
        self._spend("check", (obj,))
        if self.objects is not None and obj not in self.objects:
            return False
        # The object is in a settled place (not dangling in the gripper).
        return self.held != obj


class ArmRuntime:
    """The interpreter's SkillRuntime (core/skills/interpreter.py) over an ArmDriver: a
    driver's exception fails the call with its message; `check` returning False fails it too
    (unless `fail_on_check=False`, when the value False is simply returned)."""

    def __init__(self, driver: ArmDriver, *, fail_on_check: bool = True):
        self.driver = driver
        self.fail_on_check = fail_on_check

    def now(self) -> float:
        clock = getattr(self.driver, "clock", None)
        return float(clock) if clock is not None else time.monotonic()

    def check_call(self, name: str, args: tuple) -> None:
        from timelyllm_ros.core.skills.interpreter import SkillFailure

        try:
            _validate(SkillCall(name, tuple(str(a) for a in args)))
        except ValueError as err:
            raise SkillFailure(str(err)) from None

    def call(self, name: str, args: tuple):
        from timelyllm_ros.core.skills.interpreter import SkillFailure

        self.check_call(name, args)
        try:
            result = getattr(self.driver, name)(*args)
        except Exception as err:  # noqa: BLE001 - any driver failure fails the call
            raise SkillFailure(str(err) or type(err).__name__) from None
        if name == "check":
            if not result and self.fail_on_check:
                raise SkillFailure(f"check({args[0]}) returned False")
            return bool(result)
        return None

    def safe_stop(self) -> None:
        self.driver.stop()
