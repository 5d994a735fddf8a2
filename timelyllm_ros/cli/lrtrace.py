"""`timelyllm lrtrace`: record, tabulate, fit, compose (and replay) robot timing traces.

    timelyllm lrtrace record -o run.mcap [--robots drone_1,drone_2] [--duration S] [--no-table]
    timelyllm lrtrace info run.mcap
    timelyllm lrtrace table run.mcap [-o table.csv] [--salvage]
    timelyllm lrtrace fit run.mcap|table.csv -o model.yaml [--plots DIR] [--allow-sparse]
                         [--base config/exec_model.yaml] [--linear SKILL,...] [--salvage]
    timelyllm lrtrace compose WID1|workload.yaml -o events.yaml [--seed N]
    timelyllm lrtrace compose --notation "{(1,2), 3, 4}" -o events.yaml [--interval S]
    timelyllm lrtrace import-authors DATA.json --config CONFIG.json --output DIR [--name N]
    timelyllm lrtrace replay events.yaml|workload.yaml|WID1 [--policy P] [--engine sim|vllm]
        [--attach [--no-robots]] [--exec-model model.yaml | --durations-from run.mcap|table.csv]
        [--json FILE] [--record out.mcap] [--time-scale S] [--duration-s S] [--seed N]

Exit status: 0 done, 1 bad data (corrupt bag, bad table, too few samples, bad workload; the
message names the file and the line, byte or field), 2 bad arguments. `replay` also exits 1
when a node fails or tasks are left unfinished (timelyllm_ros/experiments/replay.py).

This module parses arguments and prints; the work is in lrtrace/ (the data library),
ros/lrtrace_record.py (recording) and experiments/replay.py (the replay over ROS), each
imported only when its subcommand runs. The arguments of `replay` and `import-authors` are in
cli/lrtrace_replay.py and cli/lrtrace_authors.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Callable, Sequence

from timelyllm_ros.cli import lrtrace_authors, lrtrace_replay


def _error(command: str, err: object) -> int:
    print(f"timelyllm lrtrace {command}: error: {err}", file=sys.stderr, flush=True)
    return 1


# --- record --------------------------------------------------------------------------------------

def _add_record(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True,
                   help="bag to create: run.mcap -> directory run/ with run.mcap and metadata.yaml")
    p.add_argument("--robots", default="",
                   help="comma-separated robot ids to subscribe to from the start "
                        "(others are discovered while recording)")
    p.add_argument("--duration", type=float, default=0.0, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C / SIGTERM)")
    p.add_argument("--discovery-period", type=float, default=1.0, metavar="S",
                   help="how often to look for new robots' topics (default 1 s)")
    p.add_argument("--no-table", action="store_true",
                   help="do not write skill_timings.csv beside the bag when stopping")


def _parse_robots(text: str) -> list[str]:
    """Same rule as the recorder node's, without importing rclpy."""
    import re

    robots: list[str] = []
    for r in (x.strip().strip("/") for x in text.split(",")):
        if not r:
            continue
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*$", r):
            raise ValueError(f"robots: {r!r} is not a valid ROS namespace (letters, digits, '_')")
        if r not in robots:
            robots.append(r)
    return robots


def _run_record(args: argparse.Namespace) -> int:
    if args.duration < 0:
        raise _Usage("--duration: must be >= 0")
    if not args.discovery_period > 0:
        raise _Usage("--discovery-period: must be > 0")
    from timelyllm_ros.lrtrace.bag import bag_output_paths

    try:
        robots = _parse_robots(args.robots)
    except ValueError as err:
        raise _Usage(f"--{err}") from None
    bag_dir, _ = bag_output_paths(args.output)
    if bag_dir.exists():
        return _error("record", f"{bag_dir}: already exists; choose another -o or remove it")
    try:
        import rclpy  # noqa: F401

        import timelyllm_ros.msg  # noqa: F401
    except ImportError as err:
        return _error("record", f"ROS 2 or the timelyllm_ros message types are not available "
                      f"({err}); run scripts/bootstrap.sh, or on a ROS install source the workspace")
    from timelyllm_ros.ros.lrtrace_record import record

    return record(args.output, robots, args.duration,
                  write_table=not args.no_table, discovery_period_s=args.discovery_period)


# --- info / table --------------------------------------------------------------------------------

def _add_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("bag", help="bag directory, its .mcap file, or the name given to record -o")
    p.add_argument("--salvage", action="store_true", help="read what precedes damage in a broken bag")


