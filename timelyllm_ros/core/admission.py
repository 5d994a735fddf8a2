"""Deciding whether the next queued generation may join the running batch (paper §4.4).

Larger batches raise throughput but slow every running generation's next token, by an amount
that is hard to predict. TimelyLLM sidesteps the prediction: a segment has a known length bound
(max_segment_tokens), so the worst case for the most urgent running generation is its remaining
tokens divided by the speed measured over the last few steps. Admit only while that worst case
fits its remaining budget, then wait `lag_steps` engine steps so the next decision sees the
speed *with* the newcomer in the batch.

Every controller here has the same interface so the scheduler can swap them:
`may_admit(running, rate, free_kv_blocks, blocks_needed) -> (bool, reason)`, plus
`note_admission()` after it actually admitted and `note_step()` after each engine step.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

# (tokens generated so far in the current segment, remaining time budget in seconds)
RunningInfo = tuple[int, float]


class TokenRateMeter:
    """Decode speed in tokens/s over the last `window` engine steps.

    Feed it the tokens that *one* running generation gains per step (1 for a decode step),
    not the batch total: the admission check asks how fast a single generation advances, and the
    batch total would overstate that by the batch size.
    """

    def __init__(self, window: int = 8):
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = int(window)
        self._steps: deque[tuple[float, float]] = deque(maxlen=self.window)

    def record(self, duration_s: float, tokens: float = 1) -> None:
        duration_s = float(duration_s)
        tokens = float(tokens)
        if not (math.isfinite(duration_s) and duration_s >= 0):
            raise ValueError(f"step duration must be finite and >= 0, got {duration_s}")
        if not (math.isfinite(tokens) and tokens >= 0):
            raise ValueError(f"step tokens must be finite and >= 0, got {tokens}")
        self._steps.append((duration_s, tokens))

    @property
    def rate(self) -> float | None:
        """tokens/s, or None until steps with non-zero duration and tokens were measured."""
        # Summing a window of ~8 each time is cheaper than guarding running totals from drift.
        d = sum(s[0] for s in self._steps)
        t = sum(s[1] for s in self._steps)
        if d <= 0 or t <= 0:
            return None
        return t / d

    def __len__(self) -> int:
        return len(self._steps)

    def reset(self) -> None:
        self._steps.clear()


def _blocks_ok(free_kv_blocks: int, blocks_needed: int) -> tuple[bool, str]:
    if blocks_needed > free_kv_blocks:
        return False, f"kv blocks: need {blocks_needed}, free {free_kv_blocks}"
    return True, ""


class LatencyGuidedAdmission:
    """Latency-guided batch size selection (§4.4).

    `skip_late`: a running generation whose budget is already negative cannot be saved by
    refusing admissions, and under overload most running generations are late; checking them
    would stop all admissions until the batch drained to one generation at a time. So by
    default the most urgent generation is the one with the smallest *non-negative* budget. Pass
    skip_late=False for the literal rule (smallest budget, late or not).
    """

    def __init__(self, max_segment_tokens: int = 10, lag_steps: int = 1, *, skip_late: bool = True):
        if max_segment_tokens < 1:
            raise ValueError("max_segment_tokens must be >= 1")
        if lag_steps < 0:
            raise ValueError("lag_steps must be >= 0")
        self.max_segment_tokens = int(max_segment_tokens)
        self.lag_steps = int(lag_steps)
        self.skip_late = skip_late
        # Steps measured since the last admission; starts "long ago".
        self._steps_since_admission = self.lag_steps

    def may_admit(self, running: Sequence[RunningInfo], rate: float | None,
                  free_kv_blocks: int, blocks_needed: int) -> tuple[bool, str]:
        ok, why = _blocks_ok(free_kv_blocks, blocks_needed)
        if not ok:
            return False, why
        if not running:
            return True, "no running generation to protect"
        if self._steps_since_admission < self.lag_steps:
            left = self.lag_steps - self._steps_since_admission
            return False, f"lag: waiting {left} more step(s) to measure the last admission"
        candidates = [r for r in running if r[1] >= 0] if self.skip_late else list(running)
        if not candidates:
            return True, "every running generation is already past its budget"
        tokens_generated, budget_s = min(candidates, key=lambda r: r[1])
        if rate is None or not (rate > 0 and math.isfinite(rate)):
            return True, "generation speed not measured yet"
        remaining = max(0, self.max_segment_tokens - int(tokens_generated))
        worst_s = remaining / rate
        if worst_s > budget_s:
            return False, (f"most urgent running generation needs up to {worst_s:.3f} s"
                           f" ({remaining} tokens at {rate:.1f} tok/s), budget {budget_s:.3f} s")
        return True, f"worst case {worst_s:.3f} s fits budget {budget_s:.3f} s"

    def note_admission(self) -> None:
        self._steps_since_admission = 0

    def note_step(self) -> None:
        self._steps_since_admission += 1


class FixedBatchCap:
    """At most `cap` running generations (the batch-cap sweep), KV blocks permitting."""

    def __init__(self, cap: int):
        if cap < 1:
            raise ValueError("cap must be >= 1")
        self.cap = int(cap)

    def may_admit(self, running: Sequence[RunningInfo], rate: float | None,
                  free_kv_blocks: int, blocks_needed: int) -> tuple[bool, str]:
        ok, why = _blocks_ok(free_kv_blocks, blocks_needed)
        if not ok:
            return False, why
        if len(running) >= self.cap:
            return False, f"batch cap {self.cap} reached"
        return True, f"{len(running)} < cap {self.cap}"

    def note_admission(self) -> None:
        pass

    def note_step(self) -> None:
        pass


class BlocksOnlyAdmission:
    """Admit whenever KV blocks suffice (vLLM's own behaviour, for policies without §4.4)."""

    def may_admit(self, running: Sequence[RunningInfo], rate: float | None,
                  free_kv_blocks: int, blocks_needed: int) -> tuple[bool, str]:
        ok, why = _blocks_ok(free_kv_blocks, blocks_needed)
        return (True, "kv blocks suffice") if ok else (False, why)

    def note_admission(self) -> None:
        pass

    def note_step(self) -> None:
        pass
