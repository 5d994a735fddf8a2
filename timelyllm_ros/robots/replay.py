"""Executor backend `replay`: a simulated robot that replays the exact durations of a recording.

`timelyllm lrtrace replay --durations-from run.mcap|table.csv` starts its executors with
`backend:=replay` and `replay_table:=<timing table CSV>` (the table `timelyllm lrtrace table`
builds from a bag, read with `timing_table.read_csv`). For every segment it is asked to execute,
the backend looks up the recorded rows with the same call text and sleeps for the next recorded
duration (times `time_scale`):

- **Matching** is by the segment's calls as they travel in `SkillSegment.calls`:
  `move_forward(50)`, or `pick(box);place(box,table)` for a multi-call segment (a table row of
  a multi-call segment joins names and arguments with `;`, see timing_table.py). Whitespace
  around argument commas is ignored.
- **Order**: the durations of a key are used in the order they were recorded (the table's row
  order, i.e. by start time), cycling back to the first when they run out. Rows recorded by the
  same robot id are preferred when there are any (a replay of the same event list then gives
  every robot its own recorded durations); otherwise the rows of all robots are used.
- Only **successful** rows are replayed (a recorded failure is skipped and counted), and every
  replayed segment reports success.
- **Fallback**: a segment whose calls were never recorded is timed by the execution-time model
  (`model.sample_segment`, seeded by `seed`), counted in `fallbacks` / `fallback_keys`, logged
  once per key as a warning, and reported with a message starting with `fallback:`
  (`FALLBACK_PREFIX`), so a recorded replay can count them from its bag.

The lookup (`next_duration`) is separate from the sleep (`execute`) so it can be unit-tested
without waiting. Nothing here imports ROS.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from timelyllm_ros.lrtrace.timing_table import CALL_SEPARATOR, TimingRow, read_csv

log = logging.getLogger(__name__)

# Report messages of segments that were not replayed but drawn from the execution-time model.
FALLBACK_PREFIX = "fallback:"
REPLAYED_PREFIX = "replayed"


def _norm_args(text: str) -> str:
    text = text.strip()
    return ",".join(a.strip() for a in text.split(",")) if text else ""


def call_key(calls: Sequence) -> str:
    """The lookup key of a segment: its calls as `name(args)` joined by ';'.

    `calls` are SkillCall-like objects (`name`, `args`) or wire strings (`move_forward(50)`)."""
    from timelyllm_ros.lrtrace.timing_table import split_call

    parts = []
    for call in calls:
        if isinstance(call, str):
            name, args = split_call(call)
        else:
            name, args = call.name, ",".join(str(a) for a in call.args)
        parts.append(f"{name.strip()}({_norm_args(args)})")
    return CALL_SEPARATOR.join(parts)


def row_key(row: TimingRow) -> str:
    """The lookup key of a timing-table row (same form as `call_key`)."""
    names = row.skill.split(CALL_SEPARATOR)
    if len(names) == 1:
        args = [row.arguments]
    else:
        args = row.arguments.split(CALL_SEPARATOR)
        if len(args) != len(names):  # an argument contained ';': keep the row, unmatched parts
            args = (args + [""] * len(names))[:len(names)]
    return CALL_SEPARATOR.join(f"{n.strip()}({_norm_args(a)})" for n, a in zip(names, args))


class ReplayTable:
    """Recorded durations (seconds, unscaled) by segment key, in recorded order."""

    def __init__(self, rows: Iterable[TimingRow], source: str = "<rows>"):
        self.source = source
        self.all: dict[str, list[float]] = {}
        self.by_robot: dict[tuple[str, str], list[float]] = {}
        self.rows = 0
        self.skipped_failures = 0
        # Recorded order is time order (a table from `lrtrace table` is already sorted so).
        for row in sorted(rows, key=lambda r: (r.start, r.task_id, r.sequence)):
            if not row.success:
                self.skipped_failures += 1
                continue
            duration = float(row.duration)
            if not (math.isfinite(duration) and duration >= 0):
                continue
            key = row_key(row)
            self.all.setdefault(key, []).append(duration)
            if row.robot:
                self.by_robot.setdefault((row.robot, key), []).append(duration)
            self.rows += 1

    @classmethod
    def from_csv(cls, path: str | os.PathLike) -> "ReplayTable":
        """Read a timing table; raises timing_table.TableError (a ValueError) naming the line."""
        return cls(read_csv(path), source=str(path))

    def keys(self) -> list[str]:
        return sorted(self.all)

    def durations(self, key: str, robot_id: str = "") -> tuple[str, list[float]] | None:
        """(scope, durations) for `key`: the robot's own rows if it has any, else all rows."""
        own = self.by_robot.get((robot_id, key)) if robot_id else None
        if own:
            return robot_id, own
        rows = self.all.get(key)
        return ("*", rows) if rows else None