def _run_info(args: argparse.Namespace) -> int:
    from timelyllm_ros.lrtrace.bag import BagError, read_messages

    try:
        contents = read_messages(args.bag, salvage=args.salvage)
    except BagError as err:
        return _error("info", err)
    msgs = contents.messages
    print(f"bag: {contents.path}")
    if msgs:
        span = (msgs[-1].timestamp_ns - msgs[0].timestamp_ns) / 1e9 if len(msgs) > 1 else 0.0
        print(f"messages: {len(msgs)} over {span:.3f} s")
    else:
        print("messages: 0")
    width = max((len(t) for t in contents.topics), default=5)
    for topic, (msgtype, count) in sorted(contents.topics.items()):
        print(f"  {topic:<{width}}  {msgtype:<34} {count:>6}")
    if contents.salvaged_error:
        print(f"salvaged: {contents.salvaged_error}", file=sys.stderr)
    return 0


def _add_table(p: argparse.ArgumentParser) -> None:
    p.add_argument("bag", help="bag directory, its .mcap file, or the name given to record -o")
    p.add_argument("-o", "--output", help="CSV to write (default: skill_timings.csv beside the bag)")
    p.add_argument("--salvage", action="store_true",
                   help="from a damaged bag, use the messages before the damage instead of failing")


def _run_table(args: argparse.Namespace) -> int:
    from timelyllm_ros.lrtrace import timing_table
    from timelyllm_ros.lrtrace.bag import BagError

    try:
        build, contents = timing_table.table_from_bag(args.bag, salvage=args.salvage)
        out = Path(args.output) if args.output else timing_table.default_table_path(args.bag)
    except BagError as err:
        return _error("table", err)
    if contents.salvaged_error:
        print(f"warning: salvaged {len(contents.messages)} messages; {contents.salvaged_error}",
              file=sys.stderr)
    timing_table.write_csv(build.rows, out)
    print(f"wrote {out}: {build.summary()}")
    return 0


# --- fit -----------------------------------------------------------------------------------------

def _add_fit(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="a bag (directory / .mcap), a timing table (.csv) or a "
                   "measured workload (`import-authors`)")
    p.add_argument("-o", "--output", required=True, help="model YAML to write (config/exec_model.yaml schema)")
    p.add_argument("--plots", metavar="DIR", help="write one PNG per fitted skill here")
    p.add_argument("--base", metavar="YAML",
                   help="model whose entries are kept for skills not fitted (default config/exec_model.yaml)")
    p.add_argument("--allow-sparse", action="store_true",
                   help="keep the base entry for skills with too few samples instead of failing")
    p.add_argument("--linear", default="", metavar="SKILL,...",
                   help="also fit these skills linearly in their first argument")
    p.add_argument("--salvage", action="store_true", help="read what precedes damage in a broken bag")


def _run_fit(args: argparse.Namespace) -> int:
    from timelyllm_ros.core.exec_model import ExecModelConfigError
    from timelyllm_ros.lrtrace import fit, fit_output, timing_table
    from timelyllm_ros.lrtrace.authors import timing_rows
    from timelyllm_ros.lrtrace.bag import BagError
    from timelyllm_ros.lrtrace.measured import is_measured_file, load_measured
    from timelyllm_ros.lrtrace.workload import WorkloadError

    src = Path(args.input)
    credit = ""
    try:
        if is_measured_file(src):  # `import-authors` output: a row per measured skill call
            measured = load_measured(src)
            table = timing_table.LoadedTable(timing_rows(measured))
            credit = measured.credit()
        else:
            table = timing_table.load_table(src, salvage=args.salvage)
        if table.build is not None:  # built from a bag: say what it read
            if table.contents.salvaged_error:
                print(f"warning: salvaged {len(table.contents.messages)} messages; "
                      f"{table.contents.salvaged_error}", file=sys.stderr)
            print(f"{src}: {table.build.summary()}")
        base = fit.load_base(args.base)
        result = fit.fit_rows(table.rows, base=base, allow_sparse=args.allow_sparse,
                              linear_skills=[s.strip() for s in args.linear.split(",") if s.strip()],
                              source=str(src))
        out = fit_output.write_model(result, args.output, base_path=args.base)
        if credit:  # a model fitted to someone's data carries their credit and licence
            out.write_text(credit + out.read_text(encoding="utf-8"), encoding="utf-8")
    except (BagError, timing_table.TableError, fit.FitError, ExecModelConfigError,
            WorkloadError) as err:
        return _error("fit", err)
    except OSError as err:
        return _error("fit", f"{getattr(err, 'filename', '') or ''}: {err.strerror or err}")
    print(fit_output.format_summary(result))
    for skill, why in sorted(result.kept.items()):
        if "sparse" in why:
            print(f"warning: {skill}: {why}", file=sys.stderr)
    print(f"wrote {out} ({len(result.fits)} skills fitted)")
    if args.plots:
        paths = fit_output.plot_fits(result, args.plots)
        print(f"wrote {len(paths)} plots to {args.plots}")
    return 0


