"""Deciding whether the next queued generation may join the running batch (paper §4.4).

Larger batches raise throughput but slow every running generation's next token, by an amount
that is hard to predict. TimelyLLM sidesteps the prediction: a segment has a known length bound
(max_segment_tokens), so the worst case for a running generation is its remaining tokens divided
by the speed measured over the last few steps. An admission must not push a running generation
that still fits its budget over it; after such an admission the controller waits `lag_steps`
engine steps so the next decision sees the speed *with* the newcomer in the batch.

Every controller here is an `AdmissionController` (core.sched.interface), so the scheduler can
swap them: `may_admit(running, rate, free_kv_blocks, blocks_needed) -> (bool, reason)`, plus
`note_admission()` after it actually admitted and `note_step(duration_s=None, batch_size=None)`
after each engine step (the step's measurements feed `LatencyGuidedAdmission`'s speed model;
without them it assumes the current speed and relies on the lag); on a fleet whose replicas
step on their own, also `note_replica_step(replica, duration_s, batch_size)` (`ReplicaSpeed`).
`with_batch_cap` puts a fixed cap in front of any controller, a policy's own candidate-aware
one included.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from typing import Collection, Sequence

import numpy as np

from timelyllm_ros.core.sched.interface import (AdmissionController, AdmissionPass, Candidate,
                                                CandidateAdmission, RunningGen)

# (tokens generated so far in the current segment, remaining time budget in seconds), optionally
# followed by that generation's own segment length bound (max_segment_tokens of its skill set);
# without it the controller's `max_segment_tokens` applies.
RunningInfo = tuple[int, float] | tuple[int, float, int]


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


class BatchSpeedModel:
    """Step time as a function of batch size, measured over the last `window` engine steps.

    The admission check needs the speed *with* one more sequence in the batch before that
    sequence is there. Record (batch size, step duration) after every engine step; the step time
    at batch size n is predicted by a least-squares line over the window when it saw more than
    one batch size (slope clamped at >= 0: one more sequence never makes a step faster), and is
    the window's mean step time otherwise (nothing to extrapolate from; the admission's one-step
    lag then measures the real effect). Steps that prefill a newcomer are part of the window, so
    the slope also carries the admission's own prefill cost.
    """

    def __init__(self, window: int = 16):
        if window < 2:
            raise ValueError("window must be >= 2")
        self.window = int(window)
        self._steps: deque[tuple[float, float]] = deque(maxlen=self.window)
        # Shortest step ever recorded: a reference that, unlike the line over the window, does
        # not swing when the batch stays large (work_conserving's step cap).
        self.fastest_step_s: float | None = None

    def record(self, batch_size: int, duration_s: float) -> None:
        duration_s = float(duration_s)
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) \
                or batch_size < 0:
            raise ValueError(f"batch size must be an integer >= 0, got {batch_size!r}")
        if not (math.isfinite(duration_s) and duration_s >= 0):
            raise ValueError(f"step duration must be finite and >= 0, got {duration_s}")
        if batch_size == 0 or duration_s == 0:
            return  # an idle or instantaneous step says nothing about decode speed
        self._steps.append((float(batch_size), duration_s))
        if self.fastest_step_s is None or duration_s < self.fastest_step_s:
            self.fastest_step_s = duration_s

    def slope_s(self) -> float | None:
        """Seconds one more sequence adds to a step (>= 0), or None without two batch sizes."""
        if len(self._steps) < 2:
            return None
        b = np.fromiter((s[0] for s in self._steps), dtype=float, count=len(self._steps))
        d = np.fromiter((s[1] for s in self._steps), dtype=float, count=len(self._steps))
        db = b - b.mean()
        var = float(db @ db)
        if var <= 0:
            return None
        return max(0.0, float(db @ (d - d.mean())) / var)

    def step_time_s(self, batch_size: int) -> float | None:
        """Predicted duration of a step with `batch_size` sequences; None before any step."""
        if not self._steps:
            return None
        mean_b = sum(s[0] for s in self._steps) / len(self._steps)
        mean_d = sum(s[1] for s in self._steps) / len(self._steps)
        slope = self.slope_s()
        if slope is None:
            return mean_d
        return max(0.0, mean_d + slope * (batch_size - mean_b))

    def __len__(self) -> int:
        return len(self._steps)

    def reset(self) -> None:
        self._steps.clear()
        self.fastest_step_s = None


class ReplicaSpeed:
    """One replica's step times on a fleet whose replicas step on their own
    (`StepTiming.replica`): a `BatchSpeedModel` of its steps against its own batch, and the mean
    of its last `recent_steps` steps (what the scheduler's `TokenRateMeter` measures for one
    engine, over `SchedulerConfig.rate_window_steps`, 8 by default)."""

    def __init__(self, window: int = 16, recent_steps: int = 8):
        self.model = BatchSpeedModel(window)
        self._recent = TokenRateMeter(recent_steps)

    def record(self, batch_size: int, duration_s: float) -> None:
        self.model.record(batch_size, duration_s)
        if batch_size > 0 and duration_s > 0:
            self._recent.record(duration_s, 1)

    def recent_step_s(self) -> float | None:
        """Mean duration of its last steps, None before one was measured."""
        rate = self._recent.rate
        return None if rate is None else 1.0 / rate


class LatencyGuidedAdmission(AdmissionController):
    """Latency-guided batch size selection (§4.4).

    For every running generation the worst case to finish its segment is
    `(max_segment_tokens - tokens_generated) / rate`. A generation is *protected* when that worst
    case fits its remaining budget at the measured speed; one that does not fit (including every
    generation already past its budget) cannot be saved by refusing admissions: one sequence
    more or less typically changes a step by well under a millisecond. A newcomer is refused
    only if, at the speed predicted for the batch *with* it (`BatchSpeedModel`, or the caller's
    `predicted_rate`), some protected generation would no longer fit. After an admission made
    while something was protected, further admissions wait `lag_steps` engine steps (as long as
    something is still protected), so the speed with the newcomer is measured before the next
    decision. With nothing protected there is nothing to wait for.

    An earlier version protected only the most urgent generation with a non-negative budget and
    refused whenever *it* did not fit, even though refusing could not help it: at ~45 tokens/s a
    fresh 10-token segment needs 0.22 s, more than an urgent task's ERT (0.2 s), so admissions
    stopped and the queue starved (WID2: mean utility -4.1; see docs/bench.md).
    """

    def __init__(self, max_segment_tokens: int = 10, lag_steps: int = 1, *,
                 speed_model: BatchSpeedModel | None = None):
        if max_segment_tokens < 1:
            raise ValueError("max_segment_tokens must be >= 1")
        if lag_steps < 0:
            raise ValueError("lag_steps must be >= 0")
        self.max_segment_tokens = int(max_segment_tokens)
        self.lag_steps = int(lag_steps)
        self.speed_model = speed_model if speed_model is not None else BatchSpeedModel()
        # Steps measured since the last admission that had something to protect; starts "long ago".
        self._steps_since_protected = self.lag_steps
        self._last_ok_protected = False

    def _remaining(self, info: Sequence) -> int:
        bound = int(info[2]) if len(info) > 2 else self.max_segment_tokens
        return max(0, bound - int(info[0]))

    def rate_with(self, batch_size: int, rate: float) -> float:
        """tokens/s of one generation once the batch has `batch_size` sequences."""
        step = 1.0 / rate
        model_step = self.speed_model.step_time_s(batch_size)
        if model_step is not None and model_step > step:
            step = model_step
        return 1.0 / step

    def may_admit(self, running: Sequence[RunningInfo], rate: float | None,
                  free_kv_blocks: int, blocks_needed: int, *,
                  predicted_rate: float | None = None) -> tuple[bool, str]:
        """`predicted_rate`: tokens/s with the newcomer, if the caller knows better than the
        speed model; it is never taken as faster than `rate`."""
        self._last_ok_protected = False
        ok, why = _blocks_ok(free_kv_blocks, blocks_needed)
        if not ok:
            return False, why
        if not running:
            return True, "no running generation to protect"
        if rate is None or not (rate > 0 and math.isfinite(rate)):
            return True, "generation speed not measured yet"
        protected = []
        for info in running:
            remaining = self._remaining(info)
            budget_s = float(info[1])
            if budget_s >= 0 and remaining / rate <= budget_s:
                protected.append((remaining, budget_s))
        if not protected:
            return True, "no running generation fits its budget: nothing to protect"
        if self._steps_since_protected < self.lag_steps:
            left = self.lag_steps - self._steps_since_protected
            return False, f"lag: waiting {left} more step(s) to measure the last admission"
        if predicted_rate is None or not (predicted_rate > 0 and math.isfinite(predicted_rate)):
            new_rate = self.rate_with(len(running) + 1, rate)
        else:
            new_rate = min(float(predicted_rate), rate)
        remaining, budget_s = min(protected, key=lambda p: p[1] - p[0] / new_rate)
        worst_s = remaining / new_rate
        if worst_s > budget_s:
            return False, (f"a running generation would need up to {worst_s:.3f} s ({remaining} "
                           f"tokens at {new_rate:.1f} tok/s with one more sequence), budget "
                           f"{budget_s:.3f} s")
        self._last_ok_protected = True
        return True, (f"{len(protected)} protected generation(s) still fit with one more sequence"
                      f" (tightest: {worst_s:.3f} s of {budget_s:.3f} s)")

    def note_admission(self) -> None:
        if self._last_ok_protected:
            self._steps_since_protected = 0
        self._last_ok_protected = False

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None:
        """After each engine step; given the step's duration and batch size, the model learns."""
        self._steps_since_protected += 1
        if duration_s is not None and batch_size is not None:
            self.speed_model.record(int(batch_size), duration_s)


