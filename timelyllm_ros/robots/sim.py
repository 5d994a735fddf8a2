"""Backend `sim`: a robot that only takes time, drawn from the execution-time model."""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.skills.base import SkillCall


class SimulatedBackend:
    """Sleeps for a segment's sampled duration, scaled by `time_scale` (demos and tests run
    faster than a real drone); `stop` cuts the sleep short when the executor shuts down or
    cancels the segment."""

    def __init__(self, model: ExecutionTimeModel, time_scale: float, seed: int, stop: threading.Event):
        self._model = model
        self._scale = time_scale
        self._rng = np.random.default_rng(seed)
        self._stop = stop

    def execute(self, calls: Sequence[SkillCall]) -> tuple[bool, str]:
        duration = self._model.sample_segment(calls, self._rng) * self._scale if calls else 0.0
        if self._stop.wait(duration):
            return False, "stopped (segment cancelled or executor shutting down)"
        return True, f"simulated {duration:.2f} s"

    def cancel(self) -> None:
        """Nothing to tell: the wait on the stop signal ends at once."""
