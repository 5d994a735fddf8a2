"""The one interface every robot backend implements, and the executor node drives."""

from __future__ import annotations

import threading
from typing import Protocol, Sequence, runtime_checkable

from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.core.skills.interpreter import TaskInterpreter


class SkillBackend(Protocol):
    """What "executing a segment" means on one robot.

    `execute` must not raise: a failure of the robot (or of its link) is a result, reported to
    the planner as an unsuccessful segment, not an exception that would stop the executor.
    A backend that holds resources (sockets, threads) may also have `close()`; the executor
    calls it on shutdown when present.

    Stopping: backends are built with a `stop` object (an Event, or the executor's
    `StopSignal`) and check or wait on it while they work; it is set when the executor shuts
    down and when the running segment is cancelled, and `execute` then returns (False, ...)
    soon. A backend that must also tell the hardware (a Tello hovers with `stop`) has
    `cancel()`, which the executor calls right after setting the signal.
    """

    def execute(self, calls: Sequence[SkillCall]) -> tuple[bool, str]:
        """Run the calls to completion; return (success, message)."""

    def cancel(self) -> None:
        """Optional: stop the robot now (called from another thread while `execute` runs)."""


@runtime_checkable
class InterpretingBackend(Protocol):
    """A backend that runs plans with the skill language's semantics (loops, conditionals,
    variables across a task's segments, returns): the executor keeps one interpreter per task
    and runs each segment's text through it, instead of the flat `calls` list."""

    def interpreter(self) -> TaskInterpreter:
        """A fresh interpreter for one task on this robot."""


class StopSignal:
    """The `stop` a backend waits on, for an executor that can cancel one segment.

    Set for good by `set()` (the executor shuts down), or for the running segment only by
    `cancel_segment()` until `rearm()` (the executor rearms it before each segment, under its
    own lock, so a cancel can never be lost or leak into the next segment). Offers the
    `threading.Event` methods backends use: `is_set()`, `wait(timeout)`, `set()`.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shutdown = False
        self._cancelled = False

    def is_set(self) -> bool:
        return self._shutdown or self._cancelled

    def wait(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(self.is_set, timeout)

    def set(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def cancel_segment(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def rearm(self) -> None:
        with self._cond:
            self._cancelled = False

    @property
    def shutting_down(self) -> bool:
        return self._shutdown
