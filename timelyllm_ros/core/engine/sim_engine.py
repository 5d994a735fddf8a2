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
  when all running requests got their blocks, and only while blocks are free;
- `scheduling_policy="priority"` (vLLM's option of that name): waiting requests are admitted,
  and preemption victims chosen, by (priority, arrival) instead, the priority coming from the
  request's service class (`engine_priority`: best-effort work last). This is how a policy that
  separates real-time from best-effort work (BROS) orders the real engine from outside it.

Pause handling (LAMPS / INFERCEPT, used by the scheduler when a policy asks for it): a running
request can be suspended with `suspend_request(id, handling)` and continued later by
`resume_request(id, new_request)`, where the new request's prompt is the old prompt plus the
tokens to keep (as the scheduler resubmits a suspended generation):
- "discard": exactly `abort_request` - the blocks go to the evictable prefix cache and whatever is
  evicted by the time it resumes is prefilled again;
- "preserve": the blocks stay allocated (pinned, not free, not evictable) during the pause; the
  resumed request keeps them and computes only tokens they do not hold (usually the last one).
  Under KV pressure a preserved request is revoked (its blocks freed as by a discard) before any
  running request is preempted, and when nothing runs and a waiting request cannot be admitted;
- "swap": the blocks are freed (as by a discard, so the prefix cache may still serve them) and a
  host copy of the context is kept; swap-out time for the blocks the request held alone is added
  to the next step, and on resume the context not found in the prefix cache is copied back
  (swap-in time added to the admitting step) instead of being prefilled. Both copies are
  synchronous (INFERCEPT's waste equations assume they stall the batch):
  `t = tokens * kv_bytes_per_token / host_link_bytes_per_s` (defaults: 128 KiB per token, fp16
  Llama3-8B; 25 GB/s, a PCIe 4.0 x16 link). Host memory is unbounded.
`pause_stats` counts handlings, copies and revocations.

Token budget and chunked prefill (vLLM V1): a step computes at most
`profile.max_num_batched_tokens` tokens. Running requests are scheduled first (a decode takes one
token, a prompt still being prefilled its next chunk), then waiting requests while budget is
left; a prompt longer than what is left is prefilled in chunks over several steps and emits its
first token on the step that completes it. Without the budget one step could prefill a whole
burst of prompts (tens of thousands of tokens, seconds of virtual time) and stall every decode
and every arrival behind it, which vLLM never does. Simplification: a request's KV blocks for
its whole prompt are allocated when it is admitted (vLLM allocates them chunk by chunk), so a
long prompt reserves its memory one or two steps early.

What it does not model: sampling, structured outputs (`output_regex` is ignored: the script is
assumed valid), and an extra EOS step (a request finishes on the step that emits the last token
of its script).
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

from timelyllm_ros.core.engine.base import (ENGINE_SCHEDULING, EngineOutput, EngineRequest, KvUsage,
                                            StepTiming, engine_priority)
from timelyllm_ros.core.engine.cost_model import EngineProfile


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


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
    # Resumed after a pause: tokens restorable from the host copy (swap) at admission.
    swap_tokens: int = 0
    arrival_s: float = 0.0  # when the engine received it (ties in priority scheduling)
    # Admitted, but its prompt is not all computed yet (chunked prefill over several steps).
    prefill_pending: bool = False
    cached_at_admission: int = 0  # reported with its first token
    chunk: int = 0  # tokens it computes in the step being scheduled

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len


PRESERVE, DISCARD, SWAP = "preserve", "discard", "swap"
PAUSE_HANDLINGS = (PRESERVE, DISCARD, SWAP)


@dataclass(eq=False)
class _Paused:
    seq: _Sequence
    handling: str
    since: float
    host_tokens: int = 0  # swap: tokens of context held on the host


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
        kv_bytes_per_token: float = 131072.0,
        host_link_bytes_per_s: float = 25e9,
        scheduling_policy: str = "fcfs",
    ) -> None:
        self.profile = profile if profile is not None else EngineProfile()
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if scheduling_policy not in ENGINE_SCHEDULING:
            raise ValueError(f"scheduling_policy must be one of {ENGINE_SCHEDULING}, got "
                             f"{scheduling_policy!r}")
        self.scheduling_policy = scheduling_policy
        self.max_num_seqs = max_num_seqs
        self._step_tokens = self.profile.max_num_batched_tokens
        if self._step_tokens < max_num_seqs:
            # vLLM refuses this too: a full batch of decodes would not fit one step.
            raise ValueError(f"max_num_batched_tokens ({self._step_tokens}) must be >= "
                             f"max_num_seqs ({max_num_seqs})")
        self._budget = self._step_tokens  # tokens left in the step being scheduled
        self.tokenizer = tokenizer if tokenizer is not None else PieceTokenizer()
        self._clock = float(start_time)
        self._block_size = self.profile.kv_block_size
        self._pool = _BlockPool(self.profile.kv_total_blocks)
        self._waiting: list[_Sequence] = []
        self._running: list[_Sequence] = []
        self._by_id: dict[str, _Sequence] = {}
        self._last_timing = StepTiming()
        if not (kv_bytes_per_token > 0 and host_link_bytes_per_s > 0):
            raise ValueError("kv_bytes_per_token and host_link_bytes_per_s must be > 0")
        self.kv_bytes_per_token = float(kv_bytes_per_token)
        self.host_link_bytes_per_s = float(host_link_bytes_per_s)
        self._paused: dict[str, _Paused] = {}  # insertion order = oldest pause first
        self._pending_swap_s = 0.0
        self.pause_stats: dict[str, float] = {
            PRESERVE: 0, DISCARD: 0, SWAP: 0, "preserve_revoked": 0, "swap_out_tokens": 0,
            "swap_in_tokens": 0, "swap_out_s": 0.0, "swap_in_s": 0.0,
            "preserved_block_s": 0.0,  # integral of pinned blocks over (virtual) time
        }

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

    def max_num_batched_tokens(self) -> int:
        return self._step_tokens

    # ---- requests ----

    def add_request(self, request: EngineRequest) -> None:
        self._waiting.append(self._new_sequence(request))

    def _new_sequence(self, request: EngineRequest) -> _Sequence:
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
        if rid in self._paused:
            raise ValueError(f"request {rid!r} is paused in the engine")
        script = self.tokenizer.tokenize(request.scripted_text or "")
        seq = _Sequence(request, prompt, len(prompt), script, arrival_s=self._clock)
        self._by_id[rid] = seq
        return seq

    def abort_request(self, request_id: str) -> None:
        paused = self._paused.pop(request_id, None)
        if paused is not None:
            self._free_blocks(paused.seq)  # no-op unless preserved
            return
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return
        if seq in self._running:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        self._free_blocks(seq)

    # ---- pauses (see module docstring) ----

    def suspend_request(self, request_id: str, handling: str) -> None:
        """Stop a request at a pause, keeping its KV as `handling` says (see module docstring).
        A request that has not been admitted yet holds nothing: it is simply aborted."""
        if handling not in PAUSE_HANDLINGS:
            raise ValueError(f"handling must be one of {PAUSE_HANDLINGS}, got {handling!r}")
        seq = self._by_id.get(request_id)
        if seq is None:
            return
        if handling == DISCARD or seq not in self._running:
            self.abort_request(request_id)
            self.pause_stats[DISCARD] += 1
            return
        del self._by_id[request_id]
        self._running.remove(seq)
        self.pause_stats[handling] += 1
        paused = _Paused(seq, handling, self._clock)
        if handling == SWAP:
            out_tokens = self._swap_out_tokens(seq)
            cost = self._swap_s(out_tokens)
            self._pending_swap_s += cost
            self.pause_stats["swap_out_tokens"] += out_tokens
            self.pause_stats["swap_out_s"] += cost
            paused.host_tokens = seq.num_computed
            self._free_blocks(seq)
        self._paused[request_id] = paused

    def resume_request(self, request_id: str, request: EngineRequest) -> None:
        """Continue paused `request_id` as `request` (prompt = old prompt + kept tokens); an id
        that is not paused (or was revoked) is an ordinary `add_request`."""
        paused = self._paused.get(request_id)
        seq = self._new_sequence(request)  # validates before anything is released
        self._paused.pop(request_id, None)
        if paused is None:
            self._waiting.append(seq)
            return
        old = paused.seq
        common = _common_prefix(old.tokens, seq.tokens)
        if paused.handling == PRESERVE and old.blocks:
            self.pause_stats["preserved_block_s"] += len(old.blocks) * (self._clock - paused.since)
            bs = self._block_size
            # The last prompt token is always computed again (its logits start the generation).
            keep = min(old.num_computed, common, len(seq.tokens) - 1)
            nb = math.ceil(keep / bs)
            if keep % bs and nb and self._pool.hash_of[old.blocks[nb - 1]] is not None:
                # Cut inside a committed (shareable) block: never write into it.
                nb -= 1
                keep = nb * bs
            for block in reversed(old.blocks[nb:]):
                self._pool.release(block)
            seq.blocks = old.blocks[:nb]
            seq.block_hashes = old.block_hashes[:keep // bs]
            seq.num_computed = keep
            old.blocks, old.block_hashes = [], []
            self._waiting.insert(0, seq)
            return
        if paused.handling == SWAP:
            seq.swap_tokens = min(paused.host_tokens, common, len(seq.tokens) - 1)
        self._waiting.append(seq)

    def _swap_out_tokens(self, seq: _Sequence) -> int:
        """Context tokens a swap-out copies to the host: those in blocks the request holds alone
        (blocks shared with others stay on the device)."""
        bs = self._block_size
        out_tokens = 0
        for i, block in enumerate(seq.blocks):
            if self._pool.ref[block] == 1:
                out_tokens += max(0, min(bs, seq.num_computed - i * bs))
        return out_tokens

    def num_paused(self) -> int:
        return len(self._paused)

    def paused_handling(self, request_id: str) -> str | None:
        paused = self._paused.get(request_id)
        return None if paused is None else paused.handling

    def pinned_blocks(self) -> int:
        """Blocks held by preserved (paused) requests."""
        return sum(len(p.seq.blocks) for p in self._paused.values())

    def _swap_s(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.host_link_bytes_per_s

    def _revoke_preserved(self) -> bool:
        """Free the oldest preserved request's blocks (it resumes like a discarded one)."""
        for paused in self._paused.values():
            if paused.handling == PRESERVE:
                self.pause_stats["preserved_block_s"] += len(paused.seq.blocks) * (
                    self._clock - paused.since)
                self._free_blocks(paused.seq)
                paused.handling = DISCARD
                self.pause_stats["preserve_revoked"] += 1
                return True
        return False

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
        for rid in list(self._by_id) + list(self._paused):
            self.abort_request(rid)

    # ---- one iteration ----

    def step(self) -> list[EngineOutput]:
        """One iteration, scheduled as vLLM V1 does: the running requests first (a decode takes
        one token of the step's budget, a prompt still being prefilled its next chunk), then
        waiting requests while budget and KV last. A request whose prompt is not all computed at
        the end of the step emits nothing yet."""
        self._budget = self._step_tokens
        preempted = self._reserve_decode_blocks()
        running = list(self._running)
        for seq in running:
            self._schedule_tokens(seq)
        admitted, swap_in_s = ([], 0.0) if preempted else self._admit_waiting()
        # A request the budget left out this step (behind an older chunked prefill) computes
        # nothing and keeps whatever it reserved for its next token.
        computing = self._decodes_computed([s for s in running if s.chunk])

        prefill_tokens = 0
        for seq in computing + admitted:
            if seq.prefill_pending:
                prefill_tokens += seq.chunk
            seq.num_computed += seq.chunk
            seq.prefill_pending = seq.num_computed < len(seq.tokens)
        batch = computing + admitted
        context = sum(seq.num_computed for seq in batch)
        duration = self.profile.step_s(prefill_tokens, len(batch), context)
        swap_s = 0.0
        if batch:
            swap_s = self._pending_swap_s + swap_in_s
            self._pending_swap_s = 0.0
            duration += swap_s
        self._clock += duration
        self._last_timing = StepTiming(
            duration_s=duration,
            batch_size=len(batch),
            prefill_tokens=prefill_tokens,
            extra={
                "context_tokens": context,
                "admitted": [s.request.request_id for s in admitted],
                "preempted": preempted,
                "cached_tokens": sum(s.cached_at_admission for s in admitted),
                "swap_s": swap_s,
                "scheduled_tokens": self._step_tokens - self._budget,
                "partial_prefills": sum(1 for seq in batch if seq.prefill_pending),
            },
        )

        outputs = []
        for seq in batch:
            self._commit_full_blocks(seq)
            if not seq.prefill_pending:
                outputs.append(self._emit(seq, seq.cached_at_admission))
        return outputs

    def _schedule_tokens(self, seq: _Sequence) -> None:
        """Give `seq` its tokens of this step's budget: one for a decode, else the next chunk of
        its prompt (as much as is left of the budget)."""
        seq.chunk = min(len(seq.tokens) - seq.num_computed, self._budget)
        self._budget -= seq.chunk

    def _admitted(self, seq: _Sequence, computed: int) -> None:
        """Book-keeping shared by every admission loop: `seq` starts with `computed` tokens
        already in the KV (prefix cache, kept blocks or host copy) and prefills the rest, chunk
        by chunk from this step on."""
        seq.num_computed = computed
        seq.cached_at_admission = computed
        seq.prefill_pending = True
        self._running.append(seq)
        self._schedule_tokens(seq)

    # ---- internals ----

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self._block_size)

    def _reserve_decode_blocks(self) -> list[str]:
        """Give each running sequence room for one more token, preempting if needed: the newest
        (FCFS), or the lowest-priority then newest (priority scheduling), as vLLM does."""
        preempted: list[str] = []
        i = 0
        while i < len(self._running):
            seq = self._running[i]
            need = self._blocks_for(seq.num_computed + 1) - len(seq.blocks)
            while need > self._pool.num_free():
                if self._revoke_preserved():
                    continue
                victim = self._preemption_victim()
                at = self._running.index(victim)
                del self._running[at]
                if at < i:
                    i -= 1  # it had its block already; the ones after it move up
                self._preempt(victim)
                preempted.append(victim.request.request_id)
                if victim is seq:
                    break
            else:
                for _ in range(need):
                    seq.blocks.append(self._pool.allocate())
                i += 1
        return preempted

    def _rank(self, seq: _Sequence) -> tuple[int, float]:
        """Sort key of priority scheduling: service class first, then arrival."""
        return engine_priority(seq.request.service_class), seq.arrival_s

    def _preemption_victim(self) -> _Sequence:
        if self.scheduling_policy == "priority":
            return max(self._running, key=self._rank)
        return self._running[-1]

    def _admission_groups(self) -> list[list[_Sequence]]:
        """Waiting requests in the order admission tries them, in groups: the first request of
        a group that does not fit ends that group. One group here (preempted requests are at
        the head of the FCFS queue, as in vLLM); a subclass may serve classes separately."""
        if self.scheduling_policy == "priority":
            return [sorted(self._waiting, key=self._rank)]
        return [list(self._waiting)]

    def _decodes_computed(self, decoding: list[_Sequence]) -> list[_Sequence]:
        """The running sequences (given after reservation and admission) that compute a token in
        this step: all of them here; a subclass may hold some back (KV partly off the device)."""
        return decoding

    def _preempt(self, seq: _Sequence) -> None:
        # Recompute later: the sampled tokens become part of the prompt to prefill again.
        self._free_blocks(seq)
        self._waiting.insert(0, seq)

    def _admit_waiting(self) -> tuple[list[_Sequence], float]:
        """Admit waiting requests in `_admission_groups` order while slots, token budget and KV
        last. Returns the admitted sequences and the swap-in time their admission costs."""
        admitted: list[_Sequence] = []
        swap_in_s = 0.0
        for group in self._admission_groups():
            for seq in group:
                if len(self._running) >= self.max_num_seqs or self._budget <= 0:
                    return admitted, swap_in_s
                plan = self._placement(seq)
                while plan is None and not self._running and not admitted \
                        and self._revoke_preserved():
                    plan = self._placement(seq)  # nothing else would ever free room for it
                if plan is None:
                    break
                self._waiting.remove(seq)
                computed, cost = self._place(seq, plan)
                swap_in_s += cost
                self._admitted(seq, computed)
                admitted.append(seq)
        return admitted, swap_in_s

    def _placement(self, seq: _Sequence):
        """What admitting waiting `seq` takes, if it fits now (else None): its prefix-cache
        hits and the blocks to allocate."""
        if seq.blocks:  # resumed after a preserved pause: it still holds its blocks
            hits: list[tuple[int, int]] = []
            need_new = self._blocks_for(len(seq.tokens)) - len(seq.blocks)
            reclaimed = 0
        else:
            hits = self._prefix_hits(seq)
            need_new = self._blocks_for(len(seq.tokens)) - len(hits)
            reclaimed = sum(1 for b, _ in hits if self._pool.ref[b] == 0)
        if need_new > self._pool.num_free() - reclaimed:
            return None
        return hits, need_new

    def _place(self, seq: _Sequence, plan) -> tuple[int, float]:
        """Give `seq` the KV its `_placement` found. Returns (tokens already computed, swap-in
        seconds)."""
        hits, need_new = plan
        if seq.blocks:
            computed, cost = seq.num_computed, 0.0
        else:
            computed, cost = self._attach_prefix_hits(seq, hits)
        for _ in range(need_new):
            seq.blocks.append(self._pool.allocate())
        return computed, cost

    def _attach_prefix_hits(self, seq: _Sequence, hits: list[tuple[int, int]]) -> tuple[int, float]:
        """Give an admitted sequence its cached blocks and, after a swap pause, copy back the
        part of its host copy the cache no longer holds. Returns (tokens computed, swap-in s)."""
        for block, block_hash in hits:
            self._pool.touch(block)
            seq.blocks.append(block)
            seq.block_hashes.append(block_hash)
        computed = len(hits) * self._block_size
        cost = 0.0
        if seq.swap_tokens > computed:
            tokens_in = seq.swap_tokens - computed
            cost = self._swap_s(tokens_in)
            self.pause_stats["swap_in_tokens"] += tokens_in
            self.pause_stats["swap_in_s"] += cost
            computed = seq.swap_tokens
        seq.swap_tokens = 0
        return computed, cost

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
        seq.prefill_pending = False

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
