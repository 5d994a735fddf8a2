"""The contract between the scheduler and an LLM engine.

The scheduler drives every engine through this interface only, so the same policy code runs on the
real vLLM engine (wall-clock time) and on the calibrated simulated engine (virtual time).
"""

from __future__ import annotations

import time

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from timelyllm_ros.core.engine.eviction import ParkedGeneration


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


# What an engine does with a suspended generation's KV cache while its robot executes a segment
# (LAMPS, seed 004). One definition for the engines, the scheduler and every policy.
PRESERVE = "preserve"   # keep the blocks allocated (pinned) until the generation resumes
DISCARD = "discard"     # free them (evictable prefix cache); recompute what is evicted on resume
SWAP = "swap"           # copy them to host memory and back on resume
PAUSE_HANDLINGS = (PRESERVE, DISCARD, SWAP)


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
    # Prompt tokens served from the prefix cache (or, on a session resume, held in the engine);
    # known on the request's first output.
    num_cached_tokens: int | None = None
    # On a request's first output, engines that measure it: tokens of the previous context the
    # engine computed again for this run (a resume through a session: the one token vLLM drops;
    # through the prefix cache: the partial last block and whatever was evicted), from the
    # engine's own accounting. New input appended to the context is not counted.
    recomputed_tokens: int | None = None
    # With finish_reason "error": why the engine could not go on (a server that died, a request
    # refused mid-stream); the task should fail with it.
    error: str | None = None


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
    # A fleet whose replicas step on their own (the simulated fleet): the index of the replica
    # that ran the step and that replica's batch; `batch_size` stays the whole fleet's running
    # count, the batch of the one engine the scheduler otherwise sees. None for one engine.
    replica: int | None = None
    replica_batch_size: int = 0


