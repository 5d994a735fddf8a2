"""The calibrated cost-model engine, paced to the wall clock.

The simulated engine normally runs in virtual time so a 900-second workload replays in seconds.
When it serves real ROS nodes instead (LRTrace replay over ROS with `--engine sim`), robots and
transport live in wall-clock time, so each step sleeps for its modelled duration and idle time is
real time too. The scheduler cannot tell this engine from the real one except by its name.
"""

from __future__ import annotations

import time
from typing import Sequence

from timelyllm_ros.core.engine.base import EngineOutput, EngineRequest, KvUsage, StepTiming
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim_engine import SimulatedEngine


class RealtimeSimulatedEngine:
    name = "sim-realtime"

    def __init__(self, profile: EngineProfile | None = None, *, clock=time.monotonic,
                 sleep=time.sleep, **engine_kwargs):
        self._clock = clock
        self._sleep = sleep
        self._inner = SimulatedEngine(profile, start_time=clock(), **engine_kwargs)

    def now(self) -> float:
        return self._clock()

    def _catch_up(self) -> None:
        # Wall time spent outside step() (idle, callbacks) passes in the model too.
        now = self._clock()
        if now > self._inner.now():
            self._inner.advance_idle(now)

    def step(self) -> list[EngineOutput]:
        self._catch_up()
        outputs = self._inner.step()
        lag = self._inner.now() - self._clock()
        if lag > 0:
            self._sleep(lag)
        return outputs

    def advance_idle(self, until: float) -> None:
        delay = until - self._clock()
        if delay > 0:
            self._sleep(min(delay, 0.05))

    def add_request(self, request: EngineRequest) -> None:
        self._catch_up()
        self._inner.add_request(request)

    def abort_request(self, request_id: str) -> None:
        self._inner.abort_request(request_id)

    def tokenize(self, text: str) -> list[int]:
        return self._inner.tokenize(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._inner.decode(token_ids)

    def max_model_len(self) -> int:
        return self._inner.max_model_len()

    def has_unfinished_requests(self) -> bool:
        return self._inner.has_unfinished_requests()

    def num_running(self) -> int:
        return self._inner.num_running()

    def kv_usage(self) -> KvUsage:
        return self._inner.kv_usage()

    def last_step_timing(self) -> StepTiming:
        return self._inner.last_step_timing()

    def shutdown(self) -> None:
        self._inner.shutdown()

    def __getattr__(self, name: str):
        # Optional engine capabilities (pause handling, profile, statistics) of the cost model
        # apply unchanged: their time costs land in the next step, which is paced above.
        return getattr(self._inner, name)
