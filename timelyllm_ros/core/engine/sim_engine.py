"""Simulated engine driven by a calibrated cost model, in virtual time.

`SimulatedEngine` stands in for vLLM in large replays: it does no inference. Each request carries
the text it should "generate" (`EngineRequest.scripted_text`), and every engine step emits one
token of it per running request while a virtual clock advances by the step cost predicted by an
`EngineProfile` (see cost_model.py), calibrated to a real model and GPU.

What it models from vLLM (V1 scheduler with automatic prefix caching), because scheduling results
depend on it:
- continuous batching: new requests are prefilled in the same step in which running ones decode;
- paged KV cache of `kv_block_size`-token blocks, `kv_total_blocks` in all;
- automatic prefix caching: every full block is identified by a hash chained over the token ids of
  all blocks before it; a new request reuses the longest run of cached blocks of its prompt and
  only pays prefill for the rest (`num_cached_tokens`). Blocks of finished or aborted requests
  stay cached but count as free, and are evicted least-recently-freed first when a block is
  needed. This is what makes a resumed generation (prompt = original prompt + generated tokens)
  cheap;
- preemption by recompute: when a running request needs a new block and none is free, the newest
  running request loses its blocks and goes back to the head of the waiting queue with everything
  it generated appended to its prompt; it is prefilled again later (mostly from the prefix cache
  if its blocks were not evicted meanwhile). Waiting requests are admitted in FCFS order only
  when all running requests got their blocks, and only while blocks are free.

What it does not model: chunked prefill, sampling, structured outputs (`output_regex` is ignored:
the script is assumed valid), and an extra EOS step (a request finishes on the step that emits the
last token of its script).
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

from timelyllm_ros.core.engine.base import EngineOutput, EngineRequest, KvUsage, StepTiming
from timelyllm_ros.core.engine.cost_model import EngineProfile


class PieceTokenizer:
    """Deterministic, lossless stand-in for a BPE tokenizer.

    Text is cut into pieces by one regular expression: a run of letters with at most one leading
    space (like BPE's " word" tokens), up to three digits (Llama 3 splits numbers that way), a run
    of whitespace, or any other single character. Every character falls into exactly one piece, so
    `decode(tokenize(s)) == s`. Ids are assigned in order of first appearance from a vocabulary
    grown on demand, hence stable for the lifetime of one tokenizer.
    """

    _PIECE = re.compile(r" ?[^\W\d_]+|\d{1,3}|\s+|.", re.DOTALL)

    def __init__(self) -> None:
        self._id_of: dict[str, int] = {}
        self._pieces: list[str] = []

    def pieces(self, text: str) -> list[str]:
        return self._PIECE.findall(text)

    def tokenize(self, text: str) -> list[int]:
        ids = []
        for piece in self._PIECE.findall(text):
            token = self._id_of.get(piece)
            if token is None:
                token = len(self._pieces)
                self._id_of[piece] = token
                self._pieces.append(piece)
            ids.append(token)
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        pieces = self._pieces
        out = []
        for token in token_ids:
            if not 0 <= token < len(pieces):
                raise ValueError(f"unknown token id {token}")
            out.append(pieces[token])
        return "".join(out)

    def __len__(self) -> int:
        return len(self._pieces)


# Parent of the first block in the hash chain. Ints and tuples of ints hash identically in every
# process (unlike None), so cache behaviour is reproducible across runs.
_ROOT_HASH = 0


class _BlockPool:
    """Reference-counted KV blocks with a hash -> block prefix cache and an LRU free queue."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        # Free blocks, least recently freed first; cached-but-unreferenced blocks live here too.
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    def num_free(self) -> int:
        return len(self.free)

    def lookup(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def touch(self, block: int) -> None:
        if self.ref[block] == 0:
            del self.free[block]
        self.ref[block] += 1

    def allocate(self) -> int:
        block, _ = self.free.popitem(last=False)
        old = self.hash_of[block]
        if old is not None:
            if self.cached.get(old) == block:
                del self.cached[old]
            self.hash_of[block] = None
        self.ref[block] = 1
        return block

    def release(self, block: int) -> None:
        self.ref[block] -= 1
        if self.ref[block] == 0:
            self.free[block] = None

    def commit(self, block: int, block_hash: int) -> None:
        # An identical block computed twice keeps the first mapping, as vLLM does.
        if self.hash_of[block] is None and block_hash not in self.cached:
            self.cached[block_hash] = block
            self.hash_of[block] = block_hash


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

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len


class SimulatedEngine:
    """EngineAdapter over a calibrated cost model, in virtual time (see module docstring)."""

    name = "sim"

    def __init__(
        self,
        profile: EngineProfile | None = None,
        *,
        start_time: float = 0.0,
        max_num_seqs: int = 256,
        tokenizer: PieceTokenizer | None = None,
    ) -> None:
        self.profile = profile if profile is not None else EngineProfile()
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        self.max_num_seqs = max_num_seqs
        self.tokenizer = tokenizer if tokenizer is not None else PieceTokenizer()
        self._clock = float(start_time)
        self._block_size = self.profile.kv_block_size
        self._pool = _BlockPool(self.profile.kv_total_blocks)
        self._waiting: list[_Sequence] = []
        self._running: list[_Sequence] = []
        self._by_id: dict[str, _Sequence] = {}
        self._last_timing = StepTiming()

    # ---- clock ----

    def now(self) -> float:
        return self._clock

    def advance_idle(self, until: float) -> None:
        if until > self._clock:
            self._clock = float(until)

    # ---- tokenizer ----

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.tokenize(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def max_model_len(self) -> int:
        return self.profile.max_model_len

    # ---- requests ----

    def add_request(self, request: EngineRequest) -> None:
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
        script = self.tokenizer.tokenize(request.scripted_text or "")
        seq = _Sequence(request, prompt, len(prompt), script)
        self._by_id[rid] = seq
        self._waiting.append(seq)

    def abort_request(self, request_id: str) -> None:
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

    def kv_usage(self) -> KvUsage:
        return KvUsage(self._pool.num_free(), self._pool.num_blocks, self._block_size)

    def last_step_timing(self) -> StepTiming:
        return self._last_timing

    def shutdown(self) -> None:
        for rid in list(self._by_id):
            self.abort_request(rid)

    # ---- one iteration ----

    def step(self) -> list[EngineOutput]:
        preempted = self._reserve_decode_blocks()
        decoding = list(self._running)
        admitted, cached_now = ([], {}) if preempted else self._admit_waiting()

        prefill_tokens = 0
        for seq in admitted:
            prefill_tokens += len(seq.tokens) - seq.num_computed
            seq.num_computed = len(seq.tokens)
        for seq in decoding:
            seq.num_computed += 1
        batch = decoding + admitted
        context = sum(seq.num_computed for seq in batch)
        duration = self.profile.step_s(prefill_tokens, len(batch), context)
        self._clock += duration
        self._last_timing = StepTiming(
            duration_s=duration,
            batch_size=len(batch),
            prefill_tokens=prefill_tokens,
            extra={
                "context_tokens": context,
                "admitted": [s.request.request_id for s in admitted],
                "preempted": preempted,
                "cached_tokens": sum(cached_now.values()),
            },
        )

        outputs = []
        for seq in batch:
            self._commit_full_blocks(seq)
            outputs.append(self._emit(seq, cached_now.get(seq.request.request_id)))
        return outputs

    # ---- internals ----

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self._block_size)

    def _reserve_decode_blocks(self) -> list[str]:
        """Give each running sequence room for one more token, preempting the newest if needed."""
        preempted: list[str] = []
        i = 0
        while i < len(self._running):
            seq = self._running[i]
            need = self._blocks_for(seq.num_computed + 1) - len(seq.blocks)
            while need > self._pool.num_free():
                victim = self._running.pop()
                self._preempt(victim)
                preempted.append(victim.request.request_id)
                if victim is seq:
                    break
            else:
                for _ in range(need):
                    seq.blocks.append(self._pool.allocate())
                i += 1
        return preempted

    def _preempt(self, seq: _Sequence) -> None:
        # Recompute later: the sampled tokens become part of the prompt to prefill again.
        self._free_blocks(seq)
        self._waiting.insert(0, seq)

    def _admit_waiting(self) -> tuple[list[_Sequence], dict[str, int]]:
        admitted: list[_Sequence] = []
        cached: dict[str, int] = {}
        while self._waiting and len(self._running) < self.max_num_seqs:
            seq = self._waiting[0]
            hits = self._prefix_hits(seq)
            need_new = self._blocks_for(len(seq.tokens)) - len(hits)
            reclaimed = sum(1 for b, _ in hits if self._pool.ref[b] == 0)
            if need_new > self._pool.num_free() - reclaimed:
                break
            self._waiting.pop(0)
            for block, block_hash in hits:
                self._pool.touch(block)
                seq.blocks.append(block)
                seq.block_hashes.append(block_hash)
            for _ in range(need_new):
                seq.blocks.append(self._pool.allocate())
            seq.num_computed = len(hits) * self._block_size
            cached[seq.request.request_id] = seq.num_computed
            self._running.append(seq)
            admitted.append(seq)
        return admitted, cached

    def _prefix_hits(self, seq: _Sequence) -> list[tuple[int, int]]:
        """Leading cached blocks of the sequence; the last token is always recomputed for logits."""
        hits = []
        parent = _ROOT_HASH
        bs = self._block_size
        for start in range(0, (len(seq.tokens) - 1) // bs * bs, bs):
            block_hash = hash((parent, tuple(seq.tokens[start:start + bs])))
            block = self._pool.lookup(block_hash)
            if block is None:
                break
            hits.append((block, block_hash))
            parent = block_hash
        return hits

    def _commit_full_blocks(self, seq: _Sequence) -> None:
        full = seq.num_computed // self._block_size
        bs = self._block_size
        while len(seq.block_hashes) < full:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else _ROOT_HASH
            block_hash = hash((parent, tuple(seq.tokens[i * bs:(i + 1) * bs])))
            self._pool.commit(seq.blocks[i], block_hash)
            seq.block_hashes.append(block_hash)

    def _free_blocks(self, seq: _Sequence) -> None:
        # Tail blocks first, so the shared prefix is the last to be evicted (as in vLLM).
        for block in reversed(seq.blocks):
            self._pool.release(block)
        seq.blocks.clear()
        seq.block_hashes.clear()
        seq.num_computed = 0

    def _emit(self, seq: _Sequence, cached_tokens: int | None) -> EngineOutput:
        rid = seq.request.request_id
        new_ids: list[int] = []
        if seq.generated < len(seq.script):
            new_ids = [seq.script[seq.generated]]
            seq.tokens.extend(new_ids)
        reason = None
        if seq.generated >= len(seq.script):
            reason = "stop"
        elif (seq.generated >= seq.request.max_tokens
              or len(seq.tokens) >= self.profile.max_model_len):
            reason = "length"
        report_cache = None
        if not seq.reported_cache:
            seq.reported_cache = True
            report_cache = cached_tokens if cached_tokens is not None else 0
        if reason is not None:
            self._running.remove(seq)
            del self._by_id[rid]
            self._free_blocks(seq)
        return EngineOutput(
            request_id=rid,
            new_token_ids=new_ids,
            new_text=self.tokenizer.decode(new_ids),
            finished=reason is not None,
            finish_reason=reason,
            num_cached_tokens=report_cache,
        )
