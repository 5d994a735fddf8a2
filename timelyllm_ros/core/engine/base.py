"""The contract between the scheduler and an LLM engine.

The scheduler drives every engine through this interface only, so the same policy code runs on the
real vLLM engine (wall-clock time) and on the calibrated simulated engine (virtual time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


@dataclass(frozen=True)
class EngineRequest:
    """One generation submitted to the engine (a fresh plan or the resumption of a suspended one)."""

    request_id: str
    prompt_token_ids: Sequence[int]
    max_tokens: int
    # Regular expression the output must match (vLLM structured outputs); None = unconstrained.
    output_regex: str | None = None
    # Only the simulated engine reads this: the text it "generates". The real engine ignores it.
    scripted_text: str | None = None
    # Service class the policy gives this run: "rt" (real-time) or "be" (best-effort), or None.
    # An engine with priority scheduling serves "be" after everything else (`engine_priority`),
    # and the simulated engine with BROS's bidirectional KV blocks places the two classes at
    # opposite ends of shared blocks; an FCFS engine ignores it.
    service_class: str | None = None


# vLLM's `scheduling_policy`: "fcfs" serves waiting requests in arrival order and preempts the
# newest running one; "priority" orders both by (priority, arrival), lower value first.
ENGINE_SCHEDULING = ("fcfs", "priority")


def engine_priority(service_class: str | None) -> int:
    """vLLM request priority of a service class (lower is served first): best-effort work
    after everything else."""
    return 1 if service_class == "be" else 0


@dataclass
class EngineOutput:
    """What one engine step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    # Detokenized text of new_token_ids, as the engine produced it incrementally.
    new_text: str
    finished: bool = False
    finish_reason: str | None = None
    # Prompt tokens served from the prefix cache; known after the request's first step.
    num_cached_tokens: int | None = None


@dataclass(frozen=True)
class KvUsage:
    free_blocks: int
    total_blocks: int
    block_size: int


@dataclass
class StepTiming:
    """Measured (or, for the simulated engine, modelled) duration of the last step."""

    duration_s: float = 0.0
    batch_size: int = 0
    prefill_tokens: int = 0
    extra: dict = field(default_factory=dict)


class EngineAdapter(Protocol):
    """Everything the scheduler needs from an engine. One thread owns an adapter."""

    name: str

    def now(self) -> float:
        """The engine's clock in seconds: monotonic wall time, or virtual time when simulated."""

    def tokenize(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def max_model_len(self) -> int: ...

    def add_request(self, request: EngineRequest) -> None: ...

    def abort_request(self, request_id: str) -> None:
        """Stop a request and free its KV blocks. Unknown or finished ids are ignored."""

    def step(self) -> list[EngineOutput]:
        """Run one engine iteration (prefill and/or one decode token per running request)."""

    def has_unfinished_requests(self) -> bool: ...

    def num_running(self) -> int: ...

    def kv_usage(self) -> KvUsage: ...

    def last_step_timing(self) -> StepTiming: ...

    def advance_idle(self, until: float) -> None:
        """Nothing to run: let time pass until `until` (sleeps, or jumps virtual time)."""

    def shutdown(self) -> None: ...
