"""What an LRTrace replay over ROS will do: its options (`ReplayOptions`, filled by
`timelyllm lrtrace replay`) and its plan (`ReplayPlan`: the tasks to publish, in the bench's
numbering, the robots to start and how they time their skills)."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from timelyllm_ros.bench.workloads import WorkloadSourceError, load_workload_events
from timelyllm_ros.core.exec_model import ExecModelConfigError, ExecutionTimeModel
from timelyllm_ros.core.tuf import load_tuf_levels
from timelyllm_ros.lrtrace import timing_table
from timelyllm_ros.lrtrace.bag import BagError, bag_output_paths
from timelyllm_ros.lrtrace.timing_table import TimingRow
from timelyllm_ros.lrtrace.traces import Trace, TraceError, load_traces
from timelyllm_ros.lrtrace.workload import Event, Workload

PROG = "timelyllm lrtrace replay"
DEFAULT_POLICY = "timelyllm"


class ReplayError(Exception):
    """Bad data or a failed run: exit status 1 (bad arguments are the command's, status 2)."""


def warn(text: str) -> None:
    print(f"{PROG}: warning: {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ReplayOptions:
    """One replay, as `timelyllm lrtrace replay` was asked for it (see its --help)."""

    workload: str  # event list YAML, workload YAML or preset name
    policy: str | None = None  # None: DEFAULT_POLICY (not with attach)
    engine: str | None = None  # "sim" | "vllm"; None: "sim"
    model: str | None = None
    profile: str | None = None
    attach: bool = False  # use the planner already running in this ROS domain
    no_robots: bool = False  # with attach: start no executors
    exec_model: str | None = None
    durations_from: str | None = None  # bag or timing table whose durations robots replay
    json_path: str | None = None
    record: str | None = None  # keep the bag here
    time_scale: float = 1.0
    duration_s: float | None = None
    seed: int | None = None
    startup_timeout_s: float | None = None  # None: by engine
    task_timeout_s: float = 600.0
    log_dir: str | None = None
    echo: bool = False
    show_progress: bool = True


@dataclass
class PlannedTask:
    task_id: str
    num: int  # the events' task number (bench: task_id t{num:05d})
    robot_id: str
    trace: Trace
    tuf_level: str
    event_id: int
    time_s: float  # scheduled, from the start
    ert_s: float
    published_wall: float = math.nan


@dataclass
class ReplayPlan:
    workload: Workload
    events: list[Event]
    tasks: list[PlannedTask]
    robots: dict[str, str]  # robot id -> skill set
    seed: int
    policy: str
    engine: str
    exec_model: Path | None
    durations_table: list[TimingRow] | None = None  # already validated
    durations_source: str | None = None
    bag_output: Path | None = None  # the --record bag


def load_plan(options: ReplayOptions) -> ReplayPlan:
    """The plan of a replay; ReplayError names the event, task or file at fault."""
    try:
        traces = load_traces()
        workload, events = load_workload_events(options.workload, options.seed,
                                                options.duration_s)
    except WorkloadSourceError as err:
        prefix = "--duration-s: " if err.argument == "duration_s" else ""
        raise ReplayError(f"{prefix}{err}") from None
    except TraceError as err:
        raise ReplayError(f"traces: {err}") from None
    if not events:
        raise ReplayError(f"workload {workload.name}: no events"
                          + (f" in the first {options.duration_s:g} s" if options.duration_s
                             else ""))
    levels = load_tuf_levels()
    # A planner that keeps running (attach) rejects a task id it already knows: tag the run.
    prefix = time.strftime("r%H%M%S.") if options.attach else ""
    tasks: list[PlannedTask] = []
    robots: dict[str, str] = {}
    for event in events:
        for j, spec in enumerate(event.tasks):
            where = f"event {event.event_id} (time_s {event.time_s:g}), task {j}"
            trace = traces.get(spec.trace_id)
            if trace is None:  # load_events / compose already check this; keep the message
                raise ReplayError(f"{options.workload}: {where}: trace: unknown trace id "
                                  f"{spec.trace_id}")
            try:
                ert = levels.get(spec.tuf_level).ert_s
            except KeyError as err:
                raise ReplayError(f"{options.workload}: {where}: tuf_level: {err.args[0]}") \
                    from None
            known = robots.setdefault(spec.robot_id, trace.skill_set)
            if known != trace.skill_set:
                raise ReplayError(f"{options.workload}: {where}: robot: {spec.robot_id} runs "
                                  f"{known!r} plans in an earlier event, not {trace.skill_set!r}")
            tasks.append(PlannedTask(f"{prefix}t{spec.task_id:05d}", spec.task_id, spec.robot_id,
                                     trace, spec.tuf_level, event.event_id, float(event.time_s),
                                     ert))
    exec_model = None
    if options.exec_model:
        exec_model = Path(options.exec_model).resolve()
        try:
            ExecutionTimeModel.from_yaml(exec_model)
        except OSError as err:
            raise ReplayError(f"--exec-model: {options.exec_model}: {err.strerror or err}") \
                from None
        except ExecModelConfigError as err:
            raise ReplayError(f"--exec-model: {err}") from None
    plan = ReplayPlan(workload=workload, events=events, tasks=tasks,
                      robots=dict(sorted(robots.items())),
                      seed=workload.seed if options.seed is None else options.seed,
                      policy=options.policy or DEFAULT_POLICY, engine=options.engine or "sim",
                      exec_model=exec_model)
    if options.durations_from:
        plan.durations_table, plan.durations_source = _durations_table(options.durations_from)
    if options.record:
        bag_dir, _ = bag_output_paths(options.record)
        if bag_dir.exists():
            raise ReplayError(f"--record: {bag_dir}: already exists; choose another name or "
                              "remove it")
        plan.bag_output = Path(options.record)
    return plan


def _durations_table(source: str) -> tuple[list[TimingRow], str]:
    """Rows of the timing table to replay (a CSV as it is, or the table built from a bag) and
    how they were found."""
    try:
        table = timing_table.load_table(source)
    except (timing_table.TableError, BagError) as err:
        raise ReplayError(f"--durations-from: {err}") from None
    path = Path(source)
    how = (f"{path} ({len(table.rows)} rows)" if table.build is None
           else f"{path}: {table.build.summary()}")
    if not any(r.success for r in table.rows):
        raise ReplayError(f"--durations-from: {source}: no successful executions to replay")
    return table.rows, how
