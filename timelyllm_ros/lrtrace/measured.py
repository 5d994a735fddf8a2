"""Workloads whose robot times were measured: every job fixes its arrival, robot, trace (the
instruction and the plan), TUF and the measured duration of each skill call of its plan.

A composed workload (workload.py) draws arrivals and leaves robot times to the execution-time
model; a measured workload replays a recorded run exactly, as the TimelyLLM authors' released
data does (`timelyllm lrtrace import-authors`, lrtrace/authors.py). The file:

    format: lrtrace-measured/1
    name: drone-high
    traces_file: drone-high.traces.yaml      # beside this file, lrtrace/traces.yaml's schema
    tuf_levels: {normal: [1, 1, 1.5]}        # [U0, ERT s, cut-off s] per level name
    trace_skills: {1: {authors_trace: 0, skills: [s(, g(]}}   # provenance of each trace
    jobs:
    - {job: 0, time_s: 33.94, robot: drone_00, trace: 1, tuf: normal, times: [1.5563, 2.4613]}

The i-th time of a job is the duration of the i-th skill call of its trace's plan, in text
order (the order in which the plan's segments reach the robot), so a job has exactly as many
times as its plan has calls. `timelyllm bench --workload FILE` replays it: each job is one event
at its own time, and the simulated robots take `times` instead of sampling the model
(`MeasuredWorkload.run_kwargs`, `call_durations`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence


from timelyllm_ros.core.skills.base import SkillCall, SkillSyntaxError
from timelyllm_ros.core.skills.skillset import SkillSet, load_skillsets
from timelyllm_ros.core.tuf import TUF, TufError, TufLevels, default_config_dir
from timelyllm_ros.lrtrace.traces import Trace, TraceError, load_traces, read_yaml
from timelyllm_ros.lrtrace.workload import Event, TaskSpec, Workload, WorkloadError

FORMAT = "lrtrace-measured/1"
_KEYS = {"format", "name", "description", "source", "traces_file", "agents", "max_tpe",
         "network_latency_s", "tuf_levels", "trace_skills", "jobs"}
_JOB_KEYS = ("job", "event", "time_s", "robot", "trace", "tuf", "times")


@dataclass(frozen=True)
class MeasuredJob:
    job: int  # the source's job id
    event: int  # the source's event index (its jobs arrive together, 1 ms apart)
    time_s: float
    robot: str
    trace: int
    tuf: str  # a level name of the workload's tuf_levels
    times: tuple[float, ...]  # seconds, one per skill call of the trace's plan


@dataclass(frozen=True)
class MeasuredWorkload:
    workload: Workload
    jobs: tuple[MeasuredJob, ...]  # in arrival order; job i is task number i
    traces: dict[int, Trace]
    tuf_triples: dict[str, tuple[float, float, float]]  # level -> (U0, ERT, cut-off)
    trace_skills: dict[int, dict[str, Any]]
    source: dict[str, Any]

    @property
    def events(self) -> list[Event]:
        """One event per job, at the job's own time (the source's jobs of one event are 1 ms
        apart, and each keeps its arrival)."""
        return [Event(j.time_s, i, (TaskSpec(i, j.robot, j.trace, j.tuf),))
                for i, j in enumerate(self.jobs)]

    def tuf_levels(self) -> TufLevels:
        return TufLevels({name: tuf_from_triple(t) for name, t in self.tuf_triples.items()},
                         source=self.workload.name)

    def call_durations(self) -> dict[tuple[int, int], float]:
        """(task number, call index) -> measured seconds, what the simulated robots execute."""
        return {(i, k): t for i, j in enumerate(self.jobs) for k, t in enumerate(j.times)}

    def run_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `bench.replay.run_policy`: this workload's traces and TUFs, and
        its measured robot times in place of the execution-time model's samples."""
        return {"traces": self.traces, "tuf_levels": self.tuf_levels(),
                "call_durations": self.call_durations()}

    def credit(self) -> str:
        """Comment lines crediting the source of the data ("" for a workload without one)."""
        src = self.source
        if not src.get("credit"):
            return ""
        return (f"# Data: {src['credit']}, {src.get('repository', '')} ({src.get('data', '')}), "
                f"licensed {src.get('licence', '')} ({src.get('licence_url', '')}); imported "
                f"as {self.workload.name} by `timelyllm lrtrace import-authors`.\n")


