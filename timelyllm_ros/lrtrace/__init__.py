"""LRTrace: robot task traces, workload definitions and the events composed from them (paper §6)."""

from timelyllm_ros.lrtrace.event_lists import load_events, parse_event_notation, save_events
from timelyllm_ros.lrtrace.traces import Trace, TraceError, load_traces, lrtrace_dir
from timelyllm_ros.lrtrace.workload import (
    Event,
    TaskSpec,
    Workload,
    WorkloadError,
    compose,
    load_workload,
)

__all__ = [
    "Event",
    "TaskSpec",
    "Trace",
    "TraceError",
    "Workload",
    "WorkloadError",
    "compose",
    "load_events",
    "load_traces",
    "load_workload",
    "lrtrace_dir",
    "parse_event_notation",
    "save_events",
]
