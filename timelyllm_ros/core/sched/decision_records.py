"""The records of a batch decision (core/sched/decision.py): the frozen snapshot it reads and
the decision it returns, kept apart from the rule the way vLLM keeps `SchedulerOutput` apart
from its scheduler. All arrays are read-only."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields

import numpy as np


@dataclass(frozen=True)
class StepCoefficients:
    """The cost model's coefficients in seconds (core/engine/cost_model.py)."""

    decode_fixed_s: float
    decode_per_seq_s: float
    decode_per_ctx_token_s: float
    prefill_fixed_s: float
    prefill_per_token_s: float

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: must be finite and >= 0, got {value!r}")

    @classmethod
    def from_profile(cls, profile) -> "StepCoefficients":
        return cls(profile.decode_fixed_s, profile.decode_per_seq_s,
                   profile.decode_per_ctx_token_s, profile.prefill_fixed_s,
                   profile.prefill_per_token_s)


def _column(values, dtype) -> np.ndarray:
    arr = np.array(values, dtype=dtype)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True)
class RunningSet:
    """The running batch, one entry per generation (parallel read-only arrays).

    remaining_tokens: tokens to its current segment's end (predicted, >= 1).
    context_tokens: its KV now. deadline_s: when its segment is due (first segment: arrival +
    ERT; a resume: when the robot finishes the previous one). initial_utility, slope: U0 and k.
    segment_index: 0 for a response (first segment), else a resume."""

    keys: tuple[str, ...]
    remaining_tokens: np.ndarray
    context_tokens: np.ndarray
    deadline_s: np.ndarray
    initial_utility: np.ndarray
    slope: np.ndarray
    segment_index: np.ndarray
    is_urgent: np.ndarray

    @classmethod
    def build(cls, keys, remaining_tokens, context_tokens, deadline_s, initial_utility, slope,
              segment_index, is_urgent=None) -> "RunningSet":
        n = len(keys)
        out = cls(tuple(keys), _column(remaining_tokens, np.float64),
                  _column(context_tokens, np.float64), _column(deadline_s, np.float64),
                  _column(initial_utility, np.float64), _column(slope, np.float64),
                  _column(segment_index, np.int64),
                  _column(np.zeros(n, bool) if is_urgent is None else is_urgent, np.bool_))
        out._check(n)
        return out

    def _check(self, n: int) -> None:
        for name in ("remaining_tokens", "context_tokens", "deadline_s", "initial_utility",
                     "slope", "segment_index", "is_urgent"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name}: {len(getattr(self, name))} values for {n} keys")
        if n and (self.remaining_tokens < 1).any():
            raise ValueError("remaining_tokens: must be >= 1")

    @classmethod
    def empty(cls) -> "RunningSet":
        return cls.build((), (), (), (), (), (), ())

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class CandidateQueue:
    """Queued generations in the walk order (parallel read-only arrays).

    prefill_tokens: prompt tokens its admission computes. segment_tokens: tokens to its segment's
    end once it runs (predicted, >= 1; at most its bound). bound_tokens: the most it may
    generate in this run. blocks_needed: KV blocks its admission takes. The rest as RunningSet."""

    keys: tuple[str, ...]
    prefill_tokens: np.ndarray
    segment_tokens: np.ndarray
    bound_tokens: np.ndarray
    context_tokens: np.ndarray
    blocks_needed: np.ndarray
    deadline_s: np.ndarray
    initial_utility: np.ndarray
    slope: np.ndarray
    segment_index: np.ndarray

    @classmethod
    def build(cls, keys, prefill_tokens, segment_tokens, bound_tokens, context_tokens,
              blocks_needed, deadline_s, initial_utility, slope,
              segment_index) -> "CandidateQueue":
        out = cls(tuple(keys), _column(prefill_tokens, np.float64),
                  _column(segment_tokens, np.float64), _column(bound_tokens, np.float64),
                  _column(context_tokens, np.float64), _column(blocks_needed, np.int64),
                  _column(deadline_s, np.float64), _column(initial_utility, np.float64),
                  _column(slope, np.float64), _column(segment_index, np.int64))
        n = len(out.keys)
        for name in ("prefill_tokens", "segment_tokens", "bound_tokens", "context_tokens",
                     "blocks_needed", "deadline_s", "initial_utility", "slope", "segment_index"):
            if len(getattr(out, name)) != n:
                raise ValueError(f"{name}: {len(getattr(out, name))} values for {n} keys")
        if n and (out.segment_tokens < 1).any():
            raise ValueError("segment_tokens: must be >= 1")
        return out

    def take(self, index: np.ndarray) -> "CandidateQueue":
        """The candidates at `index` (ascending: the walk order is kept)."""
        return CandidateQueue(tuple(self.keys[i] for i in index.tolist()),
                              *(getattr(self, f.name)[index] for f in fields(self)[1:]))

    @classmethod
    def empty(cls) -> "CandidateQueue":
        return cls.build((), (), (), (), (), (), (), (), (), ())

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class IncomingResponses:
    """The responses (first segments) expected to arrive, one entry per class of task (a TUF
    and a segment bound), as measured from the recent arrivals (parallel read-only arrays).

    rate_per_s: arrivals per second. prefill_tokens, context_tokens: an arrival's mean prompt
    tokens to compute and its KV. segment_tokens: its first segment's measured length
    distribution, as equally likely values (one row per class, `LENGTH_QUANTILES` columns).
    ert_s, slope: its TUF's ERT and k (its deadline is its arrival + ERT)."""

    rate_per_s: np.ndarray
    prefill_tokens: np.ndarray
    context_tokens: np.ndarray
    segment_tokens: np.ndarray
    ert_s: np.ndarray
    slope: np.ndarray

    @classmethod
    def build(cls, rate_per_s, prefill_tokens, context_tokens, segment_tokens, ert_s,
              slope) -> "IncomingResponses":
        out = cls(*(_column(v, np.float64) for v in (rate_per_s, prefill_tokens,
                                                    context_tokens, segment_tokens, ert_s,
                                                    slope)))
        n = len(out.rate_per_s)
        for name in ("prefill_tokens", "context_tokens", "segment_tokens", "ert_s", "slope"):
            if len(getattr(out, name)) != n:
                raise ValueError(f"{name}: {len(getattr(out, name))} values for {n} classes")
        if out.segment_tokens.ndim != 2 or (n and out.segment_tokens.shape[1] < 1):
            raise ValueError("segment_tokens: one row of length values per class")
        if n and ((out.rate_per_s < 0).any() or (out.segment_tokens < 1).any()):
            raise ValueError("rate_per_s: must be >= 0; segment_tokens: must be >= 1")
        return out

    @classmethod
    def empty(cls) -> "IncomingResponses":
        return cls.build((), (), (), np.zeros((0, 1)), (), ())

    def __len__(self) -> int:
        return len(self.rate_per_s)


