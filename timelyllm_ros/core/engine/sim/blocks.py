"""Paged KV blocks with automatic prefix caching, as vLLM V1 keeps them.

The cache is `num_blocks` blocks of `block_size` tokens. Every full block a request computed is
identified by a hash chained over the token ids of all blocks before it, so one hash names one
whole prefix. A new request reuses the longest run of cached blocks of its prompt and only pays
prefill for the rest. Blocks of finished or aborted requests stay cached but count as free, and
are evicted least-recently-freed first when a block is needed; this is what makes a resumed
generation (prompt = original prompt + generated tokens) cheap.

`_BlockPool` is the bookkeeping (reference counts, hash -> block map, LRU free queue);
`PrefixCachedKv` is the engine's side of it: hashing a request's tokens, looking them up,
attaching hits, committing newly filled blocks and releasing a request's blocks. Engine variants
override those methods (no prefix cache, BROS's private slots), so they stay engine methods.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

from timelyllm_ros.core.engine.base import KvUsage

if TYPE_CHECKING:
    from timelyllm_ros.core.engine.sim.requests import _Sequence

# Parent of the first block in the hash chain. Ints and tuples of ints hash identically in every
# process (unlike None), so cache behaviour is reproducible across runs.
_ROOT_HASH = 0


def chained_block_hash(parent: int, block_tokens: Sequence[int]) -> int:
    """Hash of a full block given its parent's hash: equal hashes mean equal whole prefixes."""
    return hash((parent, tuple(block_tokens)))


def _blocks_of(tokens: Sequence[int], first: int, stop: int, block_size: int):
    """Blocks `first` .. `stop - 1` of `tokens`, each a tuple of `block_size` tokens (stop must
    not pass the last full block)."""
    it = iter(tokens[first * block_size:stop * block_size])
    return zip(*[it] * block_size)


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

    def touch_all(self, blocks) -> None:
        """`touch` each block, in order (one call for a prompt's hundreds of cached blocks)."""
        ref, free = self.ref, self.free
        for block in blocks:
            if ref[block] == 0:
                del free[block]
            ref[block] += 1

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

    def release_all(self, blocks) -> None:
        """`release` each block, in order."""
        ref, free = self.ref, self.free
        for block in blocks:
            ref[block] -= 1
            if ref[block] == 0:
                free[block] = None

    def commit(self, block: int, block_hash: int) -> None:
        # An identical block computed twice keeps the first mapping, as vLLM does.
        if self.hash_of[block] is None and block_hash not in self.cached:
            self.cached[block_hash] = block
            self.hash_of[block] = block_hash


class PrefixCachedKv:
    """Mixin of `SimulatedEngine`: a request's KV blocks and the prefix cache behind them."""

    _block_size: int
    _pool: _BlockPool

    def _init_kv(self, num_blocks: int, block_size: int) -> None:
        self._block_size = block_size
        self._pool = _BlockPool(num_blocks)

    def kv_usage(self) -> KvUsage:
        return KvUsage(self._pool.num_free(), self._pool.num_blocks, self._block_size)

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self._block_size)

    def _prefix_hits(self, seq: _Sequence) -> list[tuple[int, int]]:
        """Leading cached blocks of the sequence; the last token is always recomputed for logits."""
        hits = []
        parent = _ROOT_HASH
        lookup = self._pool.cached.get  # _BlockPool.lookup, inlined: this runs per block
        # hash((parent, block)) is chained_block_hash; the blocks are cut into tuples at C speed
        # (a prompt of thousands of tokens is hundreds of blocks, looked up on every admission).
        for block_tokens in _blocks_of(seq.tokens, 0, (len(seq.tokens) - 1) // self._block_size,
                                       self._block_size):
            block_hash = hash((parent, block_tokens))
            block = lookup(block_hash)
            if block is None:
                break
            hits.append((block, block_hash))
            parent = block_hash
        return hits

    def _attach_prefix_hits(self, seq: _Sequence, hits: list[tuple[int, int]]) -> tuple[int, float]:
        """Give an admitted sequence its cached blocks and, after a swap pause, copy back the
        part of its host copy the cache no longer holds (`_swap_in_rest`, pauses.py). Returns
        (tokens computed, swap-in s)."""
        blocks = [block for block, _ in hits]
        self._pool.touch_all(blocks)
        seq.blocks.extend(blocks)
        seq.block_hashes.extend([block_hash for _, block_hash in hits])
        return self._swap_in_rest(seq, len(hits) * self._block_size)

    def _commit_full_blocks(self, seq: _Sequence) -> None:
        """Enter the blocks `seq` filled completely into the prefix cache."""
        done = len(seq.block_hashes)
        full = seq.num_computed // self._block_size
        if done >= full:
            return
        hashes = seq.block_hashes
        parent = hashes[-1] if hashes else _ROOT_HASH
        commit = self._pool.commit
        for i, block_tokens in enumerate(_blocks_of(seq.tokens, done, full, self._block_size),
                                         start=done):
            parent = hash((parent, block_tokens))  # chained_block_hash
            commit(seq.blocks[i], parent)
            hashes.append(parent)

    def _free_blocks(self, seq: _Sequence) -> None:
        # Tail blocks first, so the shared prefix is the last to be evicted (as in vLLM).
        self._pool.release_all(reversed(seq.blocks))
        seq.blocks.clear()
        seq.block_hashes.clear()
        seq.num_computed = 0
        seq.prefill_pending = False
