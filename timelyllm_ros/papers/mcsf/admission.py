"""MC-SF's look-ahead as an admission controller for our scheduler, in whole KV blocks: what
the `mcsf` policies use (the round-based reproduction works in tokens, `unit_model`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from timelyllm_ros.papers.mcsf.unit_model import as_pairs

# (context tokens now, most tokens it may still generate before its segment bound)
LookaheadInfo = tuple[int, int]


class McsfAdmission:
    """MC-SF's look-ahead as an admission controller for the real scheduler, in KV blocks.

    The budget is `kv_capacity_tokens // block_size` blocks, and a sequence with c tokens of
    context holds ceil(c / block_size) blocks, as a paged KV cache allocates them.

    How a scheduler uses it (this is the contract the tests pin):

    * Every time it considers admitting a queued generation, call
      `may_admit_lookahead(running, candidate)` with
        - running: one (context_tokens, max_remaining_tokens) per generation in the running
          batch, where context_tokens = prompt + tokens generated so far (what its KV holds now)
          and max_remaining_tokens = max_segment_tokens - tokens generated in the current segment
          (the segment bound makes it a hard bound, so the check can never be wrong);
        - candidate: (prompt + tokens generated in earlier segments, max_segment_tokens).
    * Admit several in one step by appending each admitted candidate to `running` before asking
      about the next one.
    * Offer candidates in the policy's order and stop at the first refusal, as MC-SF does; a
      scheduler that wants MC-SF's own order sorts by max_segment_tokens first.
    * Call it again every engine step (MC-SF re-plans each iteration); there is no lag state.

    `may_admit` keeps the generic interface of core.admission for drop-in use, but that interface
    carries no context sizes, so it can only check free blocks; `lookahead` tells a scheduler that
    the richer call exists.
    """

    lookahead = True

    def __init__(self, kv_capacity_tokens: int, block_size: int = 16):
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        if kv_capacity_tokens < block_size:
            raise ValueError("kv_capacity_tokens must hold at least one block")
        self.block_size = int(block_size)
        self.capacity_blocks = int(kv_capacity_tokens) // self.block_size

    def peak_blocks(self, requests: Sequence[LookaheadInfo]) -> tuple[int, int]:
        """(most blocks the batch will hold at once, tokens-ahead offset where that happens).

        At offset k a request with (c, r) holds ceil((c + k) / B) blocks while k <= r. Each term
        only grows until its request completes, so the maxima sit at completion offsets."""
        arr = as_pairs(requests)
        if arr.shape[0] == 0:
            return 0, 0
        if (arr < 0).any():
            raise ValueError("context and remaining tokens must be >= 0")
        ctx, rem = arr[:, 0], arr[:, 1]
        offsets = np.unique(rem)
        active = rem[:, None] >= offsets[None, :]
        blocks = -(-(ctx[:, None] + offsets[None, :]) // self.block_size)
        usage = np.where(active, blocks, 0).sum(axis=0)
        j = int(np.argmax(usage))
        return int(usage[j]), int(offsets[j])

    def may_admit_lookahead(self, running: Sequence[LookaheadInfo],
                            candidate: LookaheadInfo) -> tuple[bool, str]:
        c_ctx, c_rem = int(candidate[0]), int(candidate[1])
        alone = -(-(c_ctx + c_rem) // self.block_size)
        if alone > self.capacity_blocks:
            return False, (f"candidate alone peaks at {alone} blocks > capacity"
                           f" {self.capacity_blocks}")
        peak, at = self.peak_blocks(list(running) + [(c_ctx, c_rem)])
        if peak > self.capacity_blocks:
            return False, (f"look-ahead: {at} tokens ahead the batch would hold {peak} blocks"
                           f" > capacity {self.capacity_blocks}")
        return True, f"look-ahead peak {peak}/{self.capacity_blocks} blocks at +{at} tokens"

    def may_admit(self, running, rate, free_kv_blocks: int, blocks_needed: int) -> tuple[bool, str]:
        if blocks_needed > free_kv_blocks:
            return False, f"kv blocks: need {blocks_needed}, free {free_kv_blocks}"
        return True, "kv blocks suffice (no context sizes given: use may_admit_lookahead)"

    def note_admission(self) -> None:
        pass

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None:
        pass
