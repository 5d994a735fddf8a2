"""Per-skill timing table: what each robot executed and how long it took.

Built from a recorded bag by joining every SkillSegment (its parsed `calls`) with the
ExecutionReport of the same (task_id, sequence). One row per executed segment:

    skill, arguments, robot, task_id, sequence, start, finish, duration, success,
    calls_in_segment, estimated_s, message

A one-call segment gives a row for that skill (`arguments` is the text between the call's
parentheses, e.g. `50` or `bottle`). A multi-call segment (a loop body, `pick(a)->place(a,b)`)
gives ONE row whose skill and arguments are the calls' joined by ';' and `calls_in_segment` > 1:
robots report per segment, so only single-call rows measure one skill and `fit` uses only those.
Segments without calls (a plan's closing segment) are not rows. Segments never reported (robot
gone, recording stopped) and reports without a recorded segment are counted, not guessed.
"""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from timelyllm_ros.lrtrace import bag as bagmod
from timelyllm_ros.lrtrace import message_types as msgtypes

COLUMNS = ("skill", "arguments", "robot", "task_id", "sequence", "start", "finish", "duration",
           "success", "calls_in_segment", "estimated_s", "message")
REQUIRED_COLUMNS = ("skill", "arguments", "robot", "task_id", "sequence", "start", "finish",
                    "duration", "success")
TABLE_NAME = "skill_timings.csv"
CALL_SEPARATOR = ";"

_WIRE_CALL = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\((?P<args>.*)\)$", re.DOTALL)


class TableError(ValueError):
    """A timing table that cannot be read; the message names the file, line and column."""


@dataclass(frozen=True)
class TimingRow:
    skill: str
    arguments: str
    robot: str
    task_id: str
    sequence: int
    start: float
    finish: float
    duration: float
    success: bool
    calls_in_segment: int = 1
    estimated_s: float = math.nan
    message: str = ""

    def args(self) -> list[str]:
        """Arguments of a single-call row, split at commas (the wire format's separator)."""
        return [a.strip() for a in self.arguments.split(",")] if self.arguments.strip() else []


@dataclass
class TableBuild:
    rows: list[TimingRow]
    segments: int = 0
    reports: int = 0
    empty_segments: int = 0  # segments without calls (closing segments)
    unreported: list[tuple[str, int]] = field(default_factory=list)  # segments with no report
    orphan_reports: list[tuple[str, int]] = field(default_factory=list)  # reports with no segment
    bad_reports: list[str] = field(default_factory=list)  # reports that make no sense, why
    duplicates: int = 0

    def summary(self) -> str:
        multi = sum(1 for r in self.rows if r.calls_in_segment > 1)
        parts = [f"{len(self.rows)} rows ({multi} multi-call) from {self.segments} segments and "
                 f"{self.reports} reports"]
        if self.empty_segments:
            parts.append(f"{self.empty_segments} segment(s) without calls skipped")
        if self.unreported:
            parts.append(f"{len(self.unreported)} segment(s) never reported "
                         f"(e.g. {self.unreported[0][0]}#{self.unreported[0][1]})")
        if self.orphan_reports:
            parts.append(f"{len(self.orphan_reports)} report(s) without a recorded segment "
                         f"(e.g. {self.orphan_reports[0][0]}#{self.orphan_reports[0][1]})")
        if self.bad_reports:
            parts.append(f"{len(self.bad_reports)} bad reports ignored ({self.bad_reports[0]})")
        if self.duplicates:
            parts.append(f"{self.duplicates} duplicate messages ignored")
        return "; ".join(parts)


def split_call(text: str) -> tuple[str, str]:
    """`move_forward(50)` -> ("move_forward", "50"); a call that is not name(args) keeps its text
    as the skill name (so it still shows up, and fits as an empirical skill of that name)."""
    m = _WIRE_CALL.match(text.strip())
    if m is None:
        return text.strip(), ""
    return m.group("name"), m.group("args").strip()


def build_rows(messages: Iterable[tuple[str, Any]]) -> TableBuild:
    """Join segments and reports. `messages`: (msgtype, message) pairs in any order; messages
    are dicts or typestore dataclasses with the msg fields."""
    segments: dict[tuple[str, int], Mapping] = {}
    reports: dict[tuple[str, int], Mapping] = {}
    build = TableBuild(rows=[])
    for msgtype, msg in messages:
        d = msg if isinstance(msg, Mapping) else msgtypes.to_dict(msg)
        if msgtype == msgtypes.SEGMENT_TYPE:
            key = (d["task_id"], int(d["sequence"]))
            if key in segments:
                build.duplicates += 1
                continue
            segments[key] = d
        elif msgtype == msgtypes.REPORT_TYPE:
            key = (d["task_id"], int(d["sequence"]))
            if key in reports:
                build.duplicates += 1
                continue
            reports[key] = d
    build.segments = len(segments)
    build.reports = len(reports)
    for key, seg in segments.items():
        calls = [c for c in seg.get("calls", []) if str(c).strip()]
        rep = reports.get(key)
        if not calls:
            build.empty_segments += 1
            continue
        if rep is None:
            build.unreported.append(key)
            continue
        start = msgtypes.stamp_s(rep["started"])
        finish = msgtypes.stamp_s(rep["finished"])
        if not (math.isfinite(start) and math.isfinite(finish)) or finish < start:
            build.bad_reports.append(f"{key[0]}#{key[1]}: finished before started")
            continue
        names, args = zip(*(split_call(c) for c in calls))
        build.rows.append(TimingRow(
            skill=CALL_SEPARATOR.join(names), arguments=CALL_SEPARATOR.join(args),
            robot=rep.get("robot_id") or seg.get("robot_id", ""), task_id=key[0], sequence=key[1],
            start=start, finish=finish, duration=finish - start, success=bool(rep["success"]),
            calls_in_segment=len(calls), estimated_s=float(seg.get("estimated_execution_s", math.nan)),
            message=str(rep.get("message", ""))))
    build.orphan_reports = sorted(k for k in reports if k not in segments)
    build.rows.sort(key=lambda r: (r.start, r.task_id, r.sequence))
    return build


