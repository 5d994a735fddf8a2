"""Workload definitions and their composition into timed events (paper §6, Table 3).

A workload says how tasks arrive: events at Poisson rate `eps` over `duration_s`, each starting
1..`max_tpe` tasks at once on distinct robots out of `agents`, with traces drawn from `traces`.
`load_workload` reads and checks one; `compose` turns it into a concrete, reproducible event
list. Event lists as text (YAML files, the paper's `{(1,2), 3, 4}` notation) are in
`lrtrace.event_lists`.

Two optional extensions (lrtrace/README.md): `context_tokens: [min, max]` gives every task that
many tokens of its own context (a scene description, the robot's recent history: TypeFly puts the
scene into each prompt), distinct per task so that no prefix cache can share it; `streams:` mixes
independent arrival streams (drones, arms, chat users, a best-effort batch stream), each with its
own rate, traces, robots and context.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from timelyllm_ros.lrtrace.traces import (read_yaml, CONTEXT_MAX_TOKENS, CONTEXT_MIN_TOKENS, CONTEXT_SEED,
                                          Trace, context_text, load_traces, lrtrace_dir)


class WorkloadError(ValueError):
    """An invalid workload or event list; the message names the file, the key and the reason."""


@dataclass(frozen=True)
class Stream:
    """One arrival stream of a mixed workload: Poisson events at `eps` of 1..`max_tpe` tasks on
    its own `agents` robots, traces drawn from `traces`, and its own per-task context range."""

    name: str
    eps: float
    max_tpe: int
    traces: tuple[int, ...]
    agents: int
    context_tokens: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return _without_defaults(dataclasses.asdict(self), ("context_tokens",))


@dataclass(frozen=True)
class Workload:
    name: str
    eps: float  # events per second (Poisson rate)
    max_tpe: int  # most tasks started by one event
    traces: tuple[int, ...]
    agents: int  # robots available
    duration_s: float
    seed: int = 0
    network_latency_s: float = 0.008  # each way (paper §7.2)
    description: str = ""
    # Tokens of each task's own context, uniform in [min, max] per task; None = no context.
    context_tokens: tuple[int, int] | None = None
    # Mixed traffic: independent streams. eps, max_tpe, traces and agents are then their sum /
    # max / union / sum, and `compose` scales every stream's rate by eps / (sum of stream rates),
    # so a workload whose eps is scaled (a load sweep) scales all its streams alike.
    streams: tuple[Stream, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["streams"] = [s.to_dict() for s in self.streams]
        return _without_defaults(data, ("context_tokens", "streams"))


def _without_defaults(data: dict[str, Any], optional: Sequence[str]) -> dict[str, Any]:
    """JSON-ready: tuples as lists; optional keys left out when unset (so a workload without
    them describes itself exactly as before they existed)."""
    out = {}
    for key, value in data.items():
        if key in optional and not value:
            continue
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


@dataclass(frozen=True)
class TaskSpec:
    task_id: int
    robot_id: str
    trace_id: int
    tuf_level: str
    # The task's own context, appended to its instruction (`instruction_for`); "" = none.
    context: str = ""

    def instruction_for(self, trace: Trace) -> str:
        """The instruction as the planner receives it: the trace's, then this task's context."""
        return trace.instruction + self.context


@dataclass(frozen=True)
class Event:
    time_s: float
    event_id: int
    tasks: tuple[TaskSpec, ...]
    # Closed loop: the event is released `time_s` seconds after every task of event
    # `after_event` has ended (a client that submits its next batch when the last one is done),
    # instead of at `time_s` from the start. Only the bench's replay reads it.
    after_event: int | None = None


_KEYS = {f.name for f in dataclasses.fields(Workload)}


def workloads_dir() -> Path:
    return lrtrace_dir() / "workloads"


def preset_names() -> list[str]:
    return sorted(p.stem for p in workloads_dir().glob("*.yaml"))


def load_workload(path_or_preset: str | Path,
                  traces: Mapping[int, Trace] | None = None) -> Workload:
    """Load a workload file, or a preset by name (`WID1`, case-insensitive) from lrtrace/workloads.

    Trace ids are checked against `traces` (default: lrtrace/traces.yaml).
    """
    path = Path(path_or_preset)
    if not path.is_file():
        if path.suffix or len(path.parts) > 1:
            raise WorkloadError(f"{path}: no such workload file")
        matches = [p for p in workloads_dir().glob("*.yaml")
                   if p.stem.lower() == str(path_or_preset).lower()]
        if not matches:
            raise WorkloadError(
                f"{path_or_preset}: unknown workload preset (presets: {', '.join(preset_names())})"
            )
        path = matches[0]
    data = read_yaml(path, WorkloadError)
    return workload_from_dict(data, origin=str(path), default_name=path.stem, traces=traces)


def workload_from_dict(data: Any, *, origin: str = "<workload>", default_name: str = "workload",
                       traces: Mapping[int, Trace] | None = None) -> Workload:
    if not isinstance(data, Mapping):
        raise WorkloadError(f"{origin}: expected a mapping of workload keys")
    for key in data:
        if key not in _KEYS:
            raise WorkloadError(f"{origin}: {key}: unknown key (known: {', '.join(sorted(_KEYS))})")
    catalogue = traces if traces is not None else load_traces()
    top = _Fields(data, origin)
    if "streams" in data:
        for key in _STREAM_KEYS:
            if key in data:
                raise top.fail(key, "not allowed beside `streams` (each stream has its own)")
        streams = _streams(data["streams"], origin, catalogue)
        eps = sum(st.eps for st in streams)
        max_tpe = max(st.max_tpe for st in streams)
        trace_ids = tuple(dict.fromkeys(t for st in streams for t in st.traces))
        agents = sum(st.agents for st in streams)
    else:
        streams = ()
        eps, max_tpe, trace_ids, agents = _stream_fields(top, catalogue)
    if "duration_s" not in data:
        raise top.fail("duration_s", "missing")
    duration = top.number("duration_s", positive=True)
    seed = top.integer("seed", 0) if "seed" in data else 0
    latency = top.number("network_latency_s") if "network_latency_s" in data else 0.008
    return Workload(name=top.text("name", default_name), eps=eps, max_tpe=max_tpe,
                    traces=trace_ids, agents=agents, duration_s=duration, seed=seed,
                    network_latency_s=latency, description=top.text("description", ""),
                    context_tokens=top.context_range(), streams=streams)


_STREAM_KEYS = ("eps", "max_tpe", "traces", "agents")


class _Fields:
    """Typed reads of one mapping (the workload or one of its streams); errors name the file,
    the key (`streams[1].eps`) and the reason."""

    def __init__(self, data: Mapping[str, Any], origin: str, prefix: str = ""):
        self.data, self.origin, self.prefix = data, origin, prefix

    def fail(self, key: str, reason: str) -> WorkloadError:
        return WorkloadError(f"{self.origin}: {self.prefix}{key}: {reason}")

    def number(self, key: str, *, positive: bool = False) -> float:
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise self.fail(key, f"must be {'> 0' if positive else '>= 0'} and finite, "
                                 f"got {value!r}")
        return float(value)

    def integer(self, key: str, minimum: int) -> int:
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {value!r}")
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def text(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {value!r}")
        return value

    def context_range(self) -> tuple[int, int] | None:
        """`context_tokens: [min, max]` (tokens of each task's own context), or None if absent."""
        if "context_tokens" not in self.data:
            return None
        value = self.data["context_tokens"]
        if not (isinstance(value, list) and len(value) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
            raise self.fail("context_tokens", f"must be [min, max], two integers, got {value!r}")
        lo, hi = value
        if lo < CONTEXT_MIN_TOKENS:
            raise self.fail("context_tokens", f"min must be >= {CONTEXT_MIN_TOKENS} (a context "
                                              f"is a 3-token label and the task number in 3 "
                                              f"words), got {lo}")
        if hi < lo:
            raise self.fail("context_tokens", f"max must be >= min, got [{lo}, {hi}]")
        if hi > CONTEXT_MAX_TOKENS:
            raise self.fail("context_tokens", f"max must be <= {CONTEXT_MAX_TOKENS}, got {hi}")
        return (lo, hi)


def _stream_fields(fields: _Fields, catalogue: Mapping[int, Trace]
                   ) -> tuple[float, int, tuple[int, ...], int]:
    """eps, max_tpe, traces and agents of a workload or a stream, validated."""
    for key in _STREAM_KEYS:
        if key not in fields.data:
            raise fields.fail(key, "missing")
    eps = fields.number("eps")
    max_tpe = fields.integer("max_tpe", 1)
    agents = fields.integer("agents", 1)
    if max_tpe > agents:
        raise fields.fail("max_tpe", f"{max_tpe} tasks per event need at least as many agents "
                                     f"({agents})")
    try:
        trace_ids = _trace_ids(fields.data["traces"])
    except ValueError as exc:
        raise fields.fail("traces", str(exc)) from None
    for tid in trace_ids:
        if tid not in catalogue:
            raise fields.fail("traces", f"unknown trace id {tid}")
    return eps, max_tpe, trace_ids, agents


def _streams(value: Any, origin: str, catalogue: Mapping[int, Trace]) -> tuple[Stream, ...]:
    if not isinstance(value, list) or not value:
        raise WorkloadError(f"{origin}: streams: must be a non-empty list of streams")
    known = set(_STREAM_KEYS) | {"name", "context_tokens"}
    streams = []
    for i, entry in enumerate(value):
        where = f"streams[{i}]."
        if not isinstance(entry, Mapping):
            raise WorkloadError(f"{origin}: streams[{i}]: expected a mapping with "
                                f"{', '.join(_STREAM_KEYS)}")
        fields = _Fields(entry, origin, where)
        for key in entry:
            if key not in known:
                raise fields.fail(str(key), f"unknown key (known: {', '.join(sorted(known))})")
        eps, max_tpe, trace_ids, agents = _stream_fields(fields, catalogue)
        streams.append(Stream(fields.text("name", f"stream{i}"), eps, max_tpe, trace_ids,
                              agents, fields.context_range()))
    names = [st.name for st in streams]
    if len(set(names)) != len(names):
        raise WorkloadError(f"{origin}: streams: duplicate stream name")
    return tuple(streams)


_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def _trace_ids(value: Any) -> tuple[int, ...]:
    """Trace ids from an int, a `"1-8"` range (Table 3 writes [1-8]), or a list of those."""
    items = value if isinstance(value, list) else [value]
    ids: list[int] = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"bad trace id {item!r}")
        if isinstance(item, int):
            ids.append(item)
        elif isinstance(item, str) and _RANGE.match(item):
            lo, hi = map(int, _RANGE.match(item).groups())
            if lo > hi:
                raise ValueError(f"empty range {item!r}")
            ids.extend(range(lo, hi + 1))
        elif isinstance(item, str) and item.strip().isdigit():
            ids.append(int(item))
        else:
            raise ValueError(f"bad trace id {item!r} (use integers or ranges like \"1-8\")")
    if not ids:
        raise ValueError("no trace ids")
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate trace ids")
    if min(ids) < 1:
        raise ValueError("trace ids start at 1")
    return tuple(ids)


def _robot_id(category: str, index: int, agents: int) -> str:
    return f"{category}_{index:0{max(2, len(str(agents - 1)))}d}"


def compose(workload: Workload, traces: Mapping[int, Trace] | None = None) -> list[Event]:
    """Draw the events of a workload; the same workload (and seed) always gives the same list.

    Event times are a Poisson process: exponential gaps of mean 1/eps from t = 0, keeping events
    before `duration_s`. Each event starts k ~ Uniform{1..max_tpe} tasks; their robots are k
    distinct agent indices drawn uniformly without replacement, and each task's trace is drawn
    uniformly from `workload.traces`. Robots are not tracked across events: whether a robot is
    still busy depends on how fast plans are served, which only the replay knows, so the replayer
    decides what to do with a task for a busy robot. A robot id is the trace's category and the
    agent index (`drone_07`), so in a workload mixing categories an index names a robot slot.

    Streams: stream i draws its events the same way from the seed sequence (seed, i), at its rate
    times eps / (sum of stream rates), on agent indices after those of the streams before it;
    the streams' events are merged in time order and numbered. Context: a task whose workload (or
    stream) has `context_tokens` gets a context of Uniform{min..max} tokens (`context_text`),
    drawn in task order from the seed sequence (seed, "cont"), apart from the events' draws, so
    adding context does not change the events.
    """
    catalogue = traces if traces is not None else load_traces()
    missing = [t for t in workload.traces if t not in catalogue]
    if missing:
        raise WorkloadError(f"{workload.name}: traces: unknown trace id {missing[0]}")
    if workload.max_tpe > workload.agents:
        raise WorkloadError(f"{workload.name}: max_tpe: exceeds agents ({workload.agents})")
    if workload.eps <= 0:
        return []
    if workload.streams:
        drawn = _stream_draws(workload)
    else:
        drawn = [(t, robots, trace_ids, workload.context_tokens) for t, robots, trace_ids in
                 _draws(np.random.default_rng(workload.seed), workload.eps, workload.max_tpe,
                        workload.traces, workload.agents, workload.duration_s)]
    context_rng = np.random.default_rng([workload.seed, CONTEXT_SEED])
    events: list[Event] = []
    task_id = 0
    for t, robots, trace_ids, context_range in drawn:
        tasks = []
        for robot, tid in zip(robots, trace_ids):
            trace = catalogue[int(tid)]
            context = ""
            if context_range is not None:
                n = int(context_rng.integers(context_range[0], context_range[1] + 1))
                context = context_text(task_id, n, context_rng)
            tasks.append(TaskSpec(task_id, _robot_id(trace.category, int(robot), workload.agents),
                                  trace.trace_id, trace.tuf_level, context))
            task_id += 1
        events.append(Event(t, len(events), tuple(tasks)))
    return events


def _draws(rng: np.random.Generator, eps: float, max_tpe: int, traces: Sequence[int],
           agents: int, duration_s: float):
    """(time, agent indices, trace ids) of each event of one Poisson stream."""
    trace_ids = np.asarray(traces)
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / eps))
        if t >= duration_s:
            return
        k = int(rng.integers(1, max_tpe + 1))
        robots = rng.choice(agents, size=k, replace=False)
        yield t, robots, rng.choice(trace_ids, size=k)


def _stream_draws(workload: Workload) -> list[tuple[float, Any, Any, tuple[int, int] | None]]:
    total = sum(st.eps for st in workload.streams)
    scale = workload.eps / total if total > 0 else 0.0
    merged = []
    offset = 0
    for i, st in enumerate(workload.streams):
        context_range = st.context_tokens or workload.context_tokens
        if st.eps * scale > 0:
            rng = np.random.default_rng([workload.seed, i])
            for t, robots, trace_ids in _draws(rng, st.eps * scale, st.max_tpe, st.traces,
                                               st.agents, workload.duration_s):
                merged.append((t, i, robots + offset, trace_ids, context_range))
        offset += st.agents
    merged.sort(key=lambda d: (d[0], d[1]))
    return [(t, robots, trace_ids, context_range)
            for t, _, robots, trace_ids, context_range in merged]
