"""LRTrace replay over ROS 2 (`timelyllm lrtrace replay`): an event list against the planner.

Where `timelyllm bench` replays a workload in one process (virtual time, modelled transport),
this replays it with real ROS 2 nodes, in wall-clock time:

1. Load the plan (experiments/replay_plan.py): the events as the bench loads them
   (`bench.workloads.load_workload_events`), each task with its trace and TUF level.
2. Start, through `launch_runner.NodeGroup` (one process per node, as `timelyllm launch` does;
   experiments/replay_nodes.py): the LRTrace recorder node (`ros/lrtrace_recorder_node.py`,
   writing a rosbag2 MCAP bag), the planner (`ros/planner_node.py`; not with `attach`, which
   uses the planner already running in the current ROS domain) and one simulated executor per
   robot id of the events (`ros/executor_node.py`, backend `sim` with `exec_model`, or `replay`
   with `replay_table` for `durations_from`; not with `no_robots`).
3. Wait until the planner listens for goals and the recorder and executors are subscribed.
4. Publish each event's goals at its `time_s` after the start (wall clock): task id
   `t00000`, ... (in event order, as the bench numbers them; with `attach` prefixed by a run
   tag, `r153012.t00000`, since a running planner refuses a task id twice), instruction, skill
   set and TUF level of the task's trace (the event's `tuf_level` if it names one), stamped with
   the publish time, so the planner's arrival time (and the response time) includes the goal's
   transport.
5. Wait until every task is terminal (done, failed, rejected, cancelled), stop the recorder (it
   closes the bag), stop the nodes.
6. Compute the bench's metrics from the bag (experiments/replay_report.py, `bench/metrics.py`):
   response time, utility and waiting time from each task's last recorded TaskStatus; task types
   as the bench (`bench.results.task_type`). As in the bench, waiting time excludes the time a
   segment waited because its robot was executing another task's segments (computed from the
   recorded segments and reports, `robot_blocked_s`). Print the bench's table and, with
   `json_path`, write the bench's JSON document plus a `replay` block (ROS latencies measured in
   the bag, fallbacks, ...).

The planner started here matches the bench's scheduler configuration: only the skill sets that
the events use (the latency-guided admission sizes itself by the largest `max_segment_tokens`),
the workload's one-way `network_latency_s` (8 ms) and a report timeout of an hour (a segment
queued behind another task's segments on a busy robot is not declared lost). `time_scale`
scales robot execution only (executor `time_scale`), not the arrival schedule.

Exit status of `run_replay`: 0 when every task reached a terminal state; 1 for bad data (a bad
event list or workload, naming the event; a bad bag, table or model), a node that failed, or
tasks left unfinished at the task timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from timelyllm_ros.bench.metrics import format_table, json_safe
from timelyllm_ros.bench.progress import ReplayProgress
from timelyllm_ros.experiments.demo import isolate_ros_network
from timelyllm_ros.experiments.replay_nodes import log_tail, missing_endpoints, node_specs
from timelyllm_ros.experiments.replay_plan import (PROG, PlannedTask, ReplayError, ReplayOptions,
                                                   ReplayPlan, load_plan, warn)
from timelyllm_ros.experiments.replay_report import TERMINAL, replay_report
from timelyllm_ros.lrtrace import timing_table

CLIENT_NODE = "lrtrace_replay_client"
STARTUP_TIMEOUT_S = {"sim": 180.0, "vllm": 900.0}
# After the publisher side of the graph is complete, let DDS finish matching before goal 0.
SETTLE_S = 1.0
# After the last terminal status: let the recorder take it before it is stopped.
RECORDER_GRACE_S = 1.5
# RTPS port mapping (7400 + 250 * domain + offsets) overflows 65535 beyond this domain.
MAX_DOMAIN_ID = 232

# Why a started node is gone (None: all alive).
DeadCheck = Callable[[], "str | None"]


def run_replay(options: ReplayOptions) -> int:
    """Run one replay and print its report; returns the exit status."""
    try:
        plan = load_plan(options)
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
            code = _replay(options, plan, work)
        except ReplayError as err:
            keep_work = True
            print(f"{PROG}: error: {err}", file=sys.stderr, flush=True)
            return 1
        keep_work = code != 0
        return code
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        if keep_work and not options.log_dir and any((work / "logs").glob("*.log")):
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


def _replay(options: ReplayOptions, plan: ReplayPlan, work: Path) -> int:
    from timelyllm_ros.ros.client import PlannerClient
    from timelyllm_ros.ros.launch_runner import NodeGroup

    if not options.attach:
        isolate_ros_network()  # a private domain on loopback unless ROS_DOMAIN_ID is set
    domain = os.environ.get("ROS_DOMAIN_ID", "0") or "0"
    if not domain.isdigit() or int(domain) > MAX_DOMAIN_ID:
        # DDS maps the domain to UDP ports; beyond 232 the ports overflow and every node exits.
        raise ReplayError(f"ROS_DOMAIN_ID={domain}: must be an integer 0-{MAX_DOMAIN_ID}")
    bag_path = plan.bag_output if plan.bag_output is not None else work / "replay.mcap"
    table_csv = None
    if plan.durations_table is not None:
        table_csv = timing_table.write_csv(plan.durations_table, work / "durations.csv")
    log_dir = Path(options.log_dir) if options.log_dir else work / "logs"
    recorder_spec, other_specs = node_specs(options, plan, work, bag_path, table_csv)
    _print_start(options, plan, table_csv is not None)

    recorder = NodeGroup([recorder_spec], log_dir=log_dir, echo=options.echo)
    nodes = NodeGroup(other_specs, log_dir=log_dir, echo=options.echo)
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
                    return f"node {label} exited with status {code}:\n{log_tail(log_dir, label)}"
            return None

        if not options.attach:
            _activate_planner(client, options, plan, dead, log_dir)
        _wait_for_graph(client, options, plan, dead, log_dir)
        startup_s = time.perf_counter() - wall_start
        time.sleep(SETTLE_S)
        print(f"nodes ready after {startup_s:.1f} s; publishing goals", file=sys.stderr, flush=True)
        t0_wall, unfinished = _run_schedule(client, options, plan, dead)
        metrics = list(client.seen.metrics)
        client_status = {t.task_id: client.last_status(t.task_id) for t in plan.tasks}

        # Stop the recorder (it closes the bag), then the nodes.
        time.sleep(RECORDER_GRACE_S)
        codes = recorder.stop(timeout_s=60)
        recorder_stopped = True
        if codes.get(recorder_spec.label) not in (0,):
            raise ReplayError(f"the recorder exited with status {codes.get(recorder_spec.label)}:\n"
                              f"{log_tail(log_dir, recorder_spec.label)}")
    finally:
        if not recorder_stopped:
            recorder.stop(timeout_s=30)
        nodes.stop(timeout_s=30)
        if client is not None:
            client.close()
        if own_rclpy:
            rclpy.try_shutdown()
    wall_s = time.perf_counter() - wall_start

    report = replay_report(options, plan, bag_path, t0_wall, metrics, client_status,
                           startup_s=startup_s, wall_s=wall_s)
    for text in report.warnings:
        warn(text)
    print(format_table(report.doc))
    for line in report.summary:
        print(line)
    if options.json_path:
        path = Path(options.json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(json_safe(report.doc), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
    if plan.bag_output is not None:
        print(f"recorded {report.doc['replay']['bag']}", file=sys.stderr)
    return 1 if unfinished else 0


def _print_start(options: ReplayOptions, plan: ReplayPlan, replays_durations: bool) -> None:
    planner = "attached planner" if options.attach \
        else f"policy {plan.policy}, engine {plan.engine}"
    if options.no_robots:
        robots = "robots: none started"
    else:
        robots = f"robots: {'replay ' + str(plan.durations_source) if replays_durations else 'sim'}, " \
                 f"time scale {options.time_scale:g}"
    print(f"replay {plan.workload.name}: {len(plan.events)} events, {len(plan.tasks)} tasks over "
          f"{max(t.time_s for t in plan.tasks):.1f} s on {len(plan.robots)} robots; {planner}; "
          f"{robots}; ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', '0')}",
          file=sys.stderr, flush=True)


def _activate_planner(client, options: ReplayOptions, plan: ReplayPlan, dead: DeadCheck,
                      log_dir: Path) -> None:
    """The planner is a lifecycle node: configure (engine start-up) and activate it."""
    from timelyllm_ros.ros.lifecycle_client import LifecycleError

    timeout = options.startup_timeout_s or STARTUP_TIMEOUT_S[plan.engine]
    try:
        client.lifecycle.drive_to_active(timeout, alive=lambda: dead() is None)
    except LifecycleError as err:
        raise ReplayError(f"{dead() or err}\n{log_tail(log_dir, 'planner')}") from None


def _wait_for_graph(client, options: ReplayOptions, plan: ReplayPlan, dead: DeadCheck,
                    log_dir: Path) -> None:
    """Until every node is up and connected; ReplayError if one dies or the start-up times out."""
    timeout = options.startup_timeout_s or STARTUP_TIMEOUT_S[plan.engine if not options.attach
                                                             else "sim"]
    deadline = time.monotonic() + timeout
    while True:
        why = dead()
        if why:
            raise ReplayError(why)
        missing = missing_endpoints(client, plan, options)
        if not missing:
            return
        if time.monotonic() > deadline:
            raise ReplayError(f"nodes not ready after {timeout:g} s; still waiting for "
                              f"{', '.join(missing[:6])}" + (" ..." if len(missing) > 6 else "")
                              + f" (node logs: {log_dir})")
        time.sleep(0.5)


def _run_schedule(client, options: ReplayOptions, plan: ReplayPlan,
                  dead: DeadCheck) -> tuple[float, list[str]]:
    """Publish the goals on schedule, then wait until every task is terminal or the task timeout
    after the last goal. Returns (the wall-clock start, the ids of tasks left unfinished)."""
    progress = ReplayProgress(f"replay {plan.policy if not options.attach else 'attached'}",
                              enabled=options.show_progress)
    n_tasks = len(plan.tasks)
    t0_mono, t0_wall = time.monotonic(), time.time()
    pending = sorted(plan.tasks, key=lambda t: (t.time_s, t.num))
    ids = [t.task_id for t in plan.tasks]

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

    while True:
        done = terminal_count()
        progress(done, n_tasks, time.monotonic() - t0_mono)
        if done >= n_tasks:
            break
        why = dead()
        if why:
            raise ReplayError(why)
        if time.monotonic() > last_goal + options.task_timeout_s:
            break
        time.sleep(0.1)
    unfinished = [t for t in ids if (s := client.last_status(t)) is None or s.state not in TERMINAL]
    if unfinished:
        warn(f"{len(unfinished)} task(s) not finished {options.task_timeout_s:g} s after the last "
             f"goal (e.g. {', '.join(unfinished[:5])}); reporting what was recorded")
    return t0_wall, unfinished


def _publish(client, task: PlannedTask) -> None:
    from timelyllm_ros.msg import TaskGoal
    from timelyllm_ros.ros.conversions import s_to_time

    now = time.time()
    task.published_wall = now
    client.publish_goal(TaskGoal(
        task_id=task.task_id, robot_id=task.robot_id, skill_set=task.trace.skill_set,
        instruction=task.trace.instruction, urgency=task.tuf_level, stamp=s_to_time(now)))
