"""A simulated engine paced to the wall clock.

The simulated engine normally runs in virtual time so a 900-second workload replays in seconds.
When it serves real ROS nodes instead (the planner with `engine.kind: sim`, LRTrace replay over
ROS), robots and transport live in wall-clock time, so each step sleeps for its modelled duration
and idle time is real time too. The scheduler cannot tell this engine from the real one except by
its name.

Pacing is a mixin over any simulated engine class, so a policy's own engine variant (BROS's
bidirectional KV blocks, MC-SF's clearing engine) is paced the same way: `realtime(cls)`.
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import Callable

from timelyllm_ros.core.engine.base import EngineOutput, EngineRequest
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine


class RealtimePacing:
    """Mixin for a `SimulatedEngine` subclass: its virtual clock follows `clock`."""

    name = "sim-realtime"

    def __init__(self, *args, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, **kwargs):
        self._wall_clock = clock
        self._sleep = sleep
        super().__init__(*args, start_time=clock(), **kwargs)

    def now(self) -> float:
        return self._wall_clock()

    def _catch_up(self) -> None:
        # Wall time spent outside step() (idle, callbacks) passes in the model too.
        now = self._wall_clock()
        if now > super().now():
            super().advance_idle(now)

    def step(self) -> list[EngineOutput]:
        self._catch_up()
        outputs = super().step()
        lag = super().now() - self._wall_clock()
        if lag > 0:
            self._sleep(lag)
        return outputs

    def advance_idle(self, until: float) -> None:
        delay = until - self._wall_clock()
        if delay > 0:
            self._sleep(min(delay, 0.05))

    def add_request(self, request: EngineRequest) -> None:
        self._catch_up()
        super().add_request(request)


@lru_cache(maxsize=None)
def realtime(engine_cls: type[SimulatedEngine]) -> type[SimulatedEngine]:
    """`engine_cls` paced to the wall clock (one class per engine class)."""
    return type(f"Realtime{engine_cls.__name__}", (RealtimePacing, engine_cls), {})


# The standard simulated engine at wall clock.
RealtimeSimulatedEngine = realtime(SimulatedEngine)
