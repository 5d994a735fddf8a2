"""`timelyllm lrtrace replay`: replay an event list against the planner over ROS 2.

    timelyllm lrtrace replay events.yaml|workload.yaml|WID1 [--policy P] [--engine sim|vllm]
        [--attach [--no-robots]] [--exec-model model.yaml | --durations-from run.mcap|table.csv]
        [--json FILE] [--record out.mcap] [--time-scale S] [--duration-s S] [--seed N]

Where `timelyllm bench` replays a workload in one process (virtual time, modelled transport),
this replays it with real ROS 2 nodes, in wall-clock time:

1. Start, through `launch_runner.NodeGroup` (one process per node, as `timelyllm launch` does):
   the LRTrace recorder node (`nodes/lrtrace_recorder_node.py`, writing a rosbag2 MCAP bag), the
   planner (`nodes/planner_node.py`; not with `--attach`, which uses the planner already running
   in the current ROS domain) and one simulated executor per robot id of the events
   (`nodes/executor_node.py`, backend `sim` with `exec_model`, or `replay` with `replay_table`
   for `--durations-from`; not with `--no-robots`).
2. Wait until the planner listens for goals and the recorder and executors are subscribed.
3. Publish each event's goals at its `time_s` after the start (wall clock): task id
   `t00000`, ... (in event order, as the bench numbers them; with `--attach` prefixed by a run
   tag, `r153012.t00000`, since a running planner refuses a task id twice), instruction, skill
   set and TUF level of the task's trace (the event's `tuf_level` if it names one), stamped with
   the publish time, so the planner's arrival time (and the response time) includes the goal's
   transport.
4. Wait until every task is terminal (done, failed, rejected, cancelled), stop the recorder (it
   closes the bag), stop the nodes.
5. Compute the bench's metrics from the bag (`bench/metrics.py`): response time, utility and
   waiting time from each task's last recorded TaskStatus; task types as the bench
   (`harness.task_type`). As in the bench, waiting time excludes the time a segment waited
   because its robot was executing another task's segments (computed from the recorded segments
   and reports, `robot_blocked_s`). Print the bench's table and, with `--json`, write the bench's
   JSON document plus a `replay` block (ROS latencies measured in the bag, fallbacks, ...).

The planner started here matches the bench's scheduler configuration: only the skill sets that
the events use (the latency-guided admission sizes itself by the largest `max_segment_tokens`),
the workload's one-way `network_latency_s` (8 ms) and a report timeout of an hour (a segment
queued behind another task's segments on a busy robot is not declared lost). `--time-scale`
scales robot execution only (executor `time_scale`), not the arrival schedule.

Exit status: 0 when every task reached a terminal state; 1 for bad data (a bad event list or
workload, naming the event; a bad bag, table or model), a node that failed, or tasks left
unfinished at `--task-timeout`; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

PROG = "timelyllm lrtrace replay"
DEFAULT_POLICY = "timelyllm"
RECORDER_NODE = "lrtrace_replay_recorder"
CLIENT_NODE = "lrtrace_replay_client"
STARTUP_TIMEOUT_S = {"sim": 180.0, "vllm": 900.0}
# The bench's report timeout (harness.BenchConfig.report_timeout_min_s), for the same reason.
REPORT_TIMEOUT_MIN_S = 3600.0
# After the publisher side of the graph is complete, let DDS finish matching before goal 0.
SETTLE_S = 1.0
# After the last terminal status: let the recorder take it before it is stopped.
RECORDER_GRACE_S = 1.5
TERMINAL = ("done", "failed", "rejected", "cancelled")
# RTPS port mapping (7400 + 250 * domain + offsets) overflows 65535 beyond this domain.
MAX_DOMAIN_ID = 232


class ReplayError(Exception):
    """Bad data or a failed run: exit status 1 (bad arguments use _Usage, status 2)."""


class _Usage(Exception):
    """Bad arguments: exit status 2."""


# ------------------------------------------------------------------------------------ arguments

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", help="event list YAML (with `events:`, see `lrtrace compose`), "
                   "workload YAML, or preset name (WID1, WID2, WID3)")
    p.add_argument("--policy", default=None,
                   help=f"planner scheduling policy (default {DEFAULT_POLICY}; not with --attach)")
    p.add_argument("--engine", choices=("sim", "vllm"), default=None,
                   help="planner engine: sim = the calibrated cost-model engine paced to the wall "
                        "clock, generating each trace's plan (default); vllm = the real engine")
    p.add_argument("--model", default=None,
                   help="--engine vllm: local model directory (default: the bundled model)")
    p.add_argument("--profile", default=None,
                   help="--engine sim: engine profile YAML (default: the planner's, "
                        "Llama3-8B on an RTX 4090)")
    p.add_argument("--attach", action="store_true",
                   help="use the planner already running in this ROS domain instead of starting one")
    p.add_argument("--no-robots", action="store_true",
                   help="with --attach: start no executors (the robots are already running)")
    p.add_argument("--exec-model", default=None, metavar="model.yaml",
                   help="execution-time model for the simulated robots and the planner (e.g. one "
                        "written by `lrtrace fit`; default config/exec_model.yaml); with "
                        "--durations-from, the fallback for segments never recorded")
    p.add_argument("--durations-from", default=None, metavar="run.mcap|table.csv",
                   help="robots replay the exact durations recorded in this bag or timing table "
                        "(executor backend `replay`)")
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE",
                   help="write the metrics as JSON (the schema of `timelyllm bench --json`, plus "
                        "a `replay` block)")
    p.add_argument("--record", default=None, metavar="out.mcap",
                   help="keep the recorded bag (out.mcap -> directory out/); by default it is "
                        "recorded to a temporary directory and removed after the metrics")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="S",
                   help="scale robot execution times by S (executor time_scale; default 1); "
                        "the arrival schedule is not scaled")
    p.add_argument("--duration-s", type=float, default=None, metavar="S",
                   help="replay only the events of the first S seconds")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of event composition (workloads) and of the simulated robots "
                        "(default: the workload's)")
    p.add_argument("--startup-timeout", type=float, default=None, metavar="S",
                   help="how long to wait for the nodes (default 180 s; 900 s with --engine vllm)")
    p.add_argument("--task-timeout", type=float, default=600.0, metavar="S",
                   help="after the last goal, how long to wait for every task to end (default 600)")
    p.add_argument("--log-dir", default=None, metavar="DIR",
                   help="keep every node's output here (default: a temporary directory, kept "
                        "only if the replay fails)")
    p.add_argument("--echo", action="store_true", help="echo the nodes' output on stderr")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")


def _check_args(args: argparse.Namespace) -> None:
    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise _Usage(f"--time-scale: must be > 0, got {args.time_scale}")
    if args.duration_s is not None and not (math.isfinite(args.duration_s) and args.duration_s > 0):
        raise _Usage(f"--duration-s: must be > 0, got {args.duration_s}")
    if args.seed is not None and args.seed < 0:
        raise _Usage(f"--seed: must be >= 0, got {args.seed}")
    if not args.task_timeout > 0:
        raise _Usage(f"--task-timeout: must be > 0, got {args.task_timeout}")
    if args.startup_timeout is not None and not args.startup_timeout > 0:
        raise _Usage(f"--startup-timeout: must be > 0, got {args.startup_timeout}")
    if args.no_robots and not args.attach:
        raise _Usage("--no-robots: only with --attach (without it the replay starts the robots)")
    if args.attach:
        ignored = [f"--{n}" for n in ("policy", "engine", "model", "profile")
                   if getattr(args, n) is not None]
        if ignored:
            _warn(f"{', '.join(ignored)} ignored with --attach (the running planner's settings "
                  "apply)")
        if args.no_robots and (args.durations_from or args.exec_model):
            _warn("--exec-model / --durations-from only configure robots this replay starts; "
                  "with --no-robots they apply to nothing")
        return
    if args.policy is not None:
        from timelyllm_ros.bench.cli import UsageError, _check_policies

        try:
            names = _check_policies(args.policy)
        except UsageError as err:
            raise _Usage(str(err).replace("--policies", "--policy")) from None
        if len(names) != 1:
            raise _Usage("--policy: one policy per replay (run the replay again for another)")
    if args.model is not None and (args.engine or "sim") != "vllm":
        raise _Usage("--model: only with --engine vllm")
    if args.profile is not None and (args.engine or "sim") != "sim":
        raise _Usage("--profile: only with --engine sim")


def _warn(text: str) -> None:
    print(f"{PROG}: warning: {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ the plan

@dataclass
class _Task:
    task_id: str
    num: int  # the events' task number (bench: task_id t{num:05d})
    robot_id: str
    trace: Any  # lrtrace.traces.Trace
    tuf_level: str
    event_id: int
    time_s: float  # scheduled, from the start
    ert_s: float
    published_wall: float = math.nan


@dataclass
class _Setup:
    workload: Any
    events: list
    tasks: list[_Task]
    robots: dict[str, str]  # robot id -> skill set
    seed: int
    policy: str
    engine: str
    exec_model: Path | None
    durations_table: Any = None  # list of TimingRow (already validated)
    durations_source: str | None = None
    bag_output: Path | None = None  # the --record bag


def _load(args: argparse.Namespace) -> _Setup:
    from timelyllm_ros.bench.cli import UsageError, load_events_for
    from timelyllm_ros.core.exec_model import ExecModelConfigError, ExecutionTimeModel
    from timelyllm_ros.core.tuf import load_tuf_levels
    from timelyllm_ros.lrtrace.traces import TraceError, load_traces

    try:
        traces = load_traces()
        workload, events = load_events_for(args.workload, args.seed, args.duration_s)
    except UsageError as err:
        raise ReplayError(str(err)) from None
    except TraceError as err:
        raise ReplayError(f"traces: {err}") from None
    if not events:
        raise ReplayError(f"workload {workload.name}: no events"
                          + (f" in the first {args.duration_s:g} s" if args.duration_s else ""))
    levels = load_tuf_levels()
    # A planner that keeps running (--attach) rejects a task id it already knows: tag the run.
    prefix = time.strftime("r%H%M%S.") if args.attach else ""
    tasks: list[_Task] = []
    robots: dict[str, str] = {}
    for event in events:
        for j, spec in enumerate(event.tasks):
            where = f"event {event.event_id} (time_s {event.time_s:g}), task {j}"
            trace = traces.get(spec.trace_id)
            if trace is None:  # load_events / compose already check this; keep the message
                raise ReplayError(f"{args.workload}: {where}: trace: unknown trace id {spec.trace_id}")
            try:
                ert = levels.get(spec.tuf_level).ert_s
            except KeyError as err:
                raise ReplayError(f"{args.workload}: {where}: tuf_level: {err.args[0]}") from None
            known = robots.setdefault(spec.robot_id, trace.skill_set)
            if known != trace.skill_set:
                raise ReplayError(f"{args.workload}: {where}: robot: {spec.robot_id} runs "
                                  f"{known!r} plans in an earlier event, not {trace.skill_set!r}")
            tasks.append(_Task(f"{prefix}t{spec.task_id:05d}", spec.task_id, spec.robot_id, trace,
                               spec.tuf_level, event.event_id, float(event.time_s), ert))
    exec_model = None
    if args.exec_model:
        exec_model = Path(args.exec_model).resolve()
        try:
            ExecutionTimeModel.from_yaml(exec_model)
        except OSError as err:
            raise ReplayError(f"--exec-model: {args.exec_model}: {err.strerror or err}") from None
        except ExecModelConfigError as err:
            raise ReplayError(f"--exec-model: {err}") from None
    setup = _Setup(workload=workload, events=events, tasks=tasks, robots=dict(sorted(robots.items())),
                   seed=workload.seed if args.seed is None else args.seed,
                   policy=args.policy or DEFAULT_POLICY, engine=args.engine or "sim",
                   exec_model=exec_model)
    if args.durations_from:
        setup.durations_table, setup.durations_source = _durations_table(args.durations_from)
    if args.record:
        from timelyllm_ros.lrtrace.bag import bag_output_paths

        bag_dir, _ = bag_output_paths(args.record)
        if bag_dir.exists():
            raise ReplayError(f"--record: {bag_dir}: already exists; choose another name or remove it")
        setup.bag_output = Path(args.record)
    return setup


def _durations_table(source: str):
    """Rows of the timing table to replay: a CSV as it is, or the table built from a bag."""
    from timelyllm_ros.lrtrace import timing_table
    from timelyllm_ros.lrtrace.bag import BagError

    path = Path(source)
    try:
        if path.suffix.lower() == ".csv":
            rows = timing_table.read_csv(path)
            how = f"{path} ({len(rows)} rows)"
        else:
            build, _ = timing_table.table_from_bag(path)
            rows = build.rows
            how = f"{path}: {build.summary()}"
    except (timing_table.TableError, BagError) as err:
        raise ReplayError(f"--durations-from: {err}") from None
    if not any(r.success for r in rows):
        raise ReplayError(f"--durations-from: {source}: no successful executions to replay")
    return rows, how


# ------------------------------------------------------------------------------------ nodes

def _config_dir(work: Path, setup: _Setup) -> Path:
    """A planner config dir with only the skill sets the events use (as the bench does)."""
    from timelyllm_ros.core.tuf import default_config_dir

    src = default_config_dir()
    out = work / "config"
    (out / "skillsets").mkdir(parents=True)
    shutil.copy(src / "tuf_levels.yaml", out / "tuf_levels.yaml")
    shutil.copy(setup.exec_model or src / "exec_model.yaml", out / "exec_model.yaml")
    for name in sorted(set(setup.robots.values())):
        shutil.copy(src / "skillsets" / f"{name}.yaml", out / "skillsets" / f"{name}.yaml")
    return out


def _node_specs(args: argparse.Namespace, setup: _Setup, work: Path, bag_path: Path,
                table_csv: Path | None):
    from timelyllm_ros.launch_description import NodeSpec
    from timelyllm_ros.ros_env import REPO_ROOT

    recorder = NodeSpec(
        name=RECORDER_NODE, module="timelyllm_ros.nodes.lrtrace_recorder_node",
        executable="lrtrace_recorder_node",
        parameters={"output": str(bag_path), "robots": ",".join(setup.robots),
                    "write_table": True})
    nodes = []
    if not args.attach:
        params: dict[str, Any] = {
            "policy": setup.policy, "engine.kind": setup.engine,
            "robots": [f"{r}:{s}" for r, s in setup.robots.items()],
            "config_dir": str(_config_dir(work, setup)),
            "network_latency_s": float(setup.workload.network_latency_s),
            "report_timeout_min_s": REPORT_TIMEOUT_MIN_S,
        }
        if args.model:
            params["model"] = str(Path(args.model).resolve())
        if args.profile:
            params["engine.sim_profile"] = str(Path(args.profile).resolve())
        nodes.append(NodeSpec(name="planner", module="timelyllm_ros.nodes.planner_node",
                              executable="planner_node",
                              parameters_file=REPO_ROOT / "config" / "planner.yaml",
                              parameters=params))
    if not args.no_robots:
        for i, (robot, _skill_set) in enumerate(setup.robots.items()):
            params = {"robot_id": robot, "time_scale": float(args.time_scale),
                      "seed": int(setup.seed) * 1000 + i}
            if setup.exec_model is not None:
                params["exec_model"] = str(setup.exec_model)
            if table_csv is not None:
                params.update(backend="replay", replay_table=str(table_csv))
            nodes.append(NodeSpec(name="executor", namespace=robot,
                                  module="timelyllm_ros.nodes.executor_node",
                                  executable="drone_executor_node", parameters=params))
    return recorder, nodes


def _endpoints(node, topic: str, kind: str) -> set[tuple[str, str]]:
    infos = (node.get_subscriptions_info_by_topic(topic) if kind == "sub"
             else node.get_publishers_info_by_topic(topic))
    return {(i.node_namespace.rstrip("/") or "/", i.node_name) for i in infos}


def _missing_endpoints(client, setup: _Setup, args: argparse.Namespace) -> list[str]:
    from timelyllm_ros.nodes import topics

    node = client.node
    rec = ("/", RECORDER_NODE)
    missing = []
    goal_subs = _endpoints(node, topics.TASK_GOALS, "sub")
    if rec not in goal_subs:
        missing.append(f"recorder on {topics.TASK_GOALS}")
    if rec not in _endpoints(node, topics.TASK_STATUS, "sub"):
        missing.append(f"recorder on {topics.TASK_STATUS}")
    planner_listening = bool(goal_subs - {rec}) if args.attach else ("/", "planner") in goal_subs
    if not planner_listening:
        missing.append(f"planner on {topics.TASK_GOALS} (loading its engine?)")
    for robot in setup.robots:
        seg = topics.robot_topic(robot, topics.SKILL_SEGMENTS)
        rep = topics.robot_topic(robot, topics.EXECUTION_REPORTS)
        seg_subs, rep_subs = _endpoints(node, seg, "sub"), _endpoints(node, rep, "sub")
        if rec not in seg_subs or rec not in rep_subs:
            missing.append(f"recorder on /{robot}/*")
        if not args.no_robots and (f"/{robot}", "executor") not in seg_subs:
            missing.append(f"executor of {robot}")
        if not args.attach and ("/", "planner") not in rep_subs:
            missing.append(f"planner on {rep}")
    return missing


def _log_tail(log_dir: Path, label: str, chars: int = 1500) -> str:
    path = log_dir / f"{label.replace('/', '__')}.log"
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


# ------------------------------------------------------------------------------------ run

def run(args: argparse.Namespace) -> int:
    try:
        _check_args(args)
        setup = _load(args)
    except _Usage as err:
        print(f"{PROG}: error: {err}", file=sys.stderr, flush=True)
        return 2
    except ReplayError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr, flush=True)
        return 1
    try:
        import rclpy  # noqa: F401

        import timelyllm_ros.msg  # noqa: F401
    except ImportError as err:
        print(f"{PROG}: error: ROS 2 or the timelyllm_ros message types are not available ({err}); "
              "run scripts/bootstrap.sh, or on a ROS install source the workspace",
              file=sys.stderr, flush=True)
        return 1
    work = Path(tempfile.mkdtemp(prefix="timelyllm-replay-"))
    keep_work = False
    old_term = _term_as_interrupt()
    try:
        try:
            code = _replay(args, setup, work)
        except ReplayError as err:
            keep_work = True
            print(f"{PROG}: error: {err}", file=sys.stderr, flush=True)
            return 1
        keep_work = code != 0
        return code
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        if keep_work and not args.log_dir and any((work / "logs").glob("*.log")):
            print(f"{PROG}: node logs kept in {work / 'logs'}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _term_as_interrupt():
    """SIGTERM ends the replay like Ctrl-C: the nodes it started are stopped, not orphaned."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_term(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, on_term)


