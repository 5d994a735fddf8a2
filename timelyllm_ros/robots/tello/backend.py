"""Backend `tello`: a DJI/Ryze Tello executing MiniSpec skill segments over the SDK.

Each segment is translated first, every call of it (translate.py), and only then executed, so
a call that cannot be translated fails the segment before anything moves. The steps are then
run in order over the UDP client (sdk.py): SDK commands one at a time, each waiting for the
drone's reply; delays as local sleeps; sweeps as 45-degree turns until the detector sees the
target; vision, log, picture and query calls locally, without sending anything.

Safety notes: a motion command that times out is not retried (see sdk.py), so the segment
fails with a message saying so, and the operator/planner decides. While connected and idle the
client keeps the drone from auto-landing (keep-alive). The backend never lands the drone on its
own (not on failure, not on shutdown): a plan's `land` call or the operator does.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Sequence

from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.robots.tello.sdk import (DEFAULT_HOST, DEFAULT_PORT, DEFAULT_STATE_PORT,
                                            CommandRecord, TelloAborted, TelloClient, TelloError,
                                            TelloTimeout)
from timelyllm_ros.robots.tello.timings import TelloTimings
from timelyllm_ros.robots.tello.translate import (SWEEP_MAX_STEPS, SWEEP_STEP_DEG, VISION_SKILLS,
                                                  LocalStep, SdkStep, SleepStep, SweepStep,
                                                  TranslationError, translate)


class TelloBackend(TelloClient):
    """Executor SkillBackend for one Tello: the SDK client plus skill execution. Thread-safe;
    `execute` never raises.

    The connection keywords (host, port, state_port, local_port, bind_host, timings,
    timeout_factor, timeout_margin_s, retries, keepalive_s, speed_cm_s, stop, logger) are the
    TelloClient's. detector: optional `detector(object_name) -> bool` (is the object in the
    current frame?), used by is_visible and sweeping.
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 state_port: int = DEFAULT_STATE_PORT, local_port: int = 0, *,
                 bind_host: str | None = None, timings: TelloTimings | None = None,
                 timeout_factor: float = 2.0, timeout_margin_s: float = 3.0, retries: int = 2,
                 keepalive_s: float | None = 10.0, speed_cm_s: float | None = None,
                 detector: Callable[[str], bool] | None = None,
                 stop: threading.Event | None = None, logger: logging.Logger | None = None):
        # The full keyword list again (not **kwargs) so that a wrong keyword is reported as
        # TelloBackend's, which make_backend turns into "backend 'tello': ..."
        super().__init__(host, port, state_port, local_port, bind_host=bind_host,
                         timings=timings, timeout_factor=timeout_factor,
                         timeout_margin_s=timeout_margin_s, retries=retries,
                         keepalive_s=keepalive_s, speed_cm_s=speed_cm_s, stop=stop,
                         logger=logger)
        self.detector = detector
        # For the plan interpreter (loops, conditionals, variables on the executor):
        # TaskInterpreter(MINISPEC, backend.runtime) - see runtime.py for its rules.
        from timelyllm_ros.robots.tello.runtime import TelloRuntime

        self.runtime = TelloRuntime(self)

    def interpreter(self):
        """A fresh per-task MiniSpec interpreter on this Tello (vision skills answer "unknown"
        until a vision source is configured; robots/tello/runtime.py)."""
        from timelyllm_ros.core.skills.interpreter import TaskInterpreter
        from timelyllm_ros.core.skills.minispec import MINISPEC
        return TaskInterpreter(MINISPEC, self.runtime)

    def execute(self, calls: Sequence[SkillCall]) -> tuple[bool, str]:
        """Run the calls in order; (True, summary) or (False, what failed and why)."""
        started = time.monotonic()
        try:
            plan = [(call.to_wire(), translate(call)) for call in calls]
        except TranslationError as err:
            return False, f"tello: {err} (nothing executed)"
        try:
            if not self.connected:
                self.connect()
        except TelloError as err:
            return False, f"tello: entering SDK mode failed: {err} (nothing executed)"
        sent: list[str] = []
        notes: list[str] = []
        for done, (wire, steps) in enumerate(plan):
            try:
                for step in steps:
                    if self._stop.is_set():
                        raise TelloAborted("stopped (segment cancelled or executor shutting down)")
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
                    # Send `command` again before the next segment.
                    self.mark_disconnected()
                return False, (f"tello: {wire}: {err} (after {done} of {len(plan)} skill call(s); "
                               f"sent: {', '.join(sent) or 'nothing'})")
            except Exception as err:  # noqa: BLE001 - a detector's bug must not kill the executor
                return False, f"tello: {wire}: {type(err).__name__}: {err}"
        took = time.monotonic() - started
        summary = f"tello: {len(sent)} SDK command(s) [{', '.join(sent)}] in {took:.2f} s"
        if notes:
            summary += "; " + "; ".join(notes)
        return True, summary

    def cancel(self) -> None:
        """The executor cancelled the running segment: send the SDK's `stop` (the drone stops
        and hovers). Sent at once, outside the command lock: the reply wait of the command in
        flight ends on the stop signal, and the `ok` to `stop` is drained as a stale reply."""
        try:
            self._cmd_sock.sendto(b"stop", self.drone)
        except OSError as err:
            self._log.warning(f"tello: could not send stop: {err}")
        else:
            self.history.append(CommandRecord("stop", time.monotonic(), None, None, 1))

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
        if step.skill in VISION_SKILLS:
            return f"{step.call}=unknown (no detector)"
        if step.skill in ("picture", "take_picture"):
            return f"{step.call}: no video stream in this backend, no picture taken"
        if step.skill == "orienting":
            return f"{step.call}: no motion (centring needs a detector with object positions)"
        return ""  # query: answered by the LLM side, nothing to do on the drone