# --- compose -------------------------------------------------------------------------------------

def _add_compose(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", nargs="?", help="workload YAML file or preset name (WID1, WID2, WID3)")
    p.add_argument("-o", "--output", required=True, help="event list YAML to write")
    p.add_argument("--seed", type=int, help="override the workload's seed")
    p.add_argument("--notation", metavar="TEXT",
                   help='hand-written events in the paper\'s notation, e.g. "{(1,2), 3, 4}" '
                        "(instead of a workload)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between events given with --notation (default 1)")
    p.add_argument("--start", type=float, default=0.0, metavar="S",
                   help="time of the first --notation event (default 0)")
    p.add_argument("--traces", metavar="YAML", help="traces file (default lrtrace/traces.yaml)")


def _run_compose(args: argparse.Namespace) -> int:
    if (args.workload is None) == (args.notation is None):
        raise _Usage("give either a workload (file or preset) or --notation, not both")
    if args.notation is not None and args.seed is not None:
        raise _Usage("--seed applies to a workload, not to --notation")
    if args.interval < 0 or args.start < 0:
        raise _Usage("--interval and --start must be >= 0")
    from timelyllm_ros.lrtrace.event_lists import parse_event_notation, save_events
    from timelyllm_ros.lrtrace.traces import TraceError, load_traces
    from timelyllm_ros.lrtrace.workload import WorkloadError, compose, load_workload

    try:
        traces = load_traces(args.traces) if args.traces else load_traces()
        if args.notation is not None:
            events = parse_event_notation(args.notation, traces, interval_s=args.interval,
                                          start_s=args.start)
            comment = f"Events from the notation {args.notation!r}, {args.interval:g} s apart."
        else:
            workload = load_workload(args.workload, traces)
            if args.seed is not None:
                if args.seed < 0:
                    raise _Usage("--seed: must be >= 0")
                workload = dataclasses.replace(workload, seed=args.seed)
            events = compose(workload, traces)
            comment = (f"Composed from workload {workload.name} (eps {workload.eps:g}/s, max_tpe "
                       f"{workload.max_tpe}, agents {workload.agents}, {workload.duration_s:g} s, "
                       f"seed {workload.seed}).")
        save_events(args.output, events, comment=comment)
    except (WorkloadError, TraceError) as err:
        return _error("compose", err)
    except OSError as err:
        return _error("compose", f"{args.output}: {err.strerror or err}")
    tasks = sum(len(e.tasks) for e in events)
    print(f"wrote {args.output}: {len(events)} events, {tasks} tasks")
    return 0


# --- dispatch ------------------------------------------------------------------------------------

class _Usage(Exception):
    """Bad arguments found after parsing: exit status 2."""


COMMANDS: dict[str, tuple[str, Callable, Callable]] = {
    "record": ("record goals, segments, reports and statuses to a rosbag2 (MCAP) bag",
               _add_record, _run_record),
    "info": ("list a bag's topics, types and message counts", _add_info, _run_info),
    "table": ("(re)build the per-skill timing table (CSV) from a bag", _add_table, _run_table),
    "fit": ("fit the execution-time model (exec_model.yaml schema) to a bag or table",
            _add_fit, _run_fit),
    "compose": ("compose a workload (or hand-written events) into an event list", _add_compose,
                _run_compose),
    "replay": (lrtrace_replay.HELP, lrtrace_replay.add, lrtrace_replay.run),
    "import-authors": (lrtrace_authors.HELP, lrtrace_authors.add, lrtrace_authors.run),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timelyllm lrtrace", description="LRTrace: record robot timing traces, fit the "
        "execution-time model, compose workloads (TimelyLLM §6).")
    sub = parser.add_subparsers(dest="command", metavar="command", required=True)
    for name, (help_text, add, _) in COMMANDS.items():
        add(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(COMMANDS[args.command][2](args) or 0)
    except _Usage as err:
        parser.print_usage(sys.stderr)
        print(f"timelyllm lrtrace {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