def tuf_from_triple(triple: Sequence[float]) -> TUF:
    """The authors write a TUF as [U0, ERT, cut-off]; ours is (ERT, slope, U0) with the cut-off
    at ERT + U0 / slope."""
    u0, ert, cutoff = (float(v) for v in triple)
    if not cutoff > ert:
        raise TufError("cut-off", f"{cutoff:g} s must be later than the ERT {ert:g} s")
    return TUF(ert, u0 / (cutoff - ert), u0).validate()


def default_skill_sets() -> dict[str, SkillSet]:
    return load_skillsets(default_config_dir() / "skillsets")


def plan_calls(skill_set: SkillSet, plan: str) -> list[SkillCall]:
    """The skill calls of a whole plan in text order, segment by segment as the planner cuts
    it (SkillSyntaxError for a plan the skill set's language does not accept)."""
    lang = skill_set.language
    calls: list[SkillCall] = []
    start = 0
    while start < len(plan) and plan[start:].strip():
        end = lang.next_boundary(plan, start)
        if end is None:
            end = lang.final_segment_end(plan, start)
            if end is None:
                raise SkillSyntaxError("the plan ends inside a statement", start)
        calls.extend(lang.parse(plan[start:end]).calls)
        start = end
    return calls


def is_measured(data: Any) -> bool:
    return isinstance(data, Mapping) and data.get("format") == FORMAT


def is_measured_file(path: str | Path) -> bool:
    """Whether `path` is a measured workload: its first key, after the comment header, is
    `format: lrtrace-measured/1` (read only that far)."""
    try:
        with Path(path).open(encoding="utf-8") as fh:
            for line in fh:
                text = line.strip()
                if text and not text.startswith("#"):
                    return text == f"format: {FORMAT}"
    except (OSError, UnicodeDecodeError):
        return False
    return False


def load_measured(path: str | Path, duration_s: float | None = None,
                  skill_sets: Mapping[str, SkillSet] | None = None) -> MeasuredWorkload:
    """Read and check a measured workload; `duration_s` keeps the jobs that arrive before it.
    WorkloadError names the file, the job and the field."""
    path = Path(path)
    data = read_yaml(path, WorkloadError)
    if not is_measured(data):
        raise WorkloadError(f"{path}: format: expected {FORMAT!r}")
    unknown = sorted(set(map(str, data)) - _KEYS)
    if unknown:
        raise WorkloadError(f"{path}: {unknown[0]}: unknown key (known: {', '.join(sorted(_KEYS))})")
    for key in ("traces_file", "tuf_levels", "jobs"):
        if key not in data:
            raise WorkloadError(f"{path}: {key}: missing")
    traces_file = data["traces_file"]
    if not isinstance(traces_file, str) or not traces_file:
        raise WorkloadError(f"{path}: traces_file: must be a file name, got {traces_file!r}")
    try:
        traces = load_traces(path.parent / traces_file)
    except TraceError as exc:
        raise WorkloadError(f"{path}: traces_file: {exc}") from None
    triples = _tuf_levels(data["tuf_levels"], path)
    skill_sets = skill_sets if skill_sets is not None else default_skill_sets()
    n_calls = _calls_per_trace(traces, skill_sets, path)
    if not isinstance(data["jobs"], list) or not data["jobs"]:
        raise WorkloadError(f"{path}: jobs: must be a non-empty list")
    jobs = [_job(entry, i, path, traces, triples, n_calls) for i, entry in enumerate(data["jobs"])]
    if len({j.job for j in jobs}) != len(jobs):
        raise WorkloadError(f"{path}: jobs: duplicate job id")
    jobs.sort(key=lambda j: (j.time_s, j.job))
    if duration_s is not None:
        if not duration_s > 0:
            raise ValueError(f"duration_s: must be > 0, got {duration_s}")
        jobs = [j for j in jobs if j.time_s < duration_s]
    name = data.get("name", path.stem)
    latency = data.get("network_latency_s", 0.008)
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or latency < 0:
        raise WorkloadError(f"{path}: network_latency_s: must be a number >= 0, got {latency!r}")
    last = max((j.time_s for j in jobs), default=0.0)
    workload = Workload(
        name=str(name), eps=0.0,  # replayed as recorded: no rate to compose or scale
        max_tpe=int(data.get("max_tpe", 1)), traces=tuple(sorted({j.trace for j in jobs} or {1})),
        agents=int(data.get("agents", len({j.robot for j in jobs}) or 1)),
        duration_s=float(duration_s) if duration_s is not None else last + 1.0,
        network_latency_s=float(latency), description=str(data.get("description", "")))
    trace_skills = {int(k): dict(v) for k, v in (data.get("trace_skills") or {}).items()}
    return MeasuredWorkload(workload, tuple(jobs), traces, triples, trace_skills,
                            dict(data.get("source") or {}))