def table_from_bag(path: str | os.PathLike, *, salvage: bool = False) -> tuple[TableBuild, bagmod.BagContents]:
    contents = bagmod.read_messages(path, salvage=salvage)
    relevant = ((m.msgtype, m.msg) for m in contents.messages
                if m.msgtype in (msgtypes.SEGMENT_TYPE, msgtypes.REPORT_TYPE))
    return build_rows(relevant), contents


@dataclass
class LoadedTable:
    """Timing rows read from a table (CSV), or built from a bag (then with the build's counts
    and the bag's contents, e.g. what a salvage read)."""

    rows: list[TimingRow]
    build: TableBuild | None = None
    contents: bagmod.BagContents | None = None


def load_table(source: str | os.PathLike, *, salvage: bool = False) -> LoadedTable:
    """The rows of a timing table: a `.csv` as it is, anything else read as a bag and built
    (TableError / BagError name the file)."""
    path = Path(source)
    if path.suffix.lower() == ".csv":
        return LoadedTable(read_csv(path))
    build, contents = table_from_bag(path, salvage=salvage)
    return LoadedTable(build.rows, build, contents)


def default_table_path(bag_path: str | os.PathLike) -> Path:
    """skill_timings.csv beside the bag (inside the rosbag2 directory)."""
    resolved = bagmod.resolve_bag(bag_path)
    return (resolved if resolved.is_dir() else resolved.parent) / TABLE_NAME


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(round(v, 9))
    return str(v)


def write_csv(rows: Iterable[TimingRow], path: str | os.PathLike) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for r in rows:
            d = asdict(r)
            w.writerow([_fmt(d[c]) for c in COLUMNS])
    os.replace(tmp, p)
    return p


_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


def read_csv(path: str | os.PathLike) -> list[TimingRow]:
    """Read a timing table; errors name the file, the line and the column."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TableError(f"{p}: cannot read: {err}") from None
    reader = csv.reader(text.splitlines())
    try:
        header = next(reader)
    except StopIteration:
        raise TableError(f"{p}:1: empty file (expected a header: {','.join(COLUMNS)})") from None
    except csv.Error as err:
        raise TableError(f"{p}:1: {err}") from None
    header = [h.strip() for h in header]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise TableError(f"{p}:1: header: missing column(s) {', '.join(missing)} "
                         f"(have {', '.join(header) or 'none'})")
    col = {name: i for i, name in enumerate(header)}
    rows: list[TimingRow] = []
    line = 1
    try:
        for line, values in enumerate(reader, start=2):
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise TableError(f"{p}:{line}: expected {len(header)} columns, got {len(values)}")
            rows.append(_parse_row(values, col, f"{p}:{line}"))
    except csv.Error as err:
        raise TableError(f"{p}:{line}: {err}") from None
    return rows


def _parse_row(values: list[str], col: dict[str, int], where: str) -> TimingRow:
    def get(name: str, default: str = "") -> str:
        return values[col[name]].strip() if name in col else default

    def number(name: str, *, allow_empty: bool = False) -> float:
        raw = get(name)
        if raw == "" and allow_empty:
            return math.nan
        try:
            v = float(raw)
        except ValueError:
            raise TableError(f"{where}: {name}: {raw!r} is not a number") from None
        if not math.isfinite(v):
            raise TableError(f"{where}: {name}: must be finite, got {raw!r}")
        return v

    def integer(name: str, default: str | None = None) -> int:
        raw = get(name, default or "")
        if raw == "" and default is not None:
            raw = default
        try:
            v = int(raw)
        except ValueError:
            raise TableError(f"{where}: {name}: {raw!r} is not an integer") from None
        if v < 0:
            raise TableError(f"{where}: {name}: must be >= 0, got {v}")
        return v

    skill = get("skill")
    if not skill:
        raise TableError(f"{where}: skill: empty")
    start, finish, duration = number("start"), number("finish"), number("duration")
    if duration < 0:
        raise TableError(f"{where}: duration: must be >= 0, got {duration}")
    if finish < start:
        raise TableError(f"{where}: finish: {finish} is before start {start}")
    success_raw = get("success").lower()
    if success_raw not in _TRUE | _FALSE:
        raise TableError(f"{where}: success: {get('success')!r} is not true/false")
    calls = integer("calls_in_segment", default=str(skill.count(CALL_SEPARATOR) + 1))
    if calls < 1:
        raise TableError(f"{where}: calls_in_segment: must be >= 1, got {calls}")
    return TimingRow(
        skill=skill, arguments=get("arguments"), robot=get("robot"), task_id=get("task_id"),
        sequence=integer("sequence"), start=start, finish=finish, duration=duration,
        success=success_raw in _TRUE, calls_in_segment=calls,
        estimated_s=number("estimated_s", allow_empty=True) if "estimated_s" in col else math.nan,
        message=get("message"))
