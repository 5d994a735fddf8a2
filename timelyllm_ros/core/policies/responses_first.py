"""What the planner's policies share: responses (first segments) rank above every resume, and
a suspension keeps its KV while preserved pauses hold at most a given share of the cache.

Used by the default `timelyllm-pred` (core/policies/predictive.py) and by `timelyllm-wc`
(core/policies/work_conserving.py), the previous default, kept for the comparison.
"""

from __future__ import annotations

import numpy as np

from timelyllm_ros.core.engine.base import DISCARD, PRESERVE
from timelyllm_ros.core.sched.interface import PauseInfo
from timelyllm_ros.core.sched.queue_view import QueueView

# Added to a first segment's priority so that it ranks above every resume. PUD values are
# bounded by U0 / g^2 (U0 <= 1e3, g >= 1 ms: 1e9); the offset keeps the classes apart and PUD's
# order within each.
RESPONSE_OFFSET = 1e12


def responses_first(priorities: np.ndarray, view: QueueView) -> np.ndarray:
    """`priorities` with every queued first segment (a response) raised above every resume,
    each class keeping its own order (in place; returned for chaining)."""
    priorities[view.segment_index == 0] += RESPONSE_OFFSET
    return priorities


def preserve_within_share(pause: PauseInfo, kv_share: float) -> str:
    """Preserve (keep the KV: the resume computes one token) while preserved pauses hold at
    most `kv_share` of the KV cache; discard beyond (the resume recomputes the last partial
    block, the prefix cache serves the rest while it holds it). Under KV pressure the engine
    revokes preserves before it preempts anything running."""
    ctx = pause.context
    if pause.pinned_blocks is None:
        return DISCARD
    own = -(-pause.context_tokens // ctx.kv_block_size)
    if pause.pinned_blocks + own <= kv_share * ctx.kv_total_blocks:
        return PRESERVE
    return DISCARD