def _tuf_levels(value: Any, path: Path) -> dict[str, tuple[float, float, float]]:
    if not isinstance(value, Mapping) or not value:
        raise WorkloadError(f"{path}: tuf_levels: must map level names to [U0, ERT, cut-off]")
    out = {}
    for name, triple in value.items():
        if not (isinstance(triple, list) and len(triple) == 3 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in triple)):
            raise WorkloadError(f"{path}: tuf_levels.{name}: must be [U0, ERT, cut-off], "
                                f"got {triple!r}")
        try:
            tuf_from_triple(triple)
        except TufError as exc:
            raise WorkloadError(f"{path}: tuf_levels.{name}: {exc}") from None
        out[str(name)] = tuple(triple)
    return out


def _calls_per_trace(traces: Mapping[int, Trace], skill_sets: Mapping[str, SkillSet],
                     path: Path) -> dict[int, int]:
    out = {}
    for tid, trace in traces.items():
        if trace.skill_set not in skill_sets:
            raise WorkloadError(f"{path}: trace {tid}: skill_set: unknown skill set "
                                f"{trace.skill_set!r}")
        try:
            out[tid] = len(plan_calls(skill_sets[trace.skill_set], trace.plan))
        except ValueError as exc:
            raise WorkloadError(f"{path}: trace {tid}: plan: {exc}") from None
    return out


def _job(entry: Any, index: int, path: Path, traces: Mapping[int, Trace],
         triples: Mapping[str, Any], n_calls: Mapping[int, int]) -> MeasuredJob:
    if not isinstance(entry, Mapping):
        raise WorkloadError(f"{path}: jobs[{index}]: expected a mapping with "
                            f"{', '.join(_JOB_KEYS)}")
    job = entry.get("job")
    where = f"{path}: job {job}" if isinstance(job, int) else f"{path}: jobs[{index}]"
    for key in entry:
        if key not in _JOB_KEYS:
            raise WorkloadError(f"{where}: {key}: unknown key")
    for key in _JOB_KEYS:
        if key not in entry:
            raise WorkloadError(f"{where}: {key}: missing")
    if isinstance(job, bool) or not isinstance(job, int) or job < 0:
        raise WorkloadError(f"{where}: job: must be an integer >= 0, got {job!r}")
    event = entry["event"]
    if isinstance(event, bool) or not isinstance(event, int) or event < 0:
        raise WorkloadError(f"{where}: event: must be an integer >= 0, got {event!r}")
    time_s = entry["time_s"]
    if isinstance(time_s, bool) or not isinstance(time_s, (int, float)) \
            or not math.isfinite(time_s) or time_s < 0:
        raise WorkloadError(f"{where}: time_s: must be a number >= 0, got {time_s!r}")
    robot = entry["robot"]
    if not isinstance(robot, str) or not robot:
        raise WorkloadError(f"{where}: robot: must be a non-empty string, got {robot!r}")
    trace = entry["trace"]
    if isinstance(trace, bool) or trace not in traces:
        raise WorkloadError(f"{where}: trace: unknown trace id {trace!r}")
    tuf = entry["tuf"]
    if tuf not in triples:
        raise WorkloadError(f"{where}: tuf: unknown level {tuf!r} (tuf_levels: "
                            f"{', '.join(triples)})")
    times = entry["times"]
    if not isinstance(times, list) or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
            and t >= 0 for t in times):
        raise WorkloadError(f"{where}: times: must be a list of seconds >= 0, got {times!r}")
    if len(times) != n_calls[trace]:
        raise WorkloadError(f"{where}: times: {len(times)} measured times, but the plan of trace "
                            f"{trace} has {n_calls[trace]} skill calls")
    return MeasuredJob(job, event, float(time_s), robot, trace, str(tuf),
                       tuple(float(t) for t in times))
