"""`timelyllm plan run PROGRAM`: dry-run a plan on a simulated robot.

    timelyllm plan run "_1=s,bottle;?_1==True{o,bottle;_2=oh,bottle;l,_2}" \\
        --scene config/scenes/drone_room.yaml
    timelyllm plan run "pick(red_block)->place(red_block,blue_block)->check(red_block)" \\
        --skill-set arm --scene config/scenes/arm_table.yaml

The plan is cut into segments the way the planner cuts it, and each segment runs on one
interpreter (variables carry over), as on a robot. Prints every executed skill call with its
return value (calls inside a high-level skill indented under it), then the plan's outcome.
PROGRAM may also be a file holding the plan. A PROGRAM starting with `-` (a bare return,
`->True`) needs no `--` in front of it. Exit status 0 when the plan succeeded, 1 when a segment
failed, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.skills import get_language
from timelyllm_ros.core.skills.base import SkillSyntaxError
from timelyllm_ros.core.skills.interpreter import InterpreterLimits, TaskInterpreter
from timelyllm_ros.core.skills.values import format_value


def _segments(language, text: str) -> list[str]:
    out, pos = [], 0
    while (end := language.next_boundary(text, pos)) is not None:
        out.append(text[pos:end])
        pos = end
    end = language.final_segment_end(text, pos)
    if end is not None and text[pos:end].strip():
        out.append(text[pos:end])
        pos = end
    if text[pos:].strip():
        out.append(text[pos:])   # incomplete: run it anyway, it fails with the parse error
    return out


def _runtime(skill_set: str, scene: str | None, model: ExecutionTimeModel, args):
    if skill_set == "arm":
        from timelyllm_ros.robots.arm import ArmRuntime, SimulatedArmDriver

        objects = None
        if scene:
            data = yaml.safe_load(Path(scene).read_text(encoding="utf-8")) or {}
            objects = [o["name"] if isinstance(o, dict) else str(o)
                       for o in data.get("objects", [])]
        driver = SimulatedArmDriver(model, time_scale=1e-9, jitter=args.jitter, seed=args.seed,
                                    objects=objects)
        return ArmRuntime(driver)
    from timelyllm_ros.robots.drone_sim import SimDrone
    from timelyllm_ros.robots.scene import load_scene

    return SimDrone(load_scene(scene) if scene else None, model, jitter=args.jitter,
                    seed=args.seed)


def run(args) -> int:
    text = args.program
    if Path(text).is_file():
        text = Path(text).read_text(encoding="utf-8").strip()
    language_name = {"drone": "minispec"}.get(args.skill_set, args.skill_set)
    try:
        language = get_language(language_name)
    except KeyError as err:
        print(f"timelyllm plan: --skill-set: {err.args[0]}", file=sys.stderr)
        return 2
    if not hasattr(language, "program"):
        print(f"timelyllm plan: skill set {args.skill_set!r} has nothing to execute",
              file=sys.stderr)
        return 2
    model = ExecutionTimeModel.from_yaml(args.exec_model)
    try:
        runtime = _runtime(args.skill_set, args.scene, model, args)
    except (OSError, ValueError) as err:
        print(f"timelyllm plan: --scene: {err}", file=sys.stderr)
        return 2
    limits = InterpreterLimits(max_loop_count=args.max_loop_count, step_budget=args.step_budget)
    interp = TaskInterpreter(language, runtime, limits)
    total_calls, total_s, estimate = 0, 0.0, 0.0
    outcome = None
    for i, segment in enumerate(_segments(language, text), 1):
        try:
            estimate += model.estimate_segment_nominal(language.parse(segment).calls)
        except SkillSyntaxError:
            pass
        if not args.quiet:
            print(f"segment {i}: {segment.strip()}")
        outcome = interp.run_segment(segment)
        for call in outcome.calls_executed:
            print("  " + call.line())
        total_calls += len(outcome.calls_executed)
        total_s += outcome.duration_s
        if outcome.plan_ended:
            break
    if outcome is None:
        print("outcome: empty plan, nothing executed")
        return 0
    if not outcome.success:
        state = f"failed: {outcome.message}"
    elif outcome.ended_by_return:
        state = f"done, returned {format_value(outcome.returned_value)} (the plan ended early)"
    else:
        state = "done"
    variables = ", ".join(f"{k}={format_value(v)}" for k, v in sorted(outcome.values.items()))
    print(f"outcome: {state}")
    print(f"  {total_calls} skill call(s), {total_s:.2f} s simulated "
          f"(estimate {estimate:.2f} s)" + (f"; variables: {variables}" if variables else ""))
    pose = getattr(getattr(runtime, "scene", None), "pose", None)
    if pose is not None:
        print(f"  drone at x={pose.x:.0f} y={pose.y:.0f} z={pose.z:.0f} cm, heading "
              f"{pose.heading:.0f} deg, {'flying' if pose.flying else 'landed'}")
    return 0 if outcome.success else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="timelyllm plan", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run", help="dry-run a plan on a simulated robot",
                       usage="timelyllm plan run [options] PROGRAM")
    # Optional to argparse only so that a PROGRAM starting with "-" can be taken from the
    # arguments argparse did not recognise (below); it is required all the same.
    r.add_argument("program", nargs="?", metavar="PROGRAM",
                   help="the plan text, or a file holding it; one starting with '-' (\"->True\") "
                   "is taken as is, no '--' needed")
    r.add_argument("--skill-set", default="drone", choices=["drone", "minispec", "arm"])
    r.add_argument("--scene", default=None, help="scene YAML (config/scenes/)")
    r.add_argument("--exec-model", default=None, help="execution-time model YAML")
    r.add_argument("--max-loop-count", type=int, default=InterpreterLimits.max_loop_count)
    r.add_argument("--step-budget", type=int, default=InterpreterLimits.step_budget)
    r.add_argument("--jitter", action="store_true", help="sample durations instead of nominal")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--quiet", action="store_true", help="do not print segment headers")
    # argparse reads any word starting with "-" as an option, so `plan run "->True"` would be
    # refused as an unknown one; where PROGRAM is missing, the one such word is PROGRAM.
    args, unknown = ap.parse_known_args(argv)
    candidates = [w for w in unknown if _program_like(w)]
    if args.program is None and len(candidates) == 1:
        args.program = candidates[0]
        unknown.remove(args.program)
    if unknown:
        r.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.program is None:
        r.error("the following arguments are required: PROGRAM")
    return run(args)


def _program_like(word: str) -> bool:
    # "--x" stays an (unknown) option; a plan never starts with two dashes.
    return word.startswith("-") and not word.startswith("--") and word != "-"


if __name__ == "__main__":
    sys.exit(main())
