"""Import the TimelyLLM authors' released workloads (`timelyllm lrtrace import-authors`).

Their data (github.com/MarkoMile/TimelyLLM, dataset/, CC BY 4.0) is a JSON array of jobs, each
with its arrival (`trigger time`), agent, trace id, instruction with its scene (`task_input`),
the measured time of every skill of its plan (`exe_time_detail`) and its TUF `[U0, ERT,
cut-off]`; a config file beside it records how the jobs were drawn (events, arrivals, agents).

The import writes a measured workload (measured.py) that keeps all of that exactly, its traces
(one per distinct instruction and skill list, with a plan in our dialect whose calls are the
job's measured skills, authors_skills.py), and a timing table of the measured skills that
`timelyllm lrtrace fit` reads. Every error names the file, the job and the field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from timelyllm_ros.core.engine.sim.tokenizer import PieceTokenizer
from timelyllm_ros.core.skills.skillset import SkillSet
from timelyllm_ros.lrtrace.authors_skills import (AuthorsImportError, build_plan, load_plans,
                                                  our_skill, why_unmapped)
from timelyllm_ros.lrtrace.measured import (FORMAT, MeasuredWorkload, default_skill_sets,
                                            load_measured, plan_calls)
from timelyllm_ros.lrtrace.timing_table import TimingRow, write_csv
from timelyllm_ros.lrtrace.traces import lrtrace_dir
from timelyllm_ros.lrtrace.workload import WorkloadError

REPOSITORY = "https://github.com/MarkoMile/TimelyLLM"
LICENCE = "CC BY 4.0"
LICENCE_URL = "https://creativecommons.org/licenses/by/4.0/"
CREDIT = (f"Data: the TimelyLLM authors' workload release ({REPOSITORY}, dataset/), licensed "
          f"{LICENCE} ({LICENCE_URL}).")
CHANGES = ("Changes: converted to LRTrace's measured-workload format; skill names mapped to "
           "ours; the plans are ours (lrtrace/authors/README.md).")
# Jobs of one event arrive `job_interval` apart; arrivals are sums of floats, so compare
# to well below a millisecond rather than exactly.
TIME_TOLERANCE_S = 1e-6
_CONFIG_KEYS = ("num_agents", "max_num_per_event", "lambda_rate", "job_interval",
                "data_sample_structure", "task_arrivals")
_ROBOT_TYPES = {None: "drone", "drone": "drone", "robotarm": "arm"}


def default_plans_path() -> Path:
    return lrtrace_dir() / "authors" / "plans.yaml"


@dataclass(frozen=True)
class Job:
    job_id: int
    time_s: Any  # as in the source (a JSON number), written back unchanged
    agent: int
    trace_id: int
    task_input: str
    skills: tuple[tuple[str, Any], ...]  # (their skill, seconds as in the source)
    tuf: tuple[Any, Any, Any]
    skill_set: str
    event: int = -1


@dataclass
class ImportResult:
    name: str
    workload_path: Path
    traces_path: Path
    timings_path: Path
    jobs: int
    events: int
    traces: list[dict[str, Any]]
    mapped: dict[str, dict[str, str]] = field(default_factory=dict)  # skill set: theirs -> ours
    tuf_levels: dict[str, list] = field(default_factory=dict)


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthorsImportError(f"{path}: cannot read: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise AuthorsImportError(f"{path}: line {exc.lineno} column {exc.colno}: invalid JSON: "
                                 f"{exc.msg}") from None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_config(path: Path) -> dict[str, Any]:
    cfg = _read_json(path)
    if not isinstance(cfg, Mapping):
        raise AuthorsImportError(f"{path}: expected a JSON object of generator settings")
    for key in _CONFIG_KEYS:
        if key not in cfg:
            raise AuthorsImportError(f"{path}: {key}: missing")
    for key in ("num_agents", "max_num_per_event"):
        if not _is_int(cfg[key]) or cfg[key] < 1:
            raise AuthorsImportError(f"{path}: {key}: must be an integer >= 1, got {cfg[key]!r}")
    for key in ("lambda_rate", "job_interval"):
        if not _is_number(cfg[key]) or cfg[key] < 0:
            raise AuthorsImportError(f"{path}: {key}: must be a number >= 0, got {cfg[key]!r}")
    structure, arrivals = cfg["data_sample_structure"], cfg["task_arrivals"]
    if not isinstance(structure, list) or not all(
            isinstance(e, list) and all(_is_int(t) for t in e) for e in structure):
        raise AuthorsImportError(f"{path}: data_sample_structure: must be a list of events, each "
                                 "a list of trace ids")
    if not isinstance(arrivals, list) or not all(_is_number(t) for t in arrivals):
        raise AuthorsImportError(f"{path}: task_arrivals: must be a list of times in seconds")
    if len(arrivals) != len(structure):
        raise AuthorsImportError(f"{path}: task_arrivals: {len(arrivals)} arrivals for "
                                 f"{len(structure)} events in data_sample_structure")
    return dict(cfg)


def read_jobs(path: Path, cfg: Mapping[str, Any], config_path: Path) -> list[Job]:
    """The jobs in file order, checked field by field and against the config's events."""
    data = _read_json(path)
    if not isinstance(data, list) or not data:
        raise AuthorsImportError(f"{path}: expected a non-empty JSON array of jobs")
    slots = [(i, k, t) for i, event in enumerate(cfg["data_sample_structure"])
             for k, t in enumerate(event)]
    if len(slots) != len(data):
        raise AuthorsImportError(f"{config_path}: data_sample_structure: lists {len(slots)} jobs, "
                                 f"{path.name} has {len(data)}")
    jobs, seen = [], set()
    for index, (entry, (event, k, slot_trace)) in enumerate(zip(data, slots)):
        job = _job(entry, index, path, cfg["num_agents"], config_path)
        where = f"{path}: job {job.job_id}"
        if job.job_id in seen:
            raise AuthorsImportError(f"{where}: job_id: duplicate")
        seen.add(job.job_id)
        if job.trace_id != slot_trace:
            raise AuthorsImportError(
                f"{where}: trace_id: {job.trace_id}, but {config_path.name} lists trace "
                f"{slot_trace} at event {event} position {k}")
        expected = cfg["task_arrivals"][event] + k * cfg["job_interval"]
        if abs(job.time_s - expected) > TIME_TOLERANCE_S:
            raise AuthorsImportError(
                f"{where}: trigger time: {job.time_s!r}, but {config_path.name} has event {event} "
                f"arriving at {cfg['task_arrivals'][event]!r} and this job {k} x "
                f"{cfg['job_interval']} s later ({expected!r})")
        jobs.append(dataclasses.replace(job, event=event))
    return jobs


