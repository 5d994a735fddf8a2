"""BROS's view of a request, the RT / BE classes and the SLOs, and how fleet work maps onto them.

`BrosRequest` is one request's state as the selector sees it in one iteration. The robot mapping
(`classify_robot_work`, `segment_request`, `split_queue`) decides which fleet work is real-time
(RT) and which is best-effort (BE), and expresses a segment generation as a BROS request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np

RT = "rt"
BE = "be"
KINDS = (RT, BE)

# Default SLOs of the paper's evaluation (seconds).
TTFT_SLO_S = 0.4
TPOT_SLO_S = 0.2

# Float slack for time comparisons: 0.2 - 0.12 is 0.08000000000000002, and the paper's
# comparisons are inclusive.
TIME_TOLERANCE_S = 1e-9


@dataclass
class BrosRequest:
    """One request's state as the selector sees it in one iteration.

    new_tokens: Ln_i, tokens fed in this iteration (the uncached prompt for a prefill, 1 for a
        decode).
    context_tokens: La_i, tokens attended over, new ones included (equals new_tokens for a
        prefill without cached prefix).
    t_since_token_s: t_i, time since its last token (since arrival before the first one).
    tokens_left: k_i, tokens left in its current token group (1 for per-token SLOs; for a robot,
        the tokens left in the segment).
    slo_s: T_SLO of the token being waited for (TTFT before the first token, TPOT after).
    host_slots: KV slots checkpointed in host memory; they must be swapped in before it runs.
    """

    req_id: Hashable
    kind: str = RT
    prefill: bool = False
    new_tokens: int = 1
    context_tokens: int = 1
    t_since_token_s: float = 0.0
    tokens_left: int = 1
    slo_s: float = math.inf
    host_slots: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"request {self.req_id!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.new_tokens < 0 or self.context_tokens < 0 or self.host_slots < 0:
            raise ValueError(f"request {self.req_id!r}: token counts must be >= 0")
        if self.tokens_left < 1:
            raise ValueError(f"request {self.req_id!r}: tokens_left must be >= 1")

    def slack(self, t_avg_s: float) -> float:
        """Time the token now due may still take, if the rest of its group then runs back to back."""
        return self.slo_s - self.t_since_token_s - (self.tokens_left - 1) * t_avg_s

    @property
    def slots_needed(self) -> int:
        """KV slots this iteration writes on the device: new tokens plus swapped-in ones."""
        return self.new_tokens + self.host_slots




# --------------------------------------------------------------------------------------------
# Robot mapping
# --------------------------------------------------------------------------------------------

ROBOT_KINDS = ("segment", "chat", "background")


def classify_robot_work(*, urgent: bool, kind: str = "segment", slack_s: float = 0.0,
                        be_slack_s: float = 5.0) -> str:
    """RT or BE for one piece of fleet work.

    Urgent segments are RT whatever their slack. Chat replies and background jobs (batch
    analytics, log summaries) are BE: nobody's robot waits on them. A normal segment is BE only
    while its slack exceeds `be_slack_s` - it will be re-classified RT as its slack shrinks, so
    it cannot starve past its deadline.
    """
    if kind not in ROBOT_KINDS:
        raise ValueError(f"kind must be one of {ROBOT_KINDS}, got {kind!r}")
    if urgent:
        return RT
    if kind != "segment":
        return BE
    return BE if slack_s > be_slack_s else RT


def segment_request(req_id: Hashable, *, now_s: float, reference_s: float, deadline_s: float,
                    tokens_left: int, prefill: bool, new_tokens: int, context_tokens: int,
                    kind: str = RT, host_slots: int = 0) -> BrosRequest:
    """A segment generation as a BROS request.

    The segment is one token group: k_i = tokens left in it and T_SLO = its deadline (e.g.
    reference + TUF ERT), both measured from `reference_s` (the previous segment's completion,
    or task arrival), so slack = deadline - now - (k_i - 1) * T_avg.
    """
    return BrosRequest(req_id, kind=kind, prefill=prefill, new_tokens=new_tokens,
                       context_tokens=context_tokens, t_since_token_s=now_s - reference_s,
                       tokens_left=max(1, int(tokens_left)), slo_s=deadline_s - reference_s,
                       host_slots=host_slots)


def split_queue(view: Any, now_s: float, tokens_left: Sequence[int] | np.ndarray, *,
                t_avg_s: float, be_slack_s: float = 5.0,
                kinds: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of a policies.QueueView that are RT and BE. Deadline = reference + ERT (the
    column semantics of QueueView); `kinds` marks chat/background rows (default: all segments)."""
    n = len(view)
    deadline = np.asarray(view.reference_s) + np.asarray(view.ert_s)
    slack = deadline - now_s - np.asarray(tokens_left, dtype=np.float64) * t_avg_s
    urgent = np.asarray(view.is_urgent, dtype=bool)
    if kinds is None:
        is_seg = np.ones(n, dtype=bool)
    else:
        ks = np.asarray(kinds)
        bad = set(ks.tolist()) - set(ROBOT_KINDS)
        if bad:
            raise ValueError(f"unknown kinds {sorted(bad)}")
        is_seg = ks == "segment"
    is_rt = urgent | (is_seg & (slack <= be_slack_s))
    return np.flatnonzero(is_rt), np.flatnonzero(~is_rt)