@dataclass(frozen=True)
class DecisionSnapshot:
    """Everything one decision reads. `free_slots` None: no slot limit. `incoming`: the
    responses expected to arrive while an admitted resume runs (none: the decision looks only
    at the batch and the queue)."""

    now: float
    running: RunningSet
    candidates: CandidateQueue
    free_kv_blocks: int
    free_slots: int | None
    step_token_budget: int
    coefficients: StepCoefficients
    kv_block_size: int
    incoming: IncomingResponses = field(default_factory=IncomingResponses.empty)

    def __post_init__(self) -> None:
        if self.kv_block_size < 1:
            raise ValueError(f"kv_block_size: must be >= 1, got {self.kv_block_size!r}")
        if self.step_token_budget < 1:
            raise ValueError(f"step_token_budget: must be >= 1, got {self.step_token_budget!r}")
        if self.free_slots is not None and self.free_slots < 0:
            raise ValueError(f"free_slots: must be >= 0 or None, got {self.free_slots!r}")


class HoldReasons(Mapping[str, str]):
    """Queued key -> why the walk held it, read from the walk's outcome per candidate.

    In overload thousands are queued and a pass admits one or two, while the scheduler reads a
    reason only for a candidate it asks about; building the whole dict at every pass cost more
    than the walk itself. So the walk's codes are kept as they are, and the mapping from key to
    position is built when a reason is first asked for."""

    def __init__(self, keys: tuple[str, ...], codes: np.ndarray, reasons: Mapping[int, str],
                 held: np.ndarray):
        """`codes[j]`: what the walk did with `keys[j]`; `held`: the positions whose code is a
        hold, ascending (`reasons` gives each such code's reason)."""
        self._keys = keys
        self._codes = codes
        self._reasons = reasons
        self._held = held
        self._position: dict[str, int] | None = None

    def _positions(self) -> dict[str, int]:
        if self._position is None:
            keys = self._keys
            self._position = {keys[j]: j for j in self._held.tolist()}
        return self._position

    def __getitem__(self, key: str) -> str:
        return self._reasons[int(self._codes[self._positions()[key]])]

    def __contains__(self, key: object) -> bool:
        return key in self._positions()

    def __iter__(self) -> Iterator[str]:
        keys = self._keys
        return (keys[j] for j in self._held.tolist())

    def __len__(self) -> int:
        return len(self._held)

    def __repr__(self) -> str:
        return f"HoldReasons({dict(self)!r})"


@dataclass(frozen=True)
class BatchDecision:
    """admit: keys to start now, in walk order. hold: queued keys the walk reached and refused,
    with the reason. yields: running keys to suspend at their next boundary, with the reason.
    Queued keys in neither were not reached (the walk stopped: nothing further fitted).
    admit_positions: where each admitted key is in the snapshot's candidate queue (ascending),
    or None where the decision was not taken on one queue."""

    admit: tuple[str, ...]
    hold: Mapping[str, str] = field(default_factory=dict)
    yields: dict[str, str] = field(default_factory=dict)
    # (Where the keys are, not a choice: two decisions with the same choices are equal.)
    admit_positions: tuple[int, ...] | None = field(default=None, compare=False)