def _job(entry: Any, index: int, path: Path, num_agents: int, config_path: Path) -> Job:
    if not isinstance(entry, Mapping):
        raise AuthorsImportError(f"{path}: job at index {index}: expected a JSON object")
    job_id = entry.get("job_id")
    if not _is_int(job_id) or job_id < 0:
        raise AuthorsImportError(f"{path}: job at index {index}: job_id: must be an integer "
                                 f">= 0, got {job_id!r}")
    where = f"{path}: job {job_id}"
    for key in ("trigger time", "agent_id", "trace_id", "task_input", "exe_time_detail", "tuf"):
        if key not in entry:
            raise AuthorsImportError(f"{where}: {key}: missing")
    time_s = entry["trigger time"]
    if not _is_number(time_s) or time_s < 0:
        raise AuthorsImportError(f"{where}: trigger time: must be a number >= 0, got {time_s!r}")
    agent = entry["agent_id"]
    if not _is_int(agent) or not 0 <= agent < num_agents:
        raise AuthorsImportError(f"{where}: agent_id: must be an integer in [0, {num_agents}) "
                                 f"(num_agents in {config_path.name}), got {agent!r}")
    if not _is_int(entry["trace_id"]) or entry["trace_id"] < 0:
        raise AuthorsImportError(f"{where}: trace_id: must be an integer >= 0, got "
                                 f"{entry['trace_id']!r}")
    text = entry["task_input"]
    if not isinstance(text, str) or not text.strip():
        raise AuthorsImportError(f"{where}: task_input: must be a non-empty string")
    if text != text.strip():  # our traces strip instructions; refuse rather than alter one
        raise AuthorsImportError(f"{where}: task_input: leading or trailing whitespace")
    robot_type = entry.get("robot_type")
    if robot_type not in _ROBOT_TYPES:
        raise AuthorsImportError(f"{where}: robot_type: {robot_type!r} is not one we import "
                                 f"({', '.join(t for t in _ROBOT_TYPES if t)})")
    detail = entry["exe_time_detail"]
    if not isinstance(detail, list) or not detail:
        raise AuthorsImportError(f"{where}: exe_time_detail: must be a non-empty list of "
                                 "[skill, seconds]")
    skills = []
    for i, pair in enumerate(detail):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                and pair[0] and _is_number(pair[1]) and pair[1] >= 0):
            raise AuthorsImportError(f"{where}: exe_time_detail[{i}]: must be [skill, seconds "
                                     f">= 0], got {pair!r}")
        skills.append((pair[0], pair[1]))
    total = entry.get("task_exe_time")
    if total is not None and (not _is_number(total)
                              or abs(total - sum(t for _, t in skills)) > 1e-4):
        raise AuthorsImportError(f"{where}: task_exe_time: {total!r} is not the sum of "
                                 f"exe_time_detail ({sum(t for _, t in skills)!r})")
    tuf = entry["tuf"]
    if not (isinstance(tuf, list) and len(tuf) == 3 and all(_is_number(v) for v in tuf)
            and tuf[0] > 0 and tuf[1] >= 0 and tuf[2] > tuf[1]):
        raise AuthorsImportError(f"{where}: tuf: must be [U0 > 0, ERT >= 0, cut-off > ERT], "
                                 f"got {tuf!r}")
    return Job(job_id, time_s, agent, entry["trace_id"], text, tuple(skills), tuple(tuf),
               _ROBOT_TYPES[robot_type])


