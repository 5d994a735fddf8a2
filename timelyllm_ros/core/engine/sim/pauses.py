"""Pause handling of the simulated engine (LAMPS / INFERCEPT).

The scheduler uses it when a policy asks for it: a running request can be suspended with
`suspend_request(id, handling)` and continued later by `resume_request(id, new_request)`, where
the new request's prompt is the old prompt plus the tokens to keep (as the scheduler resubmits a
suspended generation). The handlings are defined once, in `core.engine.base`:
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

These are the models of the real engine's two paths (core/engine/vllm_engine.py): "preserve" is a
parked vLLM streaming-input session (its blocks stay allocated, the resume computes only the one
token vLLM drops plus any appended input, and the engine evicts parked sessions under KV or slot
pressure: `evict_paused`, chosen by core/engine/eviction.py), "discard" is abort + resubmit through
the prefix cache (every full block comes back, the partial last block is computed again).
`timelyllm profile` measures both on the real engine (resume_preserve_s / resume_discard_s in
the profile) so that the cost model prices them as the real engine runs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from timelyllm_ros.core.engine.base import DISCARD, PAUSE_HANDLINGS, PRESERVE, SWAP, EngineRequest
from timelyllm_ros.core.engine.eviction import ParkedGeneration
from timelyllm_ros.core.engine.sim.blocks import _BlockPool
from timelyllm_ros.core.engine.sim.requests import _Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case, compared at C speed
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(eq=False)
class _Paused:
    seq: _Sequence
    handling: str
    since: float
    host_tokens: int = 0  # swap: tokens of context held on the host


class PauseHandling:
    """Mixin of `SimulatedEngine`: suspended requests and what happens to their KV."""

    _clock: float
    _block_size: int
    _pool: _BlockPool
    _waiting: list[_Sequence]
    _running: list[_Sequence]
    _by_id: dict[str, _Sequence]
    # (`_grammar_ready_s`, when a resumed request's grammar is ready, is RequestQueues'.)

    def _init_pauses(self, kv_bytes_per_token: float, host_link_bytes_per_s: float) -> None:
        if not (kv_bytes_per_token > 0 and host_link_bytes_per_s > 0):
            raise ValueError("kv_bytes_per_token and host_link_bytes_per_s must be > 0")
        self.kv_bytes_per_token = float(kv_bytes_per_token)
        self.host_link_bytes_per_s = float(host_link_bytes_per_s)
        self._paused: dict[str, _Paused] = {}  # insertion order = oldest pause first
        # Swap-out seconds owed by suspensions since the last step, charged to the next batch.
        self._pending_swap_s = 0.0
        self.pause_stats: dict[str, float] = {
            PRESERVE: 0, DISCARD: 0, SWAP: 0, "preserve_revoked": 0, "swap_out_tokens": 0,
            "swap_in_tokens": 0, "swap_out_s": 0.0, "swap_in_s": 0.0,
            "preserved_block_s": 0.0,  # integral of pinned blocks over (virtual) time
        }

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
            seq.ready_s = self._grammar_ready_s(request)
            self._waiting.append(seq)
            return
        old = paused.seq
        common = common_prefix(old.tokens, seq.tokens)
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
        # Its KV is gone or off the engine: a new request to the engine, with a new grammar
        # (a preserved one keeps its matcher, above).
        seq.ready_s = self._grammar_ready_s(request)
        self._waiting.append(seq)

    def _release_paused(self, request_id: str) -> bool:
        """Forget paused `request_id`, freeing what a preserved pause still holds. False if it is
        not paused (then nothing happens)."""
        paused = self._paused.pop(request_id, None)
        if paused is None:
            return False
        self._free_blocks(paused.seq)  # no-op unless preserved
        return True

    def _swap_out_tokens(self, seq: _Sequence) -> int:
        """Context tokens a swap-out copies to the host: those in blocks the request holds alone
        (blocks shared with others stay on the device)."""
        bs = self._block_size
        out_tokens = 0
        for i, block in enumerate(seq.blocks):
            if self._pool.ref[block] == 1:
                out_tokens += max(0, min(bs, seq.num_computed - i * bs))
        return out_tokens

    def _swap_in_rest(self, seq: _Sequence, cached_tokens: int) -> tuple[int, float]:
        """At admission, after the prefix cache served `cached_tokens` of `seq`: copy back from
        the host whatever more of its context a swap pause saved. Returns (tokens computed,
        swap-in seconds)."""
        computed = cached_tokens
        cost = 0.0
        if seq.swap_tokens > computed:
            tokens_in = seq.swap_tokens - computed
            cost = self._swap_s(tokens_in)
            self.pause_stats["swap_in_tokens"] += tokens_in
            self.pause_stats["swap_in_s"] += cost
            computed = seq.swap_tokens
        seq.swap_tokens = 0
        return computed, cost

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

    def evict_paused(self, request_id: str, reason: str = "scheduler") -> int:
        """Revoke one preserved pause (its blocks freed as by a discard); returns its context
        tokens, 0 if it is not a preserved pause."""
        paused = self._paused.get(request_id)
        if paused is None or paused.handling != PRESERVE:
            return 0
        held = paused.seq.num_computed  # (freeing the blocks forgets what they held)
        self.pause_stats["preserved_block_s"] += len(paused.seq.blocks) * (
            self._clock - paused.since)
        self._free_blocks(paused.seq)
        paused.handling = DISCARD
        self.pause_stats["preserve_revoked"] += 1
        return held

    def paused_generations(self) -> list[ParkedGeneration]:
        """Preserved pauses for core.engine.eviction (resume_in_s unknown here: 0), each with the
        blocks its eviction frees (those no other request references)."""
        ref = self._pool.ref
        return [ParkedGeneration(rid, p.seq.num_computed,
                                 sum(1 for b in p.seq.blocks if ref[b] == 1), 0.0)
                for rid, p in self._paused.items() if p.handling == PRESERVE]

    def num_paused(self) -> int:
        return len(self._paused)

    def paused_handling(self, request_id: str) -> str | None:
        paused = self._paused.get(request_id)
        return None if paused is None else paused.handling

    def pinned_blocks(self) -> int:
        """Blocks held by preserved (paused) requests."""
        return sum(len(p.seq.blocks) for p in self._paused.values())
