"""The simulated engine's requests: one record per request, and the waiting and running queues.

A request enters the waiting queue (`add_request`), is admitted into the running batch by the
step (engine.py), and leaves when it finishes, is aborted, or is suspended at a pause
(pauses.py). A preempted request goes back to the head of the waiting queue.

A request under a grammar (`output_regex`) is admissible only once its grammar is ready, as in
vLLM V1, which builds each request's grammar matcher on a thread pool and schedules around a
request still waiting for it: `profile.grammar_init_s` after it was added or after the previous
request's grammar was ready, whichever is later (the grammars are built one after another).
So a constrained request added between two steps of a busy engine misses the next step, and an
idle engine waits for it (engine.py, `_admit_waiting`). A preempted request keeps its grammar.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.blocks import _BlockPool
from timelyllm_ros.core.engine.sim.tokenizer import PieceTokenizer


@dataclass(eq=False)  # identity semantics: list membership must not compare token lists
class _Sequence:
    request: EngineRequest
    tokens: list[int]  # prompt followed by every token sampled so far
    prompt_len: int
    script: list[int]
    blocks: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of the leading full, committed blocks
    num_computed: int = 0  # tokens whose KV is in `blocks`
    reported_cache: bool = False
    # Resumed after a pause: tokens restorable from the host copy (swap) at admission.
    swap_tokens: int = 0
    arrival_s: float = 0.0  # when the engine received it (ties in priority scheduling)
    # Admitted, but its prompt is not all computed yet (chunked prefill over several steps).
    prefill_pending: bool = False
    cached_at_admission: int = 0  # reported with its first token
    chunk: int = 0  # tokens it computes in the step being scheduled
    # When its grammar is ready (`RequestQueues._grammar_ready_s`): not admitted before.
    ready_s: float = 0.0

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len


class RequestQueues:
    """Mixin of `SimulatedEngine`: requests in, requests out, and the queues between.

    Every request the engine holds (waiting or running, not paused) is in `_by_id`."""

    profile: EngineProfile
    tokenizer: PieceTokenizer
    _clock: float
    _pool: _BlockPool
    _waiting: list[_Sequence]
    _running: list[_Sequence]
    _by_id: dict[str, _Sequence]

    def _init_queues(self) -> None:
        self._waiting = []
        self._running = []
        self._by_id = {}
        self._grammar_free_s = 0.0  # when the last grammar asked for is ready

    def add_request(self, request: EngineRequest) -> None:
        seq = self._new_sequence(request)
        seq.ready_s = self._grammar_ready_s(request)
        self._waiting.append(seq)

    def _grammar_ready_s(self, request: EngineRequest) -> float:
        """When a request added now under its grammar may be scheduled (now without one)."""
        wait = self.profile.grammar_init_s
        if not request.output_regex or wait <= 0:
            return self._clock
        self._grammar_free_s = max(self._clock, self._grammar_free_s) + wait
        return self._grammar_free_s

    def _new_sequence(self, request: EngineRequest) -> _Sequence:
        """Validate `request` and register its record (not queued yet)."""
        rid = request.request_id
        if rid in self._by_id:
            raise ValueError(f"request {rid!r} is already in the engine")
        prompt = list(request.prompt_token_ids)
        if not prompt:
            raise ValueError(f"request {rid!r}: empty prompt")
        if len(prompt) >= self.profile.max_model_len:
            raise ValueError(
                f"request {rid!r}: prompt of {len(prompt)} tokens does not fit "
                f"max_model_len {self.profile.max_model_len}"
            )
        if self._blocks_for(len(prompt) + 1) > self._pool.num_blocks:
            raise ValueError(f"request {rid!r}: prompt needs more KV blocks than the engine has")
        if request.max_tokens < 1:
            raise ValueError(f"request {rid!r}: max_tokens must be >= 1")
        if self.paused_handling(rid) is not None:
            raise ValueError(f"request {rid!r} is paused in the engine")
        script = self.tokenizer.tokenize(request.scripted_text or "")
        seq = _Sequence(request, prompt, len(prompt), script, arrival_s=self._clock)
        self._by_id[rid] = seq
        return seq

    def abort_request(self, request_id: str) -> None:
        if self._release_paused(request_id):
            return
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return
        if seq in self._running:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        self._free_blocks(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self._by_id)

    def num_running(self) -> int:
        return len(self._running)

    def num_waiting(self) -> int:
        return len(self._waiting)