def check_mapped(jobs: Sequence[Job], path: Path) -> None:
    """Every skill maps to ours, or one error names each one that does not."""
    missing: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for job in jobs:
        for i, (theirs, _) in enumerate(job.skills):
            if our_skill(job.skill_set, theirs) is None:
                missing.setdefault((job.skill_set, theirs), []).append((job.job_id, i))
    if missing:
        lines = [f"  {theirs!r} ({why_unmapped(skill_set, theirs)}): {len(where)} job(s), first "
                 f"job {where[0][0]} exe_time_detail[{where[0][1]}]"
                 for (skill_set, theirs), where in sorted(missing.items())]
        raise AuthorsImportError(f"{path}: {len(missing)} skill(s) with no equivalent in our "
                                 "skill sets:\n" + "\n".join(lines))


def tuf_level_name(triple: Sequence[Any]) -> str:
    """`normal` and `urgent` for the paper's two TUFs (the workload defines them with the
    authors' exact values), a name spelling the values out for any other."""
    u0, ert, cutoff = (float(v) for v in triple)
    if (u0, ert) == (1.0, 1.0):
        return "normal" if cutoff == 1.5 else f"normal-cut{cutoff:g}"
    if (u0, ert) == (2.0, 0.2):
        return "urgent" if cutoff == 0.5 else f"urgent-cut{cutoff:g}"
    return f"tuf-u{u0:g}-ert{ert:g}-cut{cutoff:g}"