class Draw(NamedTuple):
    duration_s: float  # unscaled
    note: str  # what it was, for the report message
    replayed: bool  # False: drawn from the execution-time model (fallback)


class ReplayBackend:
    """SkillBackend replaying recorded durations (see the module docstring)."""

    def __init__(self, table: ReplayTable | str | os.PathLike, model, *, time_scale: float = 1.0,
                 seed: int = 0, stop: threading.Event | None = None, robot_id: str = ""):
        if not time_scale > 0:
            raise ValueError(f"time_scale: must be > 0, got {time_scale}")
        if not isinstance(table, ReplayTable):
            path = Path(table)
            if not path.is_file():
                raise ValueError(f"replay_table: {path}: no such timing table (CSV)")
            table = ReplayTable.from_csv(path)
        self.table = table
        self.model = model
        self.time_scale = float(time_scale)
        self.robot_id = robot_id
        self._rng = np.random.default_rng(seed)
        self._stop = stop or threading.Event()
        self._lock = threading.Lock()
        self._cursor: dict[tuple[str, str], int] = {}
        self.replayed = 0
        self.fallbacks = 0
        self.fallback_keys: Counter[str] = Counter()

    def next_duration(self, calls: Sequence) -> Draw:
        """The unscaled duration of the next execution of `calls` and how it was obtained.
        Advances the key's cursor, or counts a fallback."""
        if not calls:
            return Draw(0.0, "no calls", True)
        key = call_key(calls)
        with self._lock:
            found = self.table.durations(key, self.robot_id)
            if found is not None:
                scope, durations = found
                i = self._cursor.get((scope, key), 0)
                self._cursor[(scope, key)] = i + 1
                self.replayed += 1
                n = len(durations)
                return Draw(durations[i % n], f"{key} recorded #{i % n + 1} of {n}" + (
                    f" (cycle {i // n + 1})" if i >= n else ""), True)
            self.fallbacks += 1
            self.fallback_keys[key] += 1
            first = self.fallback_keys[key] == 1
            duration = float(self.model.sample_segment(calls, self._rng))
        if first:
            log.warning("replay: %s was never recorded in %s; drawing its durations from the "
                        "execution-time model (%s)", key, self.table.source,
                        getattr(self.model, "source", "?"))
        return Draw(duration, f"{key} never recorded (fallback {self.fallbacks})", False)

    def execute(self, calls: Sequence) -> tuple[bool, str]:
        try:
            draw = self.next_duration(calls)
        except Exception as err:  # noqa: BLE001 - a backend never raises from execute
            return False, f"replay: {err}"
        scaled = draw.duration_s * self.time_scale
        if scaled > 0 and self._stop.wait(scaled):
            return False, "executor shutting down"
        prefix = f"{REPLAYED_PREFIX}" if draw.replayed else f"{FALLBACK_PREFIX} exec model"
        return True, f"{prefix} {scaled:.3f} s: {draw.note}"

    def stats(self) -> dict[str, object]:
        with self._lock:
            return {"replayed": self.replayed, "fallbacks": self.fallbacks,
                    "fallback_keys": dict(self.fallback_keys)}
