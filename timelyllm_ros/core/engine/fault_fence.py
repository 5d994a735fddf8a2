"""A fence around an engine: its own failures become one typed exception, `EngineFault`.

The planner runs vLLM inside its own process, so a CUDA out-of-memory error, an assertion
inside vLLM or a model that raises comes out of `step`, `add_request` or `abort_request` as
whatever exception vLLM raised. The scheduler cannot tell that from a bad request, and an
engine that failed half-way through a step cannot be trusted again (vLLM's own engine core
takes the same view: one exception in its busy loop and every request gets `EngineDeadError`).

`FencedEngine` passes every `EngineAdapter` call through and turns an exception from one of
the engine's operations into `EngineFault(operation, cause)`. From then on the engine is dead:
every operation raises the same fault again, except the calls that release what a task holds
(`abort_request`, `evict_paused`), which do nothing, because the engine's KV goes with it and the
scheduler must still be able to end every task without touching it.

`inject(operation)` arms a fault on command: the next call of that operation raises an
`InjectedFault` inside the fence, exactly as an engine failure would. The planner exposes it as
the `engine.inject_fault` parameter for fault drills (docs: README, "Engine faults").
"""

from __future__ import annotations

import threading
from typing import Sequence

from timelyllm_ros.core.engine.base import (EngineAdapter, EngineCapabilities, EngineOutput,
                                            EngineRequest, KvUsage, ReplicaRoom,
                                            StepTiming)
from timelyllm_ros.core.engine.eviction import ParkedGeneration

# The operations a fault can be injected into (and the ones fenced).
FENCED_OPERATIONS = ("step", "add_request", "abort_request", "suspend_request",
                     "resume_request")


class EngineFault(RuntimeError):
    """The engine itself failed; `operation` is what it was doing, `cause` what it raised."""

    def __init__(self, operation: str, cause: BaseException):
        self.operation = operation
        self.cause = cause
        super().__init__(f"engine {operation} failed: {type(cause).__name__}: {cause}")


class InjectedFault(RuntimeError):
    """What an injected fault raises inside the fence (a stand-in for a CUDA error)."""


class FencedEngine:
    """An `EngineAdapter` that wraps another one (module docstring)."""

    def __init__(self, inner: EngineAdapter):
        self.inner = inner
        self.name = inner.name
        self.fault: EngineFault | None = None
        self._armed: str | None = None
        self._arm_lock = threading.Lock()   # `inject` is called from ROS threads

    # ------------------------------------------------------------------ faults
    def inject(self, operation: str) -> None:
        """Make the next `operation` fail (one of FENCED_OPERATIONS)."""
        if operation not in FENCED_OPERATIONS:
            raise ValueError(f"engine.inject_fault: {operation!r} is not one of "
                             f"{', '.join(FENCED_OPERATIONS)}")
        with self._arm_lock:
            self._armed = operation

    def _guard(self, operation: str, call, *args):
        if self.fault is not None:
            raise self.fault
        try:
            with self._arm_lock:
                fire = self._armed == operation
                if fire:
                    self._armed = None
            if fire:
                raise InjectedFault(f"fault injected into {operation} (engine.inject_fault)")
            return call(*args)
        except Exception as err:  # noqa: BLE001 - any failure inside the engine is a fault
            self.fault = EngineFault(operation, err)
            raise self.fault from err

    def _release(self, call, *args):
        """Release calls on a dead engine do nothing: its memory goes with it."""
        if self.fault is not None:
            return 0
        return self._guard(call.__name__, call, *args)

    # ------------------------------------------------------------------ fenced operations
    def step(self) -> list[EngineOutput]:
        return self._guard("step", self.inner.step)

    def add_request(self, request: EngineRequest) -> None:
        self._guard("add_request", self.inner.add_request, request)

    def abort_request(self, request_id: str) -> None:
        self._release(self.inner.abort_request, request_id)

    def suspend_request(self, request_id: str, handling: str) -> None:
        self._guard("suspend_request", self.inner.suspend_request, request_id, handling)

    def resume_request(self, request_id: str, request: EngineRequest) -> None:
        self._guard("resume_request", self.inner.resume_request, request_id, request)

    def evict_paused(self, request_id: str, reason: str = "scheduler") -> int:
        return self._release(self.inner.evict_paused, request_id, reason)

    # ------------------------------------------------------------------ read-only pass-through
    def capabilities(self) -> EngineCapabilities:
        return self.inner.capabilities()

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return self.inner.render_chat(messages)

    def paused_handling(self, request_id: str) -> str | None:
        return None if self.fault else self.inner.paused_handling(request_id)

    def pinned_blocks(self) -> int:
        return 0 if self.fault else self.inner.pinned_blocks()

    def paused_generations(self) -> list[ParkedGeneration]:
        return [] if self.fault else self.inner.paused_generations()

    def now(self) -> float:
        return self.inner.now()

    def tokenize(self, text: str) -> list[int]:
        return self.inner.tokenize(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.inner.decode(token_ids)

    def max_model_len(self) -> int:
        return self.inner.max_model_len()

    def max_num_batched_tokens(self) -> int:
        return self.inner.max_num_batched_tokens()

    def has_unfinished_requests(self) -> bool:
        return self.fault is None and self.inner.has_unfinished_requests()

    def num_running(self) -> int:
        return 0 if self.fault else self.inner.num_running()

    def kv_usage(self) -> KvUsage:
        return self.inner.kv_usage()

    def last_step_timing(self) -> StepTiming:
        return self.inner.last_step_timing()

    def replica_for(self, request_id: str) -> int | None:
        return self.inner.replica_for(request_id)

    def replica_rooms(self) -> list[ReplicaRoom] | None:
        return self.inner.replica_rooms()

    def advance_idle(self, until: float) -> None:
        self.inner.advance_idle(until)

    def shutdown(self) -> None:
        self.inner.shutdown()