def build_traces(jobs: Sequence[Job], plans: Mapping[str, str], plans_path: Path | None,
                 skill_sets: Mapping[str, SkillSet], source_name: str
                 ) -> tuple[list[dict[str, Any]], dict[int, int], dict[int, dict[str, Any]]]:
    """Our traces (one per skill set, authors' trace, instruction and skill list), each job's
    trace id, and each trace's provenance."""
    groups: dict[tuple, list[Job]] = {}
    for job in sorted(jobs, key=lambda j: (j.trace_id, j.job_id)):
        key = (job.skill_set, job.trace_id, job.task_input, tuple(s for s, _ in job.skills))
        groups.setdefault(key, []).append(job)
    traces, trace_of, provenance = [], {}, {}
    tokenizer = PieceTokenizer()
    for tid, ((skill_set, their_trace, text, names), members) in enumerate(groups.items(), 1):
        first = members[0]
        ours = [our_skill(skill_set, n).name for n in names]
        plan = plans.get(text)
        origin = f"from {plans_path.name}" if plan is not None and plans_path else "built"
        if plan is None:
            plan = build_plan(skill_set, first.skills)
        sset = skill_sets[skill_set]
        where = (f"{plans_path}: plan for {text!r}" if origin != "built"
                 else f"{source_name}: job {first.job_id}: plan built from exe_time_detail")
        try:
            calls = [c.name for c in plan_calls(sset, plan)]
        except ValueError as exc:
            raise AuthorsImportError(f"{where}: {plan!r} is not a plan of our {skill_set} "
                                     f"skill set: {exc}") from None
        if calls != ours:
            raise AuthorsImportError(
                f"{where}: its calls are {', '.join(calls)}, but job {first.job_id}'s "
                f"exe_time_detail ({', '.join(names)}) maps to {', '.join(ours)}")
        n_tokens = len(tokenizer.tokenize(plan))
        if n_tokens > sset.max_plan_tokens:
            raise AuthorsImportError(f"{where}: {n_tokens} tokens, more than our {skill_set} "
                                     f"skill set's max_plan_tokens ({sset.max_plan_tokens})")
        traces.append({
            "id": tid, "instruction": text, "category": skill_set,
            "tuf_level": tuf_level_name(first.tuf), "skill_set": skill_set, "plan": plan,
            "notes": (f"The TimelyLLM authors' trace {their_trace} ({source_name}): their skills "
                      f"{' '.join(names)} are our {' '.join(ours)}; plan {origin}.")})
        provenance[tid] = {"authors_trace": their_trace, "skills": list(names)}
        for job in members:
            trace_of[job.job_id] = tid
    return traces, trace_of, provenance


def timing_rows(measured: MeasuredWorkload,
                skill_sets: Mapping[str, SkillSet] | None = None) -> list[TimingRow]:
    """A measured workload as a timing table (timing_table.py): one single-call row per measured
    skill, what `timelyllm lrtrace fit` reads. The data has durations only, so `start` and
    `finish` are offsets from the job's first call."""
    skill_sets = skill_sets if skill_sets is not None else default_skill_sets()
    calls = {tid: plan_calls(skill_sets[t.skill_set], t.plan)
             for tid, t in measured.traces.items()}
    rows = []
    for j in measured.jobs:
        theirs = measured.trace_skills.get(j.trace, {}).get("skills", [])
        offset = 0.0
        for k, (call, t) in enumerate(zip(calls[j.trace], j.times)):
            rows.append(TimingRow(
                skill=call.name, arguments=",".join(call.args), robot=j.robot,
                task_id=f"job{j.job:05d}", sequence=k, start=offset, finish=offset + t,
                duration=t, success=True, calls_in_segment=1,
                message=f"authors' {theirs[k]}" if k < len(theirs) else ""))
            offset += t
    return rows


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _header(lines: Sequence[str]) -> str:
    return "".join(f"# {line}\n" if line else "#\n" for line in lines)


def _job_line(entry: Mapping[str, Any]) -> str:
    return "- " + yaml.safe_dump(dict(entry), default_flow_style=True, width=10 ** 6,
                                 sort_keys=False).strip() + "\n"