def _replay(args: argparse.Namespace, setup: _Setup, work: Path) -> int:
    from timelyllm_ros.bench.cli import TextProgress
    from timelyllm_ros.demo import isolate_ros_network
    from timelyllm_ros.launch_runner import NodeGroup
    from timelyllm_ros.lrtrace import timing_table

    if not args.attach:
        isolate_ros_network()  # a private domain on loopback unless ROS_DOMAIN_ID is set
    domain = os.environ.get("ROS_DOMAIN_ID", "0") or "0"
    if not domain.isdigit() or int(domain) > MAX_DOMAIN_ID:
        # DDS maps the domain to UDP ports; beyond 232 the ports overflow and every node exits.
        raise ReplayError(f"ROS_DOMAIN_ID={domain}: must be an integer 0-{MAX_DOMAIN_ID}")
    bag_path = setup.bag_output if setup.bag_output is not None else work / "replay.mcap"
    table_csv = None
    if setup.durations_table is not None:
        table_csv = timing_table.write_csv(setup.durations_table, work / "durations.csv")
    log_dir = Path(args.log_dir) if args.log_dir else work / "logs"
    recorder_spec, node_specs = _node_specs(args, setup, work, bag_path, table_csv)
    n_tasks = len(setup.tasks)
    planner = "attached planner" if args.attach else f"policy {setup.policy}, engine {setup.engine}"
    if args.no_robots:
        robots = "robots: none started"
    else:
        robots = f"robots: {'replay ' + str(setup.durations_source) if table_csv else 'sim'}, " \
                 f"time scale {args.time_scale:g}"
    print(f"replay {setup.workload.name}: {len(setup.events)} events, {n_tasks} tasks over "
          f"{max(t.time_s for t in setup.tasks):.1f} s on {len(setup.robots)} robots; {planner}; "
          f"{robots}; ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', '0')}",
          file=sys.stderr, flush=True)

    from timelyllm_ros.client import PlannerClient

    recorder = NodeGroup([recorder_spec], log_dir=log_dir, echo=args.echo)
    nodes = NodeGroup(node_specs, log_dir=log_dir, echo=args.echo)
    client = None
    own_rclpy = False
    recorder_stopped = False
    wall_start = time.perf_counter()
    try:
        recorder.start()
        nodes.start()
        import rclpy
        from rclpy.signals import SignalHandlerOptions

        if not rclpy.ok():
            # Without rclpy's signal handlers Ctrl-C / SIGTERM reach this loop, which stops the
            # nodes in order, instead of shutting the client's context under its spin thread.
            rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
            own_rclpy = True
        client = PlannerClient(node_name=CLIENT_NODE)

        def dead() -> str | None:
            for group in (recorder, nodes):
                for label, code in group.exited().items():
                    return f"node {label} exited with status {code}:\n{_log_tail(log_dir, label)}"
            return None

        # --- start-up
        timeout = args.startup_timeout or STARTUP_TIMEOUT_S[setup.engine if not args.attach else "sim"]
        deadline = time.monotonic() + timeout
        while True:
            why = dead()
            if why:
                raise ReplayError(why)
            missing = _missing_endpoints(client, setup, args)
            if not missing:
                break
            if time.monotonic() > deadline:
                raise ReplayError(f"nodes not ready after {timeout:g} s; still waiting for "
                                  f"{', '.join(missing[:6])}" + (" ..." if len(missing) > 6 else "")
                                  + f" (node logs: {log_dir})")
            time.sleep(0.5)
        startup_s = time.perf_counter() - wall_start
        time.sleep(SETTLE_S)
        print(f"nodes ready after {startup_s:.1f} s; publishing goals", file=sys.stderr, flush=True)

        # --- the schedule
        progress = TextProgress(f"replay {setup.policy if not args.attach else 'attached'}",
                                enabled=not args.no_progress)
        t0_mono, t0_wall = time.monotonic(), time.time()
        pending = sorted(setup.tasks, key=lambda t: (t.time_s, t.num))
        ids = [t.task_id for t in setup.tasks]

        def terminal_count() -> int:
            return sum(1 for t in ids if (s := client.last_status(t)) is not None
                       and s.state in TERMINAL)

        i = 0
        done = 0
        while i < len(pending):
            due = t0_mono + pending[i].time_s
            now = time.monotonic()
            if now < due:
                time.sleep(min(0.05, due - now))
                why = dead()
                if why:
                    raise ReplayError(why)
                continue
            while i < len(pending) and pending[i].time_s <= time.monotonic() - t0_mono:
                _publish(client, pending[i])
                i += 1
            if terminal_count() != done:
                done = terminal_count()
                progress(done, n_tasks, time.monotonic() - t0_mono)
        last_goal = time.monotonic()

        # --- wait for every task to end
        while True:
            done = terminal_count()
            progress(done, n_tasks, time.monotonic() - t0_mono)
            if done >= n_tasks:
                break
            why = dead()
            if why:
                raise ReplayError(why)
            if time.monotonic() > last_goal + args.task_timeout:
                break
            time.sleep(0.1)
        unfinished = [t for t in ids if (s := client.last_status(t)) is None or s.state not in TERMINAL]
        if unfinished:
            _warn(f"{len(unfinished)} task(s) not finished {args.task_timeout:g} s after the last "
                  f"goal (e.g. {', '.join(unfinished[:5])}); reporting what was recorded")
        metrics = list(client.seen.metrics)
        client_status = {t: client.last_status(t) for t in ids}

        # --- stop the recorder (it closes the bag), then the nodes
        time.sleep(RECORDER_GRACE_S)
        codes = recorder.stop(timeout_s=60)
        recorder_stopped = True
        if codes.get(recorder_spec.label) not in (0,):
            raise ReplayError(f"the recorder exited with status {codes.get(recorder_spec.label)}:\n"
                              f"{_log_tail(log_dir, recorder_spec.label)}")
    finally:
        if not recorder_stopped:
            recorder.stop(timeout_s=30)
        nodes.stop(timeout_s=30)
        if client is not None:
            client.close()
        if own_rclpy:
            rclpy.try_shutdown()
    wall_s = time.perf_counter() - wall_start

    doc, summary = _results(args, setup, bag_path, t0_wall, metrics, client_status,
                            startup_s=startup_s, wall_s=wall_s)
    from timelyllm_ros.bench.metrics import format_table, json_safe

    print(format_table(doc))
    for line in summary:
        print(line)
    if args.json_path:
        path = Path(args.json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(json_safe(doc), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
    if setup.bag_output is not None:
        print(f"recorded {doc['replay']['bag']}", file=sys.stderr)
    return 1 if unfinished else 0


def _publish(client, task: _Task) -> None:
    from timelyllm_ros.msg import TaskGoal
    from timelyllm_ros.nodes.conversions import s_to_time

    now = time.time()
    task.published_wall = now
    client.publish_goal(TaskGoal(
        task_id=task.task_id, robot_id=task.robot_id, skill_set=task.trace.skill_set,
        instruction=task.trace.instruction, urgency=task.tuf_level, stamp=s_to_time(now)))


# ------------------------------------------------------------------------------------ results

def _stats_ms(values: list[float]) -> dict[str, Any]:
    arr = np.asarray([v for v in values if math.isfinite(v)], dtype=float) * 1e3
    if not arr.size:
        return {"n": 0, "median_ms": None, "p99_ms": None, "max_ms": None}
    return {"n": int(arr.size), "median_ms": float(np.median(arr)),
            "p99_ms": float(np.percentile(arr, 99)), "max_ms": float(arr.max())}


def robot_blocked_s(segments: dict[str, dict[int, dict]], reports: dict[str, dict[int, dict]],
                    robot_of: Callable[[str], str]) -> dict[str, float]:
    """Per task: time its segments were ready but their robot was executing another task's
    segment (the bench's `robot_blocked_s`, measured instead of modelled).

    A segment is ready when it was published (its stamp) and the task's previous segment has
    finished; the blocked part is the overlap of [ready, started] with the other tasks'
    executions on the same robot (one executor runs one segment at a time)."""
    from timelyllm_ros.lrtrace.bag import stamp_s

    busy: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for task_id, reps in reports.items():
        for rep in reps.values():
            busy[robot_of(task_id)].append((stamp_s(rep["started"]), stamp_s(rep["finished"]),
                                            task_id))
    out: dict[str, float] = {}
    for task_id, reps in reports.items():
        blocked = 0.0
        prev_finish = -math.inf
        others = [(a, b) for a, b, t in busy[robot_of(task_id)] if t != task_id]
        for seq in sorted(reps):
            rep = reps[seq]
            started, finished = stamp_s(rep["started"]), stamp_s(rep["finished"])
            seg = segments.get(task_id, {}).get(seq)
            published = stamp_s(seg["stamp"]) if seg is not None else started
            ready = max(published, prev_finish)
            if started > ready:
                blocked += sum(max(0.0, min(b, started) - max(a, ready)) for a, b in others)
            prev_finish = max(prev_finish, finished)
        out[task_id] = blocked
    return out


def _results(args, setup: _Setup, bag_path: Path, t0_wall: float, metrics: list,
             client_status: dict, *, startup_s: float, wall_s: float):
    from timelyllm_ros.bench.cli import _workload_block
    from timelyllm_ros.bench.harness import (BenchConfig, RunResult, SegmentResult, TaskResult,
                                             task_type)
    from timelyllm_ros.bench.metrics import results_json
    from timelyllm_ros.lrtrace import bag as bagmod
    from timelyllm_ros.robots.replay import FALLBACK_PREFIX, REPLAYED_PREFIX

    try:
        contents = bagmod.read_messages(bag_path)
    except bagmod.BagError as err:
        raise ReplayError(f"reading the recorded bag: {err}") from None
    ours = {t.task_id: t for t in setup.tasks}
    statuses: dict[str, dict] = {}
    goals: dict[str, dict] = {}
    segments: dict[str, dict[int, dict]] = defaultdict(dict)
    reports: dict[str, dict[int, dict]] = defaultdict(dict)
    latency: dict[str, list[float]] = defaultdict(list)
    for m in contents.messages:
        d = bagmod.to_dict(m.msg)
        log_s = m.timestamp_ns * 1e-9
        if m.msgtype == bagmod.STATUS_TYPE:
            if d["task_id"] in ours:
                statuses[d["task_id"]] = d  # bag order = arrival order: the last one wins
            latency["status"].append(log_s - bagmod.stamp_s(d["stamp"]))
        elif m.msgtype == bagmod.GOAL_TYPE:
            goals.setdefault(d["task_id"], d)
            latency["goal"].append(log_s - bagmod.stamp_s(d["stamp"]))
        elif m.msgtype == bagmod.SEGMENT_TYPE:
            segments[d["task_id"]].setdefault(int(d["sequence"]), d)
            latency["segment"].append(log_s - bagmod.stamp_s(d["stamp"]))
        elif m.msgtype == bagmod.REPORT_TYPE:
            reports[d["task_id"]].setdefault(int(d["sequence"]), d)
            latency["report"].append(log_s - bagmod.stamp_s(d["finished"]))

    from_client = 0
    for task_id, msg in client_status.items():
        last = statuses.get(task_id)
        if msg is not None and msg.state in TERMINAL and (last is None or last["state"] not in TERMINAL):
            # The client saw the end, the recorder did not keep it: say so, use the client's.
            statuses[task_id] = {"state": msg.state, "reason": msg.reason,
                                 "response_time_s": msg.response_time_s, "utility": msg.utility,
                                 "waiting_time_s": msg.waiting_time_s, "resumes": msg.resumes}
            from_client += 1
    robot_of = lambda tid: ours[tid].robot_id if tid in ours else "?"  # noqa: E731
    blocked = robot_blocked_s(segments, reports, robot_of)

    tasks = []
    for t in setup.tasks:
        st = statuses.get(t.task_id)
        state = st["state"] if st else "no status"
        done = state == "done"
        reps = reports.get(t.task_id, {})
        execution = sum(bagmod.stamp_s(r["finished"]) - bagmod.stamp_s(r["started"])
                        for r in reps.values()) if reps else math.nan
        completion = (max(bagmod.stamp_s(r["finished"]) for r in reps.values()) - t0_wall) \
            if (reps and done) else math.nan
        sched_wait = float(st["waiting_time_s"]) if (st and done) else math.nan
        segs = []
        for seq, seg in sorted(segments.get(t.task_id, {}).items()):
            rep = reps.get(seq)
            segs.append(SegmentResult(
                seq, seg["text"], bool(seg["is_last"]), bagmod.stamp_s(seg["stamp"]) - t0_wall,
                bagmod.stamp_s(rep["started"]) - t0_wall if rep else math.nan,
                bagmod.stamp_s(rep["finished"]) - t0_wall if rep else math.nan))
        b = blocked.get(t.task_id, 0.0)
        tasks.append(TaskResult(
            task_id=t.task_id, trace_id=t.trace.trace_id, category=t.trace.category,
            tuf_level=t.tuf_level, task_type=task_type(t.trace.category, t.tuf_level),
            robot_id=t.robot_id, arrival_s=t.published_wall - t0_wall, ert_s=t.ert_s,
            state=state, reason=(st or {}).get("reason", "") or "",
            response_time_s=float(st["response_time_s"]) if st else math.nan,
            utility=float(st["utility"]) if st else math.nan,
            waiting_time_s=sched_wait - b if done else math.nan,
            sched_waiting_time_s=sched_wait, robot_blocked_s=b, execution_s=execution,
            completion_s=completion, resumes=int((st or {}).get("resumes", 0) or 0),
            event_id=t.event_id, segments=segs))

    policy = setup.policy
    engine = setup.engine
    if args.attach:
        policy = next((m.policy for m in reversed(metrics) if m.policy), "attached")
        engine = "vllm" if any(m.engine and not m.engine.startswith("sim") for m in metrics) else "sim"
    overhead = [m.fetch_overhead_ms * 1e-3 for m in metrics if m.fetch_overhead_ms > 0]
    ends = [bagmod.stamp_s(s["stamp"]) - t0_wall for s in statuses.values()
            if s.get("state") in TERMINAL and "stamp" in s]
    config = BenchConfig(engine=engine, profile=args.profile if not args.attach else None,
                         model=args.model, seed=setup.seed, prompt_tokens=None,
                         report_timeout_min_s=REPORT_TIMEOUT_MIN_S)
    run = RunResult(policy=policy, tasks=tasks, fetch_overhead_s=overhead, steps=0,
                    clock_s=max(ends, default=math.nan), wall_s=wall_s,
                    config={"policy_batch_cap": None})
    block = _workload_block(setup.workload, setup.events, config, {policy: run}, setup.seed)
    bench = block["bench"]
    bench.update(robots="ros-executors", transport="ros2")
    if args.attach:
        for key in ("batch_cap", "segmented_batch_cap", "report_timeout_min_s", "profile", "model",
                    "prompt_tokens", "resume_lead_s", "gen_time_s", "baseline_prefix_cache"):
            bench[key] = "planner's own"
    block["wall_clock_s"] = block.pop("virtual_clock_s")
    doc = results_json({policy: run}, block)

    messages = [r.get("message", "") for reps in reports.values() for r in reps.values()]
    fallbacks = sum(1 for msg in messages if msg.startswith(FALLBACK_PREFIX))
    replayed = sum(1 for msg in messages if msg.startswith(REPLAYED_PREFIX))
    states = Counter(t.state for t in tasks)
    doc["replay"] = {
        "transport": "ros2",
        "ros_domain_id": os.environ.get("ROS_DOMAIN_ID", "0"),
        "rmw_implementation": os.environ.get("RMW_IMPLEMENTATION", ""),
        "attach": bool(args.attach),
        "bag": str(contents.path) if setup.bag_output is not None else None,
        "bag_messages": {topic: n for topic, (_, n) in sorted(contents.topics.items())},
        "goals_recorded": sum(1 for g in goals if g in ours),
        "states": dict(states),
        "statuses_from_client": from_client,
        "robots": {"count": len(setup.robots), "started": not args.no_robots,
                   "backend": "replay" if setup.durations_table is not None else "sim",
                   "time_scale": args.time_scale,
                   "exec_model": str(setup.exec_model) if setup.exec_model else "config/exec_model.yaml",
                   "durations_from": setup.durations_source,
                   "replayed_segments": replayed, "fallback_segments": fallbacks},
        "robot_blocked_s_total": float(sum(t.robot_blocked_s for t in tasks)),
        "tasks_robot_blocked": sum(1 for t in tasks if t.robot_blocked_s > 0),
        "planner_network_latency_s": None if args.attach else float(setup.workload.network_latency_s),
        # publish (message stamp) -> recorder callback, one clock: ROS transport + recorder delay
        "ros_latency_ms": {k: _stats_ms(v) for k, v in sorted(latency.items())},
        "startup_s": startup_s,
        "wall_s": wall_s,
    }

    summary = [f"replay over ROS 2 (domain {doc['replay']['ros_domain_id']}): {len(tasks)} tasks: "
               + ", ".join(f"{n} {s}" for s, n in states.most_common())
               + f"; {doc['replay']['goals_recorded']} goals and "
               + f"{sum(doc['replay']['bag_messages'].values())} messages recorded"]
    lat = doc["replay"]["ros_latency_ms"]
    parts = [f"{k} {v['median_ms']:.1f}/{v['p99_ms']:.1f}" for k, v in lat.items() if v["n"]]
    if parts:
        summary.append("ROS one-way latency, publish -> recorder, median/p99 ms: " + ", ".join(parts))
    if doc["replay"]["tasks_robot_blocked"]:
        summary.append(f"robots busy with other tasks: {doc['replay']['tasks_robot_blocked']} "
                       f"tasks waited {doc['replay']['robot_blocked_s_total']:.2f} s in all "
                       "(not counted as waiting time, as in the bench)")
    if setup.durations_table is not None:
        summary.append(f"durations: {replayed} segments replayed, {fallbacks} drawn from the "
                       "execution-time model (never recorded)")
    if fallbacks:
        _warn(f"{fallbacks} segment(s) were never recorded in {setup.durations_source}; their "
              "durations came from the execution-time model")
    if from_client:
        _warn(f"{from_client} terminal status(es) missing from the bag; taken from the client")
    bad = [t for t in tasks if t.state != "done"]
    if bad:
        _warn(f"{len(bad)} task(s) did not finish: "
              + "; ".join(f"{t.task_id} {t.state}" + (f" ({t.reason})" if t.reason else "")
                          for t in bad[:3]))
    return doc, summary
