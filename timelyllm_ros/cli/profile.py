"""`timelyllm profile`: measure the real engine's step latency and fit the simulated engine's model.

    timelyllm profile [--model DIR] [--output config/engine_profiles/vllm-cpu-smollm2-135m.yaml]
                      [--quick] [--repeats N] [--dtype bfloat16|float32] [--name NAME]

What is measured and how the fit copes with a busy machine: timelyllm_ros/core/engine/profiling.py.
This module parses the arguments, runs the measurement and writes the profile with a note of
where and how it was measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from timelyllm_ros.core.engine.model_prep import DEFAULT_MODEL_DIR
from timelyllm_ros.core.engine.profiling import (DEFAULT_OUTPUT, FULL, QUICK, Profiler,
                                                 build_profiling_engine, cpu_pressure,
                                                 fit_measurements, machine_description, summary,
                                                 vllm_version, write_profile)


# `timelyllm profile --pauses` runs the engine as the planner does (float32 weights on a CPU).
PAUSES_PROFILE = DEFAULT_OUTPUT.parent / "vllm-cpu-smollm2-135m-fp32.yaml"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timelyllm profile",
        description="Measure the real engine's prefill and decode latency and write the engine "
                    "profile that the simulated engine (bench, replay) loads.")
    parser.add_argument("--model", default=str(DEFAULT_MODEL_DIR),
                        help="local Hugging Face model directory (default: the bundled model)")
    parser.add_argument("--output", type=Path, default=None,
                        help=f"profile YAML to write (default: {DEFAULT_OUTPUT}; with --pauses "
                             "the profile to compare with, default: the one of the engine's "
                             f"float32 weights, {PAUSES_PROFILE.name})")
    parser.add_argument("--quick", action="store_true",
                        help="fewer sizes and repeats: under 2 minutes on a 2-core CPU")
    parser.add_argument("--dtype", default=None,
                        help="weights dtype passed to the engine (default: the engine's default, "
                             "bfloat16; on CPUs without native bf16, float32 prefills much faster)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="rounds over every configuration (default: 3 full, 2 quick); more "
                             "rounds give cleaner minima on a busy machine")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--kv-cache-bytes", type=int, default=None, metavar="N",
                        help="the engine's KV cache in bytes (default: 1 GiB, as the planner's "
                             "engine.kv_cache_bytes); the profile's kv_total_blocks follow from it")
    parser.add_argument("--name", default=None, help="profile name (default: output file stem)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pauses", action="store_true",
                        help="only calibrate the simulated engine's preserve / discard pauses "
                             "against the real engine's session and prefix-cache resumes "
                             "(core/engine/pause_calibration.py), against the profile at "
                             "--output; --repeats rounds (default 3)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    if not Path(args.model).is_dir():
        print(f"timelyllm profile: --model {args.model}: not a directory (run `timelyllm model "
              "prepare` first)", file=sys.stderr)
        return 2
    plan = QUICK if args.quick else FULL
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error("--repeats must be >= 1")
        per_round = max(1, plan.decode_steps // max(1, plan.decode_rounds))
        plan = dataclasses.replace(plan, prefill_repeats=args.repeats, decode_rounds=args.repeats,
                                   decode_steps=per_round * args.repeats)
    if args.output is None:
        args.output = PAUSES_PROFILE if args.pauses and not args.dtype else DEFAULT_OUTPUT
    name = args.name or args.output.stem

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f} s] {msg}", flush=True)

    t0 = time.monotonic()
    if args.pauses:
        from timelyllm_ros.core.engine.pause_calibration import run_pause_calibration
        print(run_pause_calibration(args.model, args.output, log=log,
                                    repeats=args.repeats or 3, dtype=args.dtype), flush=True)
        return 0
    log(f"starting the engine ({args.model}) ...")
    if args.kv_cache_bytes is not None and args.kv_cache_bytes <= 0:
        parser.error("--kv-cache-bytes must be positive")
    engine, config = build_profiling_engine(args.model, args.dtype, args.max_model_len,
                                            args.kv_cache_bytes)
    try:
        log(f"engine ready; KV cache {engine.kv_usage()}; {'quick' if args.quick else 'full'} plan")
        profiler = Profiler(engine, seed=args.seed, log=log, max_num_seqs=config.max_num_seqs)
        m = profiler.run(plan)
    finally:
        engine.shutdown()
    pressure = cpu_pressure()
    source = (
        f"Measured by `timelyllm profile{' --quick' if args.quick else ''}` on "
        f"{machine_description()}, {time.strftime('%Y-%m-%d')}: vLLM {vllm_version()}, model "
        f"{Path(args.model).name}, dtype {config.dtype}, enforce_eager {config.enforce_eager}.\n"
        f"Prefill: time to first token of one uncached random prompt, minimum of "
        f"{plan.prefill_repeats} rounds, lengths {', '.join(str(n) for n, _ in m.prefill)}.\n"
        f"Decode: fastest of {plan.decode_steps} steps in {plan.decode_rounds} rounds per batch size "
        f"({', '.join(map(str, plan.decode_batches))}) and context "
        f"({', '.join(map(str, plan.decode_contexts))}) pair."
        + (f"\nCPU pressure (PSI some avg300) at the end: {pressure}%." if pressure else ""))
    profile = fit_measurements(m, name=name, source=source)
    print(summary(m, profile), flush=True)
    header = [f"Engine step cost profile `{name}` (see timelyllm_ros/core/engine/cost_model.py).",
              "Written by `timelyllm profile`; re-run it on the target machine to refresh.",
              f"Measurement took {m.wall_s:.0f} s."]
    write_profile(profile, args.output, header)
    log(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
