"""The one place the real engine reaches past `LLMEngine`'s public API (vLLM 0.32).

`VllmEngine` needs four things vLLM offers only to its own front ends:
- streaming-input sessions: a request added with `resumable=True` parks when a chunk stops (EOS,
  a stop token id, `max_tokens`) in `WAITING_FOR_STREAMING_REQ`, keeps its KV blocks, and goes on
  when the next chunk with the same *internal* request id arrives. `AsyncLLM` does this in
  `_add_streaming_input_request`; `LLMEngine.add_request` gives every call a fresh internal id,
  so the same steps are taken here on the synchronous engine (`open_session`, `send_chunk`);
- the block pool (free / total KV blocks) and the blocks one parked session holds;
- the scheduler's own accounting of each step (`num_scheduled_tokens` per request, preemptions),
  read by wrapping `Scheduler.schedule` (what a resume recomputes is measured there, not
  computed by us);
- the status of a request inside the engine core (parked or not).

All of it needs the in-process engine core (`VLLM_ENABLE_V1_MULTIPROCESSING=0`). `VllmInternals`
checks every attribute it uses when it is built and raises `VllmInternalsError` naming the
missing piece and the vLLM version, so another vLLM release fails at start-up with a clear
message instead of misbehaving mid-plan. Nothing else in the project touches vLLM internals.

vLLM 0.32 defect worked around here: with the in-process client the output processor and the
engine core share the request's `prompt_token_ids` list, and both extend it when a chunk arrives,
so the session's prompt grows by the chunk twice and the resumed request never samples. The
engine core gets its own copy of the list (`open_session`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Sequence

SUPPORTED_VLLM = ("0.32.",)


class VllmInternalsError(RuntimeError):
    """This vLLM does not offer what the in-process session support needs."""


@dataclass
class StepAccounting:
    """What vLLM's scheduler decided in the last `schedule()` calls (drained by the engine)."""

    scheduled: dict[str, int] = field(default_factory=dict)  # internal id -> tokens computed
    preempted: set[str] = field(default_factory=set)
    steps: int = 0


