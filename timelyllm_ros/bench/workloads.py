"""What a replay replays: a workload preset or file composed into events, an event-list file, or
a seed paper's workload (bench/paper_workloads.py). Both `timelyllm bench` and the ROS replay
(`timelyllm lrtrace replay`) load their events here."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from timelyllm_ros.bench import paper_workloads
from timelyllm_ros.lrtrace.event_lists import load_events
from timelyllm_ros.lrtrace.measured import is_measured_file, load_measured
from timelyllm_ros.lrtrace.workload import Event, Workload, WorkloadError, compose, load_workload


class WorkloadSourceError(Exception):
    """A workload that cannot be loaded as asked. `argument` names the input at fault:
    "workload" (no readable workload, preset or event list) or "duration_s"."""

    def __init__(self, message: str, argument: str = "workload"):
        super().__init__(message)
        self.argument = argument


def shorten(workload: Workload, duration_s: float | None) -> Workload:
    """The workload cut to `duration_s` (events are a prefix of the full run's: same seed)."""
    if duration_s is None:
        return workload
    if not duration_s > 0:
        raise ValueError(f"duration_s: must be > 0, got {duration_s}")
    return replace(workload, duration_s=float(duration_s))


def load_workload_events(spec: str, seed: int | None,
                         duration_s: float | None) -> tuple[Workload, list[Event]]:
    """(workload, events) for a preset name, a workload file or an event-list file.

    An event list (a YAML file with `events:`) is replayed as written, cut to the events before
    `duration_s`; its workload is a description of it (traces, robots, duration). A workload is
    composed with `seed` (None = its own) and cut to `duration_s`. WorkloadSourceError for a
    file that cannot be read, a workload that does not load, or a duration that is not > 0."""
    path = Path(spec)
    if path.is_file():
        if is_measured_file(path):  # its traces are its own: the global ids would mislead
            raise WorkloadSourceError(f"workload {spec}: a workload with measured robot times "
                                      "(lrtrace/measured.py); `timelyllm bench` replays it")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise WorkloadSourceError(f"workload {spec}: cannot read: {exc}") from None
        if isinstance(data, dict) and "events" in data:
            return _event_list(path, seed, duration_s)
    try:
        workload = load_workload(spec)
    except WorkloadError as exc:
        raise WorkloadSourceError(f"workload: {exc}") from None
    if seed is not None:
        workload = replace(workload, seed=seed)
    try:
        workload = shorten(workload, duration_s)
    except ValueError as exc:
        raise WorkloadSourceError(str(exc), argument="duration_s") from None
    return workload, compose(workload)


def load_bench_workload(spec: str, seed: int | None, duration_s: float | None
                        ) -> tuple[Workload, list[Event], dict[str, Any]]:
    """`load_workload_events`, plus the keyword arguments of `bench.replay.run_policy` that the
    workload brings. A measured workload (`lrtrace import-authors`) brings its own traces and
    TUF levels, and the measured duration of every skill call (`call_durations`), which the
    simulated robots execute instead of sampling the execution-time model."""
    path = Path(spec)
    if not (path.is_file() and is_measured_file(path)):
        return (*load_workload_events(spec, seed, duration_s), {})
    try:
        measured = load_measured(path, duration_s)
    except WorkloadError as exc:
        raise WorkloadSourceError(f"workload: {exc}") from None
    except ValueError as exc:
        raise WorkloadSourceError(str(exc), argument="duration_s") from None
    return measured.workload, measured.events, measured.run_kwargs()


def _event_list(path: Path, seed: int | None,
                duration_s: float | None) -> tuple[Workload, list[Event]]:
    try:
        events = load_events(path)
    except WorkloadError as exc:
        raise WorkloadSourceError(f"workload: {exc}") from None
    if duration_s is not None:
        events = [e for e in events if e.time_s < duration_s]
    last = max((e.time_s for e in events), default=0.0)
    traces = sorted({t.trace_id for e in events for t in e.tasks}) or [1]
    workload = Workload(name=path.stem, eps=0.0, max_tpe=max(
        (len(e.tasks) for e in events), default=1), traces=tuple(traces),
        agents=len({t.robot_id for e in events for t in e.tasks}) or 1,
        duration_s=duration_s or last + 1.0, seed=seed or 0,
        description=f"event list {path}")
    return workload, events


def scenario_accepts(name: str, parameter: str) -> bool:
    """Whether the seed paper's workload `name` is built with `parameter`: `duration_s` for one
    bounded by time, `n` for one with a fixed request count."""
    # Looked up at call time: tests replace the scenario table with smaller workloads.
    build = paper_workloads.SCENARIOS[name.lower()]
    return parameter in inspect.signature(build).parameters