class FixedBatchCap(AdmissionController):
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


class BlocksOnlyAdmission(AdmissionController):
    """Admit whenever KV blocks suffice (vLLM's own behaviour, for policies without §4.4)."""

    reads_running = False

    def may_admit(self, running: Sequence[RunningInfo], rate: float | None,
                  free_kv_blocks: int, blocks_needed: int) -> tuple[bool, str]:
        ok, why = _blocks_ok(free_kv_blocks, blocks_needed)
        return (True, "kv blocks suffice") if ok else (False, why)


class _CappedAdmission(AdmissionController):
    """A fixed batch cap in front of a generic controller."""

    def __init__(self, cap: int, inner: AdmissionController):
        self.cap = FixedBatchCap(cap)
        self.inner = inner

    def may_admit(self, running, rate, free_kv_blocks, blocks_needed):
        ok, why = self.cap.may_admit(running, rate, free_kv_blocks, blocks_needed)
        if not ok:
            return ok, why
        return self.inner.may_admit(running, rate, free_kv_blocks, blocks_needed)

    def note_admission(self) -> None:
        self.inner.note_admission()

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None:
        self.inner.note_step(duration_s, batch_size)

    def note_replica_step(self, replica: int, duration_s: float, batch_size: int) -> None:
        self.inner.note_replica_step(replica, duration_s, batch_size)