class VllmInternals:
    """Checked access to the in-process vLLM engine core behind an `LLMEngine`."""

    def __init__(self, engine: Any) -> None:
        import vllm
        from vllm.v1.request import RequestStatus

        version = str(getattr(vllm, "__version__", "unknown"))
        where = "LLMEngine"
        try:
            self._input = engine.input_processor
            self._output = engine.output_processor
            self._client = engine.engine_core
            where = "LLMEngine.engine_core.engine_core (in-process engine core)"
            core = self._client.engine_core
            where = "EngineCore.scheduler"
            self._scheduler = core.scheduler
            where = "Scheduler.kv_cache_manager.block_pool"
            self._kv = self._scheduler.kv_cache_manager
            self._pool = self._kv.block_pool
            where = "RequestStatus.WAITING_FOR_STREAMING_REQ"
            self._parked_status = RequestStatus.WAITING_FOR_STREAMING_REQ
            where = "InputProcessor.process_inputs(resumable=...)"
            if "resumable" not in inspect.signature(self._input.process_inputs).parameters:
                raise AttributeError("resumable")
            where = "Scheduler.requests / schedule / num_waiting_for_streaming_input"
            self._scheduler.requests  # noqa: B018 - presence checks
            self._scheduler.num_waiting_for_streaming_input  # noqa: B018
            self._waiting = self._scheduler.waiting
            original_schedule = self._scheduler.schedule
            where = "KVCacheManager.get_block_ids / get_blocks / BlockPool.get_num_free_blocks"
            self._kv.get_block_ids  # noqa: B018
            self._kv.get_blocks  # noqa: B018
            self._pool.get_num_free_blocks  # noqa: B018
            self._pool.num_gpu_blocks  # noqa: B018
            where = "Scheduler.max_num_active_reqs / running / block_size"
            self._scheduler.max_num_active_reqs  # noqa: B018
            self._scheduler.running  # noqa: B018
            self._pool_block_size = int(self._scheduler.block_size)
        except AttributeError as err:
            raise VllmInternalsError(
                f"vLLM {version}: TimelyLLM's in-process session support needs {where} "
                f"({err}); it was written for vLLM {' / '.join(SUPPORTED_VLLM)}x with "
                "VLLM_ENABLE_V1_MULTIPROCESSING=0. Set the planner parameter `engine.sessions: false` "
                "(`-p engine.sessions:=false`) to run without sessions (suspend = abort + prefix cache)."
            ) from err
        if not version.startswith(SUPPORTED_VLLM):
            raise VllmInternalsError(
                f"vLLM {version}: TimelyLLM's in-process session support was checked on vLLM "
                f"{' / '.join(SUPPORTED_VLLM)}x only; set the planner parameter `engine.sessions: false` "
                "(`-p engine.sessions:=false`) to run without it")
        self.version = version
        self._tasks = engine.get_supported_tasks()
        self.accounting = StepAccounting()
        accounting = self.accounting

        def schedule(*args: Any, **kwargs: Any) -> Any:
            out = original_schedule(*args, **kwargs)
            for rid, n in out.num_scheduled_tokens.items():
                accounting.scheduled[rid] = accounting.scheduled.get(rid, 0) + int(n)
            if out.preempted_req_ids:
                accounting.preempted.update(out.preempted_req_ids)
            accounting.steps += 1
            return out

        self._scheduler.schedule = schedule

    # -- sessions ------------------------------------------------------------------------
    def open_session(self, key: str, prompt: Sequence[int], params: Any, priority: int) -> str:
        """Add a resumable request (a session) under external id `key`; returns its internal
        id, which every later chunk must use. Raises what vLLM raises for bad input."""
        from vllm.inputs import TokensPrompt

        req = self._input.process_inputs(
            key, TokensPrompt(prompt_token_ids=list(prompt)), params,
            supported_tasks=self._tasks, priority=priority, resumable=True)
        self._input.assign_request_id(req)
        self._output.add_request(req, None, None, 0)
        # The output processor keeps (and later extends) this list: the core needs its own.
        req.prompt_token_ids = list(req.prompt_token_ids)
        self._client.add_request(req)
        return req.request_id

    def send_chunk(self, key: str, internal_id: str, tokens: Sequence[int], params: Any) -> None:
        """The next input chunk of a parked session: it resumes with `tokens` appended."""
        from vllm.inputs import TokensPrompt

        req = self._input.process_inputs(
            internal_id, TokensPrompt(prompt_token_ids=list(tokens)), params,
            supported_tasks=self._tasks, resumable=True)
        req.external_req_id = key
        self._output.add_request(req, None, None, 0)
        req.prompt_token_ids = list(req.prompt_token_ids)
        self._client.add_request(req)

    def abort(self, internal_id: str) -> None:
        """End a session (or any request) by its internal id, freeing its blocks."""
        ids = self._output.abort_requests([internal_id], True)
        self._client.abort_requests(ids or [internal_id])

    def is_parked(self, internal_id: str) -> bool:
        request = self._scheduler.requests.get(internal_id)
        return request is not None and request.status == self._parked_status

    def num_computed(self, internal_id: str) -> int:
        request = self._scheduler.requests.get(internal_id)
        return 0 if request is None else int(request.num_computed_tokens)

    def blocks_of(self, internal_id: str) -> int:
        """KV blocks the request holds now (0 once it is gone)."""
        if internal_id not in self._scheduler.requests:
            return 0
        return sum(len(ids) for ids in self._kv.get_block_ids(internal_id))

    def exclusive_blocks_of(self, internal_id: str) -> int:
        """KV blocks only this request references: what its abort frees (the shared system
        prompt's blocks stay with the requests that share them)."""
        if internal_id not in self._scheduler.requests:
            return 0
        return sum(1 for group in self._kv.get_blocks(internal_id).blocks for block in group
                   if block.ref_cnt == 1)

    # -- KV ------------------------------------------------------------------------------
    def free_blocks(self) -> int:
        return int(self._pool.get_num_free_blocks())

    def total_blocks(self) -> int:
        # vLLM keeps one block (the null block) out of the free queue for good.
        return int(self._pool.num_gpu_blocks) - 1

    def drain(self) -> StepAccounting:
        """The accounting since the last drain (and a fresh one for the next)."""
        out = StepAccounting(dict(self.accounting.scheduled), set(self.accounting.preempted),
                             self.accounting.steps)
        self.accounting.scheduled.clear()
        self.accounting.preempted.clear()
        self.accounting.steps = 0
        return out

    def admission_shortfall(self) -> tuple[int, int]:
        """(blocks, slots) the first request waiting in vLLM's queue lacks, (0, 0) if none waits.
        A request waiting for its grammar counts: vLLM promotes it only once a slot is free."""
        from vllm.v1.request import RequestStatus

        if not len(self._scheduler.waiting):
            return 0, 0
        head = self._scheduler.waiting.peek_request()
        if head.status not in (RequestStatus.WAITING,
                               RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR):
            return 0, 0
        slots = len(self._scheduler.running) + self._scheduler.num_waiting_for_streaming_input
        short_slots = max(0, slots + 1 - self._scheduler.max_num_active_reqs)
        bs = self._pool_block_size
        need = -(-int(head.num_tokens) // bs)
        short_blocks = max(0, need - self.free_blocks())
        return short_blocks, short_slots

    def context_tokens(self, internal_id: str) -> list[int]:
        """The token ids vLLM holds for a request (prompt, kept outputs, appended chunks)."""
        request = self._scheduler.requests.get(internal_id)
        return [] if request is None else list(request.all_token_ids)
