"""`timelyllm bench`: replay a workload under several policies and report the paper's metrics.

    timelyllm bench --workload WID1 --policies vllm,vllm-stream,fcfs-seg,edf-seg,timelyllm \\
        [--engine sim|vllm] [--seed N] [--batch-cap N] [--sweep-batch-cap 1,2,4,8,16] \\
        [--json FILE] [--plots DIR] [--profile config/engine_profiles/X.yaml] [--model DIR] \\
        [--duration-s S] [--prompt-tokens N|none] [--baseline-prefix-cache on|off] \
        [--paper-config] [--kv-blocks N] [--bound] [--load-scale 0.25,0.5,1,2,4,8,16]
    timelyllm bench --family N [--family-seed S] [--family-subject POLICY] [--family-member K]

Every policy replays the same event list with the same robot execution times. Defaults are the
configuration a user runs today: prefix caching for every policy, the skill sets' own prompts
(plus each task's own context where the workload gives one), vLLM V1's token budget with chunked
prefill, each policy's own admission. `--paper-config` is the paper's 2024 configuration instead:
2884-token prompts (simulated engine) and vllm / vllm-stream without prefix caching. Exit status
2 for bad arguments (unknown policy, workload, profile), 1 if a replay fails.

The options and their value types are declared in `cli/bench_args.py`; this module checks them
against each other, builds the bench's configuration and runs the replay or one of its modes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from timelyllm_ros.bench.config import (DEFAULT_BASELINE_PREFIX_CACHE, PAPER_PROMPT_TOKENS,
                                        BenchConfig)
from timelyllm_ros.bench.engines import EnginePool
from timelyllm_ros.bench.load_sweep import format_load_sweep, scaled_workload, sweep_loads
from timelyllm_ros.bench.metrics import (format_first_action_table, format_ratios, format_table,
                                         json_safe, results_json)
from timelyllm_ros.bench.paper_workloads import build_scenario, is_scenario
from timelyllm_ros.bench.policies import (DEFAULT_ALIAS, PolicyListError, parse_policy_list,
                                          split_by_pausing)
from timelyllm_ros.bench.progress import ReplayProgress
from timelyllm_ros.bench.replay import run_policies
from timelyllm_ros.bench.results import workload_block
from timelyllm_ros.bench.sweep import format_sweep, sweep_batch_caps
from timelyllm_ros.bench.workloads import (WorkloadSourceError, load_bench_workload,
                                           scenario_accepts)
from timelyllm_ros.cli.bench_args import DEFAULT_POLICIES, UNPADDED, build_parser
from timelyllm_ros.core.policies.registry import DEFAULT_POLICY


class UsageError(Exception):
    """Bad arguments: reported on stderr with exit status 2."""


def _check_policies(text: str) -> list[str]:
    try:
        return parse_policy_list(text)
    except PolicyListError as exc:
        raise UsageError(f"--policies: {exc}") from None


def _load_events(args: argparse.Namespace):
    try:
        return load_bench_workload(args.workload, args.seed, args.duration_s)
    except WorkloadSourceError as exc:
        if exc.argument == "duration_s":
            raise UsageError(f"--duration-s: {exc}") from None
        raise UsageError(str(exc)) from None


def _load_scenario(args: argparse.Namespace, policies: list[str]):
    """(scenario, policies to run) for a paper workload (`seed001-chat`, ...)."""
    if args.engine != "sim":
        raise UsageError(f"workload {args.workload}: the paper workloads run on the simulated "
                         "engine only (their plans are scripted token counts)")
    params: dict[str, Any] = {}
    if args.duration_s is not None:
        if not scenario_accepts(args.workload, "duration_s"):
            raise UsageError(f"--duration-s: workload {args.workload} has a fixed request count")
        params["duration_s"] = args.duration_s
    if args.requests is not None:
        if not scenario_accepts(args.workload, "n"):
            raise UsageError(f"--requests: workload {args.workload} is bounded by time "
                             "(use --duration-s)")
        if args.requests < 1:
            raise UsageError(f"--requests: must be >= 1, got {args.requests}")
        params["n"] = args.requests
    scenario = build_scenario(args.workload, seed=args.seed, **params)
    if not scenario.pauses_required:
        return scenario, policies
    kept, skipped = split_by_pausing(policies)
    if skipped:
        print(f"workload {scenario.name}: skipping {', '.join(skipped)}: a request that calls a "
              "tool must pause for the answer, and these policies never pause a generation",
              file=sys.stderr)
    if not kept:
        raise UsageError(f"workload {scenario.name}: no policy left that pauses generations")
    return scenario, kept


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return _main(args)
    except UsageError as exc:
        print(f"timelyllm bench: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a replay that cannot finish (see bench.replay.run_policy)
        print(f"timelyllm bench: replay failed: {exc}", file=sys.stderr)
        return 1


def _prompt_length(args: argparse.Namespace) -> int | None:
    if args.prompt_tokens is None:  # the skill sets' own prompts, or the paper's padding
        return PAPER_PROMPT_TOKENS if args.paper_config and args.engine == "sim" else None
    if args.prompt_tokens == UNPADDED:
        return None
    if args.engine == "vllm":
        raise UsageError("--prompt-tokens pads prompts on the simulated engine only "
                         "(--engine vllm uses the skill sets' prompts as they are)")
    return args.prompt_tokens


def _engine_profile(args: argparse.Namespace):
    if args.profile is None:
        return None
    from timelyllm_ros.core.engine.cost_model import EngineProfile, EngineProfileError
    try:
        return EngineProfile.from_yaml(args.profile)
    except EngineProfileError as exc:
        raise UsageError(f"--profile: {exc}") from None


def _bench_config(args: argparse.Namespace, profile, prompt_tokens: int | None,
                  scenario) -> BenchConfig:
    try:
        config = BenchConfig(engine=args.engine, profile=profile, model=args.model,
                             seed=args.seed, batch_cap=args.batch_cap,
                             segmented_batch_cap=args.seg_batch_cap,
                             baseline_prefix_cache=args.baseline_prefix_cache,
                             prompt_tokens=prompt_tokens, resume_lead_s=args.resume_lead_s,
                             gen_time_s=args.gen_time_s,
                             robots=args.robots, evict_parked=not args.no_evict,
                             replicas=args.replicas)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if scenario is not None:
        config = scenario.configure(config)
    if args.kv_blocks is not None:
        if args.engine != "sim":
            raise UsageError("--kv-blocks: only for the simulated engine; the real engine's KV "
                             "cache is sized in bytes (VllmEngineConfig.kv_cache_memory_bytes, "
                             "1 GiB by default)")
        try:
            config = replace(config, profile=replace(config.load_profile(),
                                                     kv_total_blocks=args.kv_blocks))
        except ValueError as exc:
            raise UsageError(f"--kv-blocks: {exc}") from None
        print(f"KV cache: {args.kv_blocks} blocks", file=sys.stderr)
    return config


def _real_engine_pool(config: BenchConfig) -> EnginePool:
    try:
        import vllm  # noqa: F401 - fail early with a usage error, not mid-run
    except ImportError as exc:
        raise UsageError(f"--engine vllm: vLLM is not importable here ({exc})") from None
    return EnginePool(config)


def _main(args: argparse.Namespace) -> int:
    if args.overhead:
        from timelyllm_ros.bench.overhead import main_overhead
        only = args.overhead_skill_sets.split(",") if args.overhead_skill_sets else None
        return main_overhead(args.model, repeats=args.overhead_repeats,
                             tasks_per_skill_set=args.overhead_tasks,
                             json_path=args.json_path, only=only)
    if args.chat_experiment:
        from timelyllm_ros.cli import bench_chat
        if args.baseline_prefix_cache is None:
            args.baseline_prefix_cache = not args.paper_config
        return bench_chat.run(args, _bench_config(args, _engine_profile(args), None, None))
    if args.family is not None or args.family_member is not None:
        from timelyllm_ros.cli import bench_family
        error = bench_family.usage_error(args)
        if error:
            raise UsageError(error)
        if args.baseline_prefix_cache is None:
            args.baseline_prefix_cache = False if args.paper_config \
                else DEFAULT_BASELINE_PREFIX_CACHE
        return bench_family.run(args, _bench_config(args, None, _prompt_length(args), None))
    if args.fidelity is not None:
        from timelyllm_ros.bench.fidelity import FidelityUsageError, main_fidelity
        try:
            return main_fidelity(args, DEFAULT_POLICIES)
        except FidelityUsageError as exc:
            raise UsageError(str(exc)) from None
    if args.workload is None:
        raise UsageError("--workload is required (a preset, a workload file, or a seed paper's "
                         "workload), except with --chat-experiment")
    policies = _check_policies(args.policies)
    if DEFAULT_ALIAS in [p.strip() for p in args.policies.split(",")]:
        print(f"policy {DEFAULT_ALIAS}: {DEFAULT_POLICY} (the planner's default)", file=sys.stderr)
    if args.batch_cap is not None and args.batch_cap < 1:
        raise UsageError("--batch-cap: must be >= 1")
    if args.seg_batch_cap is not None and args.seg_batch_cap < 1:
        raise UsageError("--seg-batch-cap: must be >= 1 or none")
    if args.engine == "vllm" and not args.model:
        raise UsageError("--engine vllm needs --model DIR (a local model directory)")
    if args.baseline_prefix_cache is None:
        args.baseline_prefix_cache = False if args.paper_config else DEFAULT_BASELINE_PREFIX_CACHE
    prompt_tokens = _prompt_length(args)
    profile = _engine_profile(args)
    scenario = None
    run_kwargs: dict[str, Any] = {}
    if is_scenario(args.workload):
        scenario, policies = _load_scenario(args, policies)
        workload, events, run_kwargs = scenario.workload, scenario.events, scenario.run_kwargs()
        prompt_tokens = None
    else:
        if args.requests is not None:
            raise UsageError("--requests: only for a seed paper's workload with a fixed request "
                             "count (seed003-gsm8k, seed004-api)")
        workload, events, run_kwargs = _load_events(args)
    if args.load_scale is not None:
        if scenario is not None:
            raise UsageError(f"--load-scale: workload {workload.name} is a seed paper's workload "
                             "with its own arrival process (use a preset or a workload file)")
        try:
            scaled_workload(workload, args.load_scale[0])
        except ValueError as exc:
            raise UsageError(f"--load-scale: {exc}") from None
    if not events:
        raise UsageError(f"workload {workload.name}: no events in {workload.duration_s:g} s")
    config = _bench_config(args, profile, prompt_tokens, scenario)
    seed = workload.seed if args.seed is None else args.seed
    n_tasks = sum(len(e.tasks) for e in events)
    prompt_desc = f"{prompt_tokens}-token prompts" if prompt_tokens else "unpadded prompts"
    if scenario is not None:
        print(f"workload {scenario.name} (seed {scenario.paper}): {scenario.description}; "
              f"engine profile {scenario.profile.name}", file=sys.stderr)
    print(f"workload {workload.name}: {len(events)} events, {n_tasks} tasks over "
          f"{workload.duration_s:g} s (seed {seed}); engine {args.engine}; {prompt_desc}; "
          f"baseline prefix cache {'on' if args.baseline_prefix_cache else 'off'}", file=sys.stderr)

    def progress_bar(label: str) -> ReplayProgress:
        return ReplayProgress(label, enabled=not args.no_progress)

    engine = _real_engine_pool(config) if args.engine == "vllm" else None
    try:
        runs = run_policies(events, policies, workload, config, progress_factory=progress_bar,
                            engine=engine, **run_kwargs)
        doc = results_json(runs, workload_block(workload, events, config, runs, seed),
                           first_action=True)
        if args.bound:
            from timelyllm_ros.bench.bound import add_bound, upper_bound
            add_bound(doc, upper_bound(events, workload, config, **run_kwargs))
        if scenario is not None:
            from timelyllm_ros.bench.paper_metrics import paper_metrics
            doc["paper_metrics"] = {n: paper_metrics(r.tasks) for n, r in runs.items()}
        sweep = None
        if args.sweep_batch_cap:
            sweep = sweep_batch_caps(events, policies, workload, config, args.sweep_batch_cap,
                                     progress_factory=progress_bar, engine=engine, **run_kwargs)
            doc["sweep"] = sweep
        load_sweep = None
        if args.load_scale:
            load_sweep = sweep_loads(
                workload, policies, config, args.load_scale, base=(events, runs),
                progress_factory=progress_bar, engine=engine,
                announce=lambda line: print(line, file=sys.stderr), **run_kwargs)
            doc["load_sweep"] = load_sweep
    finally:
        if engine is not None:
            engine.shutdown()

    print(format_table(doc))
    print(format_first_action_table(doc))
    if "paper_metrics" in doc:
        from timelyllm_ros.bench.paper_metrics import format_paper_table
        print(f"\n{scenario.paper}'s own figures (latency: arrival to last segment delivered):")
        print(format_paper_table(doc["paper_metrics"]))
    for target in [p for p in policies if p != "vllm"]:
        line = format_ratios(doc, baseline="vllm", target=target)
        if line:
            print(line)
    if sweep:
        print(format_sweep(sweep))
    if load_sweep:
        print(format_load_sweep(load_sweep))
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(json_safe(doc), indent=2) + "\n",
                                        encoding="utf-8")
        print(f"wrote {args.json_path}", file=sys.stderr)
    if args.plots:
        from timelyllm_ros.bench.plots import write_all
        cache = "on" if args.baseline_prefix_cache else "off"
        title = (f"{workload.name} ({args.engine}, {prompt_desc}, baseline prefix cache {cache}"
                 + (f", batch cap {args.batch_cap})" if args.batch_cap else ")"))
        for path in write_all(runs, doc, args.plots, sweep=sweep, title=title,
                              load_sweep=load_sweep):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