class _CappedCandidateAdmission(CandidateAdmission):
    """A fixed batch cap in front of a candidate-aware controller."""

    def __init__(self, cap: int, inner: CandidateAdmission):
        self.cap = FixedBatchCap(cap).cap
        self.inner = inner
        self.reads_preserved_blocks = inner.reads_preserved_blocks

    @property
    def skip_refused(self) -> bool:
        # Read at each refusal: the inner controller may decide it per refusal.
        return self.inner.skip_refused

    def begin_pass(self, admission_pass: AdmissionPass) -> None:
        self.inner.begin_pass(admission_pass)

    def shortlist(self) -> Collection | None:
        return self.inner.shortlist()

    def may_admit_candidate(self, batch: Sequence[RunningGen], candidate: Candidate,
                            free_kv_blocks: int) -> tuple[bool, str]:
        if len(batch) >= self.cap:
            return False, f"batch cap {self.cap} reached"
        return self.inner.may_admit_candidate(batch, candidate, free_kv_blocks)

    def displacement_for(self, batch, candidate, free_kv_blocks) -> list[str]:
        return self.inner.displacement_for(batch, candidate, free_kv_blocks)

    def yield_below(self, running, now, rate):
        return self.inner.yield_below(running, now, rate)

    def yield_keys(self, running, now):
        return self.inner.yield_keys(running, now)

    def note_admission(self) -> None:
        self.inner.note_admission()

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None:
        self.inner.note_step(duration_s, batch_size)

    def note_replica_step(self, replica: int, duration_s: float, batch_size: int) -> None:
        self.inner.note_replica_step(replica, duration_s, batch_size)


def with_batch_cap(cap: int, inner: AdmissionController) -> AdmissionController:
    """`inner` limited to `cap` running generations (`SchedulerConfig.batch_cap`)."""
    if isinstance(inner, CandidateAdmission):
        return _CappedCandidateAdmission(cap, inner)
    return _CappedAdmission(cap, inner)