@dataclass(frozen=True)
class ReplicaRoom:
    """What one replica of a fleet can take now: its free KV blocks and its free slots
    (`max_num_seqs` less its running count; None: no slot limit). A down replica has none."""

    free_blocks: int
    free_slots: int | None


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do beyond the common protocol, declared instead of probed.

    pause_handling: `suspend_request` / `resume_request` keep a suspended generation's KV
        (preserve) or a host copy (swap); without it the scheduler only discards (abort, then
        resubmit the token ids and let the prefix cache serve what it still holds).
    profile: the cost model the engine runs on (simulated engines), else None.
    default_pause_handling: what a suspension should do when the policy has no opinion (its
        `pause_handling` hook is not overridden): the real engine with sessions says preserve
        (a parked session costs one token on resume), every other engine discard.
    """

    pause_handling: bool = False
    default_pause_handling: str = DISCARD
    max_num_seqs: int | None = None
    profile: Any = None
    kv_bytes_per_token: float = 131072.0
    host_link_bytes_per_s: float = 25e9
    paused_hold_slots: bool = False


@dataclass(frozen=True)
class EngineNeeds:
    """What a policy needs from the engine it runs on; `core.engine.factory` builds from it.

    scheduling_policy: vLLM's `scheduling_policy` ("fcfs" or "priority").
    simulated_engine: the simulated engine class (called as `cls(profile, **engine_kwargs)`) this
        policy must be evaluated on, e.g. a paper's engine variant; None = `SimulatedEngine`.
    only_engine: the only engine `name` it can run on (a baseline that exists only in
        simulation); None = any engine.
    """

    scheduling_policy: str = "fcfs"
    simulated_engine: Callable[..., Any] | None = None
    only_engine: str | None = None


class EngineAdapter(Protocol):
    """Everything the scheduler needs from an engine. One thread owns an adapter."""

    name: str

    def capabilities(self) -> EngineCapabilities: ...

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat prompt (the model's chat template where it has one)."""

    def suspend_request(self, request_id: str, handling: str) -> None:
        """Pause a running request at a segment boundary, keeping its KV as `handling` says
        (only with `capabilities().pause_handling`)."""

    def resume_request(self, request_id: str, request: EngineRequest) -> None:
        """Continue a paused request as `request` (only with `capabilities().pause_handling`)."""

    def paused_handling(self, request_id: str) -> str | None:
        """How a paused request's KV is held now (a preserve can be revoked), None if not paused."""

    def pinned_blocks(self) -> int:
        """KV blocks held by preserved pauses (0 for an engine without pause handling)."""

    def evict_paused(self, request_id: str, reason: str = "scheduler") -> int:
        """Free a preserved pause's KV now (it resumes later through the prefix cache, like a
        discarded one); returns the context tokens it held, 0 if it holds nothing."""

    def paused_generations(self) -> list[ParkedGeneration]:
        """The preserved pauses, as `core.engine.eviction` ranks them (resume_in_s is the
        engine's own estimate; the scheduler knows better and may replace it)."""

    def now(self) -> float:
        """The engine's clock in seconds: monotonic wall time, or virtual time when simulated."""

    def tokenize(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def max_model_len(self) -> int: ...

    def max_num_batched_tokens(self) -> int:
        """Tokens one engine step may process (vLLM V1's token budget)."""

    def add_request(self, request: EngineRequest) -> None: ...

    def abort_request(self, request_id: str) -> None:
        """Stop a request and free its KV blocks. Unknown or finished ids are ignored."""

    def step(self) -> list[EngineOutput]:
        """Run one engine iteration (prefill and/or one decode token per running request)."""

    def has_unfinished_requests(self) -> bool: ...

    def num_running(self) -> int: ...

    def kv_usage(self) -> KvUsage: ...

    def replica_for(self, request_id: str) -> int | None:
        """Index of the replica of a fleet that runs `request_id`, or would run it if it were
        submitted now (a resume: its task's replica; a new plan: the router's pick); None for
        one engine."""

    def replica_rooms(self) -> list[ReplicaRoom] | None:
        """Each replica's free KV blocks and slots, by replica index (`replica_for`), for a fleet
        whose replicas step on their own (`StepTiming.replica`); None for one engine and for a
        fleet that steps all its replicas in one call (the scheduler sees one engine there)."""

    def last_step_timing(self) -> StepTiming: ...

    def advance_idle(self, until: float) -> None:
        """Nothing to run: let time pass until `until` (sleeps, or jumps virtual time)."""

    def shutdown(self) -> None: ...


class PauselessEngine:
    """The optional part of `EngineAdapter` for an engine that cannot pause a request (the
    scheduler then suspends by abort + resubmit) and has no chat template of its own."""

    name = "engine"

    def capabilities(self) -> EngineCapabilities:
        return EngineCapabilities()

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return self.tokenize("\n".join(m["content"] for m in messages) + "\n")

    def suspend_request(self, request_id: str, handling: str) -> None:
        raise NotImplementedError(f"engine {self.name!r} cannot pause a request "
                                  "(capabilities().pause_handling is False)")

    def resume_request(self, request_id: str, request: EngineRequest) -> None:
        raise NotImplementedError(f"engine {self.name!r} cannot pause a request "
                                  "(capabilities().pause_handling is False)")

    def paused_handling(self, request_id: str) -> str | None:
        return None

    def pinned_blocks(self) -> int:
        return 0

    def evict_paused(self, request_id: str, reason: str = "scheduler") -> int:
        return 0

    def paused_generations(self) -> list[ParkedGeneration]:
        return []

    def replica_for(self, request_id: str) -> int | None:
        return None

    def replica_rooms(self) -> list[ReplicaRoom] | None:
        return None

    def tokenize(self, text: str) -> list[int]:
        raise NotImplementedError


class WallClockIdle:
    """`advance_idle` and `last_step_timing` for an engine that runs in real time (vLLM
    embedded or behind servers): idle time passes by sleeping, in slices of at most 50 ms so
    that new work is picked up soon. Expects `now()` and `_last_timing`."""

    IDLE_SLICE_S = 0.05

    def last_step_timing(self) -> StepTiming:
        return self._last_timing

    def advance_idle(self, until: float) -> None:
        delay = until - self.now()
        if delay > 0:
            time.sleep(min(delay, self.IDLE_SLICE_S))