def import_authors(data_path: str | Path, config_path: str | Path, output_dir: str | Path, *,
                   name: str | None = None, plans_path: str | Path | None = None,
                   force: bool = False, command: str = "",
                   skill_sets: Mapping[str, SkillSet] | None = None) -> ImportResult:
    """Convert one data file; writes NAME.yaml, NAME.traces.yaml and NAME.timings.csv under
    `output_dir` (AuthorsImportError for bad data or an existing output without `force`)."""
    data_path, config_path, out = Path(data_path), Path(config_path), Path(output_dir)
    name = name or data_path.stem
    paths = [out / f"{name}.yaml", out / f"{name}.traces.yaml", out / f"{name}.timings.csv"]
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise AuthorsImportError(f"{existing[0]}: already exists (pass --force to replace it)")
    cfg = read_config(config_path)
    jobs = read_jobs(data_path, cfg, config_path)
    check_mapped(jobs, data_path)
    plans = load_plans(plans_path) if plans_path is not None else {}
    skill_sets = skill_sets if skill_sets is not None else default_skill_sets()
    traces, trace_of, provenance = build_traces(
        jobs, plans, Path(plans_path) if plans_path is not None else None, skill_sets,
        data_path.name)
    levels = {tuf_level_name(j.tuf): list(j.tuf) for j in jobs}
    width = max(2, len(str(cfg["num_agents"] - 1)))
    ordered = sorted(jobs, key=lambda j: (j.time_s, j.job_id))
    kinds = sorted({j.skill_set for j in jobs})
    header = [f"{name}: the TimelyLLM authors' workload {data_path.name}, imported by",
              f"  {command or 'timelyllm lrtrace import-authors'}", CREDIT, CHANGES]
    source = {"data": data_path.name, "data_sha256": _sha256(data_path),
              "config": config_path.name, "config_sha256": _sha256(config_path),
              "repository": REPOSITORY, "licence": LICENCE, "licence_url": LICENCE_URL,
              "credit": "the TimelyLLM authors",
              "generator": {k: cfg[k] for k in ("num_agents", "max_num_per_event",
                                                "lambda_rate", "job_interval")},
              "events": len(cfg["data_sample_structure"])}
    description = (f"The TimelyLLM authors' {'/'.join(kinds)} workload {data_path.name}: "
                   f"{len(jobs)} jobs in {source['events']} events (one event per job here, "
                   f"at its own arrival), {cfg['num_agents']} agents, up to "
                   f"{cfg['max_num_per_event']} jobs per event, {cfg['lambda_rate']} events/s; "
                   f"measured skill times. Data {LICENCE}, the TimelyLLM authors ({REPOSITORY}).")
    head = {"format": FORMAT, "name": name, "description": description, "source": source,
            "traces_file": paths[1].name, "agents": cfg["num_agents"],
            "max_tpe": cfg["max_num_per_event"], "network_latency_s": 0.008,
            "tuf_levels": levels, "trace_skills": provenance}
    body = yaml.safe_dump(head, sort_keys=False, default_flow_style=None, width=100)
    body += "jobs:\n" + "".join(_job_line({
        "job": j.job_id, "event": j.event, "time_s": j.time_s,
        "robot": f"{j.skill_set}_{j.agent:0{width}d}", "trace": trace_of[j.job_id],
        "tuf": tuf_level_name(j.tuf), "times": [t for _, t in j.skills]}) for j in ordered)
    out.mkdir(parents=True, exist_ok=True)
    paths[0].write_text(_header(header + [
        "One job per line: job and event (the source's ids), time_s (arrival, s), robot",
        "(agent), trace (in traces_file), tuf (a level of tuf_levels: [U0, ERT s, cut-off s])",
        "and times: the measured seconds of each skill call of the trace's plan, in order."])
        + body, encoding="utf-8")
    paths[1].write_text(_header(header) + yaml.safe_dump(
        {"schema": 1, "traces": traces}, sort_keys=False, width=100, allow_unicode=True),
        encoding="utf-8")
    try:  # read back as the bench will: the plans' calls line up with every job's times
        measured = load_measured(paths[0], skill_sets=skill_sets)
    except WorkloadError as exc:  # pragma: no cover - a bug here, not bad data
        raise AuthorsImportError(f"the written workload does not load: {exc}") from None
    write_csv(timing_rows(measured, skill_sets), paths[2])
    mapped: dict[str, dict[str, str]] = {}
    for j in jobs:
        for theirs, _ in j.skills:
            mapped.setdefault(j.skill_set, {})[theirs] = our_skill(j.skill_set, theirs).name
    return ImportResult(name, paths[0], paths[1], paths[2], len(jobs), source["events"],
                        traces, mapped, levels)
