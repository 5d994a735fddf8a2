"""Event lists as text: the YAML files that `compose` writes and a person edits, and the paper's
`{(1,2), 3, 4}` parallel-event notation.

`save_events` / `load_events` keep a concrete event list as human-editable YAML (load checks every
field and names the event); `parse_event_notation` reads the notation into events.

Separate from `lrtrace.workload` (what a workload is and how its events are drawn) because these
read and write given events, whoever made them: `compose`, a hand-written file, or the notation.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from timelyllm_ros.lrtrace.traces import Trace, load_traces, read_yaml
from timelyllm_ros.lrtrace.workload import Event, TaskSpec, WorkloadError


def save_events(path: str | Path, events: Sequence[Event], comment: str = "") -> None:
    """Write events as YAML that a person can edit: time, then robot / trace / TUF level per task.

    Event and task ids are not written: `load_events` renumbers in time order, which is how
    `compose` numbers them, so a saved list loads back equal.
    """
    doc = {
        "events": [
            {
                "time_s": float(e.time_s),
                "tasks": [{"robot": t.robot_id, "trace": t.trace_id, "tuf_level": t.tuf_level,
                           **({"context": t.context} if t.context else {})} for t in e.tasks],
            }
            for e in events
        ]
    }
    header = "".join(f"# {line}\n" for line in comment.splitlines()) if comment else ""
    header += ("# One entry per event; tasks of an event start at once. Fields: time_s (seconds\n"
               "# from the start), robot, trace (id in lrtrace/traces.yaml), tuf_level (optional,\n"
               "# defaults to the trace's), context (optional, appended to the instruction).\n")
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)
    Path(path).write_text(header + body, encoding="utf-8")


def load_events(path: str | Path, traces: Mapping[int, Trace] | None = None) -> list[Event]:
    """Read an event list written by `save_events` (or by hand); errors name the event index."""
    path = Path(path)
    data = read_yaml(path, WorkloadError)
    if not isinstance(data, Mapping) or not isinstance(data.get("events"), list):
        raise WorkloadError(f"{path}: events: expected a mapping with an `events` list")
    catalogue = traces if traces is not None else load_traces()
    parsed: list[tuple[float, list[tuple[str, int, str, str]]]] = []
    for index, entry in enumerate(data["events"]):
        parsed.append(_parse_event(entry, f"{path}: event {index}", catalogue))
    order = sorted(range(len(parsed)), key=lambda i: parsed[i][0])
    events = []
    task_id = 0
    for event_id, i in enumerate(order):
        time_s, tasks = parsed[i]
        specs = []
        for robot, tid, level, context in tasks:
            specs.append(TaskSpec(task_id, robot, tid, level, context))
            task_id += 1
        events.append(Event(time_s, event_id, tuple(specs)))
    return events


def _parse_event(entry: Any, where: str,
                 catalogue: Mapping[int, Trace]) -> tuple[float, list[tuple[str, int, str, str]]]:
    if not isinstance(entry, Mapping):
        raise WorkloadError(f"{where}: expected a mapping with time_s and tasks")
    for key in entry:
        if key not in ("time_s", "tasks"):
            raise WorkloadError(f"{where}: {key}: unknown key")
    time_s = entry.get("time_s")
    if isinstance(time_s, bool) or not isinstance(time_s, (int, float)) \
            or not math.isfinite(time_s) or time_s < 0:
        raise WorkloadError(f"{where}: time_s: must be a number >= 0, got {time_s!r}")
    tasks = entry.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise WorkloadError(f"{where}: tasks: must be a non-empty list")
    out = []
    seen: set[str] = set()
    for j, task in enumerate(tasks):
        at = f"{where}: tasks[{j}]"
        if not isinstance(task, Mapping):
            raise WorkloadError(f"{at}: expected a mapping with robot, trace, tuf_level")
        for key in task:
            if key not in ("robot", "trace", "tuf_level", "context"):
                raise WorkloadError(f"{at}: {key}: unknown key")
        robot = task.get("robot")
        if not isinstance(robot, str) or not robot:
            raise WorkloadError(f"{at}: robot: must be a non-empty string, got {robot!r}")
        if robot in seen:
            raise WorkloadError(f"{at}: robot: {robot} already has a task in this event")
        seen.add(robot)
        tid = task.get("trace")
        if isinstance(tid, bool) or not isinstance(tid, int):
            raise WorkloadError(f"{at}: trace: must be an integer trace id, got {tid!r}")
        if tid not in catalogue:
            raise WorkloadError(f"{at}: trace: unknown trace id {tid}")
        level = task.get("tuf_level", catalogue[tid].tuf_level)
        if not isinstance(level, str) or not level:
            raise WorkloadError(f"{at}: tuf_level: must be a non-empty string, got {level!r}")
        context = task.get("context", "")
        if not isinstance(context, str):
            raise WorkloadError(f"{at}: context: must be a string, got {context!r}")
        out.append((robot, tid, level, context))
    return float(time_s), out


# ---- the paper's parallel-event notation ----

_NOTATION_TOKEN = re.compile(r"\s*(?:(?P<trace>[Tt]?\d+)|(?P<sym>[{}(),]))")


def parse_event_notation(text: str, traces: Mapping[int, Trace] | None = None, *,
                         interval_s: float = 1.0, start_s: float = 0.0) -> list[Event]:
    """Parse `{(1,2), 3, 4}`: each top-level item is an event, a tuple's tasks start together.

    Trace ids may carry a `T` prefix (`(T1,T2)`). The notation has no times, so event i happens
    at `start_s + i * interval_s`. Every task gets its own robot (`drone_00`, `drone_01`, ...,
    numbered per category), so no robot is asked to do two things at once.
    """
    catalogue = traces if traces is not None else load_traces()
    tokens = _lex_notation(text)
    pos = 0

    def peek() -> tuple[str, str, int]:
        return tokens[pos] if pos < len(tokens) else ("end", "", len(text))

    def expect(sym: str) -> None:
        nonlocal pos
        kind, value, at = peek()
        if kind != "sym" or value != sym:
            raise WorkloadError(f"event notation: expected {sym!r} at character {at}, "
                                f"got {value or 'end of text'!r}")
        pos += 1

    def trace_id() -> int:
        nonlocal pos
        kind, value, at = peek()
        if kind != "trace":
            raise WorkloadError(f"event notation: expected a trace id at character {at}, "
                                f"got {value or 'end of text'!r}")
        pos += 1
        return int(value.lstrip("Tt"))

    braced = peek()[:2] == ("sym", "{")
    if braced:
        expect("{")
    groups: list[list[int]] = []
    while True:
        kind, value, _ = peek()
        if kind == "sym" and value == "(":
            pos += 1
            group = [trace_id()]
            while peek()[:2] == ("sym", ","):
                pos += 1
                group.append(trace_id())
            expect(")")
        else:
            group = [trace_id()]
        groups.append(group)
        if peek()[:2] != ("sym", ","):
            break
        pos += 1
    if braced:
        expect("}")
    if pos != len(tokens):
        raise WorkloadError(f"event notation: unexpected {tokens[pos][1]!r} at character "
                            f"{tokens[pos][2]}")

    counters: dict[str, int] = {}
    events = []
    task_id = 0
    for index, group in enumerate(groups):
        specs = []
        for tid in group:
            if tid not in catalogue:
                raise WorkloadError(f"event notation: event {index}: unknown trace id {tid}")
            trace = catalogue[tid]
            n = counters.get(trace.category, 0)
            counters[trace.category] = n + 1
            specs.append(TaskSpec(task_id, f"{trace.category}_{n:02d}", tid, trace.tuf_level))
            task_id += 1
        events.append(Event(start_s + index * interval_s, index, tuple(specs)))
    return events


def _lex_notation(text: str) -> list[tuple[str, str, int]]:
    tokens = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _NOTATION_TOKEN.match(text, pos)
        if not match:
            bad = len(text[pos:]) - len(text[pos:].lstrip()) + pos
            raise WorkloadError(f"event notation: unexpected {text[bad]!r} at character {bad}")
        kind = "trace" if match.group("trace") else "sym"
        tokens.append((kind, match.group(kind), match.start(kind)))
        pos = match.end()
    if not tokens:
        raise WorkloadError("event notation: empty")
    return tokens
