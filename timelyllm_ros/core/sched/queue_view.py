"""The scheduler's queue as columns, so priority functions are whole-array numpy expressions.

Every fetch recomputes the priority of every queued generation (the priority depends on the
current time), so the queue is kept as a struct of arrays rather than a list of objects: one
numpy expression per column replaces a Python loop over entries.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Hashable, Iterable, Mapping

import numpy as np

from timelyllm_ros.core.tuf import TUF

# (column, dtype). Order is the order of QueueView's fields.
COLUMNS: tuple[tuple[str, Any], ...] = (
    ("enqueued_s", np.float64),
    ("arrival_s", np.float64),
    ("reference_s", np.float64),
    ("ert_s", np.float64),
    ("slope", np.float64),
    ("initial_utility", np.float64),
    ("segment_index", np.int64),
    ("task_ert_s", np.float64),
    ("is_urgent", np.bool_),
    # Columns the scheduler fills for size-aware policies (seed policies; 0 when unknown).
    ("task_seq", np.int64),
    ("context_tokens", np.int64),
    ("bound_tokens", np.int64),
    ("prefill_tokens", np.int64),
    ("pause_s", np.float64),
)
# Size columns: optional in rows (default 0), filled by the scheduler.
SIZE_COLUMNS = ("task_seq", "context_tokens", "bound_tokens", "prefill_tokens", "pause_s")
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)
_REQUIRED = ("arrival_s", "reference_s", "ert_s", "slope", "initial_utility")


@dataclass(frozen=True)
class QueueView:
    """One row per queued generation.

    enqueued_s: when this generation (re-)entered the queue.
    arrival_s: when the task arrived.
    reference_s: r of Eq. 4 - task arrival for segment 0, else the (estimated, later reported)
        completion time of the previous segment.
    ert_s: ERT of this segment - the task's ERT for segment 0, 0 for a suspended generation.
    slope, initial_utility: k and U0 of the task's TUF.
    segment_index: j, the index of the segment to generate next.
    task_ert_s: the task's original ERT (EDF keeps the first segment's deadline).
    is_urgent: the task asked for an urgent TUF level.

    Filled by the scheduler for size-aware policies (MC-SF, LAMPS, BROS, hybrid; 0 in rows built
    without them):
    task_seq: the task's submission index (stable identity across suspensions; ties in the
        scheduler's order are broken by it).
    context_tokens: prompt + tokens generated so far (what the generation's KV holds on resume).
    bound_tokens: most tokens the next run may generate before the scheduler can suspend it,
        min(max_segment_tokens, tokens left in the plan): MC-SF's hard output bound.
    prefill_tokens: estimated prompt tokens the engine must compute on admission (context not
        expected in the prefix cache: the skill set's shared prompt and, for a resumed
        generation, the previous run's full blocks are assumed cached).
    pause_s: predicted robot execution time of the segment this run will produce (historical
        mean of the task's skill set; LAMPS's T_INT for the pause after the run).
    """

    enqueued_s: np.ndarray
    arrival_s: np.ndarray
    reference_s: np.ndarray
    ert_s: np.ndarray
    slope: np.ndarray
    initial_utility: np.ndarray
    segment_index: np.ndarray
    task_ert_s: np.ndarray
    is_urgent: np.ndarray
    task_seq: np.ndarray
    context_tokens: np.ndarray
    bound_tokens: np.ndarray
    prefill_tokens: np.ndarray
    pause_s: np.ndarray

    def __len__(self) -> int:
        return self.arrival_s.shape[0]

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> "QueueView":
        """Build a standalone view (tests, offline analysis) from row mappings."""
        normalised = [_normalise_row(r) for r in rows]
        return cls(**{
            name: np.array([r[name] for r in normalised], dtype=dt) for name, dt in COLUMNS
        })

    def row(self, index: int) -> dict[str, Any]:
        return {f.name: getattr(self, f.name)[index].item() for f in fields(self)}


def _normalise_row(row: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(row) - set(COLUMN_NAMES)
    if unknown:
        raise KeyError(f"unknown queue column(s) {sorted(unknown)}; columns: {COLUMN_NAMES}")
    missing = [c for c in _REQUIRED if c not in row]
    if missing:
        raise KeyError(f"queue row is missing {missing}")
    out = dict(row)
    out.setdefault("enqueued_s", out["arrival_s"])
    out.setdefault("segment_index", 0)
    # A row without task_ert_s is taken to be a first segment, whose ERT is the task's.
    out.setdefault("task_ert_s", out["ert_s"])
    out.setdefault("is_urgent", False)
    for name in SIZE_COLUMNS:
        out.setdefault(name, 0)
    return out


def initial_row(tuf: TUF, arrival_s: float, *, enqueued_s: float | None = None,
                is_urgent: bool = False, **sizes: Any) -> dict[str, Any]:
    """Row of a task's first generation: r is the arrival, the task's own ERT applies.
    `sizes`: any of SIZE_COLUMNS."""
    return {**_sizes(sizes),
        "enqueued_s": arrival_s if enqueued_s is None else enqueued_s,
        "arrival_s": arrival_s,
        "reference_s": arrival_s,
        "ert_s": tuf.ert_s,
        "slope": tuf.slope_per_s,
        "initial_utility": tuf.initial_utility,
        "segment_index": 0,
        "task_ert_s": tuf.ert_s,
        "is_urgent": is_urgent,
    }


def suspended_row(tuf: TUF, arrival_s: float, previous_done_s: float, segment_index: int, *,
                  enqueued_s: float, is_urgent: bool = False, **sizes: Any) -> dict[str, Any]:
    """Row of a suspended generation (§4.2): ERT 0, waiting counted from the (estimated)
    completion of the previous segment. `tuf` is the task's original TUF. `sizes`: any of
    SIZE_COLUMNS."""
    if segment_index < 1:
        raise ValueError("a suspended generation has segment_index >= 1")
    return {**_sizes(sizes),
        "enqueued_s": enqueued_s,
        "arrival_s": arrival_s,
        "reference_s": previous_done_s,
        "ert_s": 0.0,
        "slope": tuf.slope_per_s,
        "initial_utility": tuf.initial_utility,
        "segment_index": segment_index,
        "task_ert_s": tuf.ert_s,
        "is_urgent": is_urgent,
    }


def _sizes(sizes: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(sizes) - set(SIZE_COLUMNS)
    if unknown:
        raise KeyError(f"unknown size column(s) {sorted(unknown)}; size columns: {SIZE_COLUMNS}")
    return {**{name: 0 for name in SIZE_COLUMNS}, "pause_s": 0.0, **sizes}


class QueueArrays:
    """Growable struct of arrays that mirrors the scheduler's queue.

    Live rows are always the dense prefix [0, n) of every column, so `view()` is a set of slices
    (no copy). Removal swaps the last row into the hole (O(1)); callers therefore address rows by
    a stable *slot* handle returned from `add`, never by row index. Slots are recycled through a
    free list. An optional caller `key` (e.g. a generation id) can be attached to each slot.

    A view stays valid until the next add/remove/clear; `update` writes through to it.
    """

    def __init__(self, capacity: int = 16):
        capacity = max(1, int(capacity))
        self._cap = capacity
        self._n = 0
        self._cols: dict[str, np.ndarray] = {n: np.zeros(capacity, dt) for n, dt in COLUMNS}
        self._slot_of_row = np.zeros(capacity, np.int64)
        # Each row's key, aligned with the rows (so an admission pass gets its keys in walk
        # order with one fancy index instead of a Python loop over the queue).
        self._key_of_row = np.full(capacity, None, dtype=object)
        self._row_of_slot: list[int] = []  # -1 for free slots
        self._free: list[int] = []
        self._key_of_slot: list[Hashable] = []
        self._slot_of_key: dict[Hashable, int] = {}
        self._view: QueueView | None = None

    def __len__(self) -> int:
        return self._n

    def __contains__(self, slot: object) -> bool:
        return isinstance(slot, (int, np.integer)) and 0 <= slot < len(self._row_of_slot) \
            and self._row_of_slot[slot] >= 0

    def add(self, row: Mapping[str, Any] | None = None, /, *, key: Hashable | None = None,
            **fields_: Any) -> int:
        """Append a row (mapping and/or keyword columns); return its slot."""
        data = dict(row or {})
        data.update(fields_)
        data = _normalise_row(data)
        if key is not None and key in self._slot_of_key:
            raise KeyError(f"key {key!r} is already queued")
        if self._n == self._cap:
            self._grow()
        i = self._n
        for name, _ in COLUMNS:
            self._cols[name][i] = data[name]
        if self._free:
            slot = self._free.pop()
            self._row_of_slot[slot] = i
            self._key_of_slot[slot] = key
        else:
            slot = len(self._row_of_slot)
            self._row_of_slot.append(i)
            self._key_of_slot.append(key)
        if key is not None:
            self._slot_of_key[key] = slot
        self._slot_of_row[i] = slot
        self._key_of_row[i] = key
        self._n = i + 1
        self._view = None
        return slot

    def remove(self, slot: int) -> None:
        i = self._row(slot)
        last = self._n - 1
        if i != last:
            for col in self._cols.values():
                col[i] = col[last]
            moved = int(self._slot_of_row[last])
            self._slot_of_row[i] = moved
            self._row_of_slot[moved] = i
            self._key_of_row[i] = self._key_of_row[last]
        self._key_of_row[last] = None
        self._row_of_slot[slot] = -1
        key = self._key_of_slot[slot]
        if key is not None:
            del self._slot_of_key[key]
        self._key_of_slot[slot] = None
        self._free.append(slot)
        self._n = last
        self._view = None

    def update(self, slot: int, **fields_: Any) -> None:
        i = self._row(slot)
        for name, value in fields_.items():
            col = self._cols.get(name)
            if col is None:
                raise KeyError(f"unknown queue column {name!r}; columns: {COLUMN_NAMES}")
            col[i] = value

    def view(self) -> QueueView:
        v = self._view
        if v is None:
            n = self._n
            v = self._view = QueueView(**{name: self._cols[name][:n] for name in COLUMN_NAMES})
        return v

    @property
    def ids(self) -> np.ndarray:
        """Slots of the live rows, aligned with the rows of `view()` (read-only view)."""
        out = self._slot_of_row[: self._n]
        out.flags.writeable = False
        return out

    def slot_at(self, index: int) -> int:
        if not 0 <= index < self._n:
            raise IndexError(f"row {index} out of range (n={self._n})")
        return int(self._slot_of_row[index])

    def key_at(self, index: int) -> Hashable:
        return self._key_of_slot[self.slot_at(index)]

    def keys_column(self) -> np.ndarray:
        """The live rows' keys, aligned with the rows of `view()` (a copy)."""
        return self._key_of_row[: self._n].copy()

    def keys_at(self, rows: np.ndarray) -> list:
        """Keys of the rows `rows` (row indices of the current view), in that order."""
        return self._key_of_row[: self._n][rows].tolist()

    def key(self, slot: int) -> Hashable:
        self._row(slot)
        return self._key_of_slot[slot]

    def slot_of(self, key: Hashable) -> int:
        return self._slot_of_key[key]

    def index_of(self, slot: int) -> int:
        return self._row(slot)

    def get(self, slot: int) -> dict[str, Any]:
        i = self._row(slot)
        return {name: self._cols[name][i].item() for name in COLUMN_NAMES}

    def clear(self) -> None:
        self.__init__(self._cap)

    def _row(self, slot: int) -> int:
        try:
            i = self._row_of_slot[slot] if slot >= 0 else -1
        except (IndexError, TypeError):
            i = -1
        if i < 0:
            raise KeyError(f"slot {slot!r} is not queued")
        return i

    def _grow(self) -> None:
        new_cap = self._cap * 2
        for name, dt in COLUMNS:
            col = np.zeros(new_cap, dt)
            col[: self._n] = self._cols[name][: self._n]
            self._cols[name] = col
        sor = np.zeros(new_cap, np.int64)
        sor[: self._n] = self._slot_of_row[: self._n]
        self._slot_of_row = sor
        kor = np.full(new_cap, None, dtype=object)
        kor[: self._n] = self._key_of_row[: self._n]
        self._key_of_row = kor
        self._cap = new_cap
        self._view = None
