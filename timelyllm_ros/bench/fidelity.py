"""The simulator against the real engine: `timelyllm bench --fidelity WORKLOAD`.

The same events are replayed per policy on the real vLLM engine (`runs` times, default 2: real
runs are noisy) and once on the simulated engine (it is deterministic), then compared task by
task (bench/fidelity_stats.py: p50, p90 and mean utility, their errors, the rankings).

What the simulated run shares with the real one, so that a difference is the cost model's:

- the events, the robots' execution times and the scheduler (as every bench replay);
- the profile: the real engine's measured cost model (`--profile`, by default
  config/engine_profiles/vllm-cpu-smollm2-135m-fp32.yaml) with the KV geometry, the token
  budget, the context length and the slot count read from the real engine of the runs
  (`RealGeometry`: derived from that engine, not fitted);
- the tokens: the model's own tokenizer and chat template (`ModelTokenizer`), so prompts and
  their prefix-cache blocks have the real lengths;
- the plans: each task generates the tokens the real engine generated for it in the policy's
  first real run (the model writes its own plans, which are not the traces' scripted ones, in
  more tokens than the tokenizer would split their text into: bench/fidelity_engines.py).
  A second simulated run with the traces' plans and the simulator's own tokenizer, what a plain
  `--engine sim` replay does, is reported beside it (`sim_trace_plans`).

Real runs alternate the policy order (run 1 in the given order, run 2 reversed, ...) so that a
drift in the machine's load does not always fall on the same policy. docs/fidelity.md has the
measured table.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.engines import build_engine
from timelyllm_ros.bench.fidelity_engines import (LoadMeter, MachineLoad, ModelTokenizer,
                                                  RealGeometry, RecordingPool, StepRecorder,
                                                  format_steps, task_plans)
from timelyllm_ros.bench.fidelity_stats import (PolicyFidelity, Rankings, compare, Figures,
                                                rankings)
from timelyllm_ros.bench.policies import make_policy
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.results import RunResult
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.lrtrace.traces import Trace, load_traces
from timelyllm_ros.lrtrace.workload import Event, Workload

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_POLICIES = ("vllm-stream", "default")
DEFAULT_MODEL = REPO_ROOT / "models" / "SmolLM2-135M-Instruct"
DEFAULT_PROFILE = REPO_ROOT / "config" / "engine_profiles" / "vllm-cpu-smollm2-135m-fp32.yaml"
REAL_RUNS = 2
# Trace ids of the per-task traces that carry a real run's plans (above any real trace id).
PLAN_TRACE_BASE = 1_000_000

ProgressFactory = Callable[[str], Any]


def plans_of(run: RunResult) -> dict[str, str]:
    """Task id -> the plan text the run generated (its segments in order); tasks without a
    segment are left out."""
    return {t.task_id: "".join(s.text for s in sorted(t.segments, key=lambda s: s.sequence))
            for t in run.tasks if t.segments}


def with_plans(events: Sequence[Event], traces: Mapping[int, Trace], plans: Mapping[str, str],
               task_id: Callable[[Any], str]) -> tuple[list[Event], dict[int, Trace]]:
    """The events with every task that has a plan in `plans` on a trace of its own (id
    PLAN_TRACE_BASE + task number) that generates that plan; other tasks keep their trace."""
    out_traces = dict(traces)
    out_events = []
    for event in events:
        tasks = []
        for spec in event.tasks:
            plan = plans.get(task_id(spec))
            if plan is None:
                tasks.append(spec)
                continue
            own = PLAN_TRACE_BASE + spec.task_id
            out_traces[own] = dataclasses.replace(traces[spec.trace_id], trace_id=own, plan=plan)
            tasks.append(dataclasses.replace(spec, trace_id=own))
        out_events.append(dataclasses.replace(event, tasks=tuple(tasks)))
    return out_events, out_traces


def _task_id(spec: Any) -> str:
    # bench.replay names tasks so (replay._task_id).
    return f"t{spec.task_id:05d}"


def sim_config(real: BenchConfig, profile: EngineProfile, geometry: RealGeometry) -> BenchConfig:
    """The simulated run's configuration: the real one's, on the simulated engine with the
    measured profile and the real engine's geometry."""
    return dataclasses.replace(real, engine="sim", model=None, vllm_config={},
                               profile=geometry.apply(profile),
                               max_num_seqs=geometry.max_num_seqs)


def run_sim(events: Sequence[Event], policy: str, workload: Workload, config: BenchConfig,
            tokenizer: ModelTokenizer | None, recorder: StepRecorder | None = None,
            **kw: Any) -> RunResult:
    """One simulated replay; with `tokenizer`, the engine tokenizes as the real model does;
    with `recorder`, its steps are recorded."""
    built = make_policy(policy, config)
    prefix_cache = config.baseline_prefix_cache or built.dispatch == "segment"
    engine = build_engine(config, prefix_cache=prefix_cache, policy=built)
    if tokenizer is not None:
        tokenizer.use_in(engine)
    if recorder is not None:
        recorder.wrap(engine)
    return run_policy(events, policy, workload, config, engine=engine, **kw)


@dataclass
class FidelityResult:
    policies: list[PolicyFidelity]
    rankings: list[Rankings]
    geometry: RealGeometry
    profile: EngineProfile
    real: dict[str, list[RunResult]]
    sim: dict[str, RunResult]
    sim_trace_plans: dict[str, RunResult]
    # Per policy: tasks whose plan differs between its real runs, and tasks whose generated
    # tokens could not be recovered (the simulated engine tokenized their plan text instead).
    plans_differ: dict[str, int]
    tokens_missed: dict[str, list[str]]
    # Per policy, per real run: how loaded the machine was while it ran.
    load: dict[str, list[MachineLoad]]
    # Per policy: step durations by batch size (StepRecorder.take_steps), "real" (per run) and
    # "sim".
    steps: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policies": {}, "rankings": [r.to_dict() for r in self.rankings],
                               "geometry": dataclasses.asdict(self.geometry),
                               "profile": self.profile.to_dict()}
        for p in self.policies:
            real = self.real[p.policy]
            doc = p.to_dict()
            doc["sim_trace_plans"] = dataclasses.asdict(Figures.of(self.sim_trace_plans[p.policy]))
            doc["plans_differ_between_real_runs"] = self.plans_differ[p.policy]
            doc["tokens_not_recovered"] = self.tokens_missed[p.policy]
            doc["real_wall_s"] = [r.wall_s for r in real]
            doc["machine_load"] = [dataclasses.asdict(m) for m in self.load[p.policy]]
            doc["steps"] = {"real": [r.steps for r in real], "sim": self.sim[p.policy].steps,
                            "by_batch": self.steps.get(p.policy, {})}
            doc["generated_tokens"] = {
                "real": [sum(t.generated_tokens for t in r.tasks) for r in real],
                "sim": sum(t.generated_tokens for t in self.sim[p.policy].tasks)}
            out["policies"][p.policy] = doc
        return out


def run_fidelity(events: Sequence[Event], workload: Workload, policies: Sequence[str],
                 config: BenchConfig, profile: EngineProfile, *, runs: int = REAL_RUNS,
                 model_tokenizer: ModelTokenizer | None = None,
                 pool: RecordingPool | None = None,
                 progress_factory: ProgressFactory | None = None,
                 log: Callable[[str], None] = lambda line: None,
                 **run_kwargs: Any) -> FidelityResult:
    """Replay `events` under each policy `runs` times on the real engine of `config` (engine
    vllm) and once on the simulated engine with `profile` and the real engine's geometry.

    `pool`: the real engines (default: a RecordingPool over `config`, shut down at the end; a
    given one is the caller's to shut down). `model_tokenizer`: the model's tokenizer for the
    simulated run (default: loaded from `config.model`)."""
    if runs < 1:
        raise ValueError(f"runs: must be >= 1, got {runs}")
    if config.engine != "vllm":
        raise ValueError("run_fidelity: config must be the real engine's (engine vllm)")
    own_pool = pool is None
    pool = pool if pool is not None else RecordingPool(config)
    traces = run_kwargs.pop("traces", None) or load_traces()

    def progress(label: str) -> Any:
        return progress_factory(label) if progress_factory is not None else None

    real: dict[str, list[RunResult]] = {p: [] for p in policies}
    outputs: dict[str, dict[str, list[tuple[int, str]]]] = {}
    load: dict[str, list[MachineLoad]] = {p: [] for p in policies}
    steps: dict[str, dict[str, Any]] = {p: {"real": []} for p in policies}
    try:
        for r in range(runs):
            order = list(policies) if r % 2 == 0 else list(reversed(policies))
            for name in order:
                log(f"real run {r + 1}/{runs}: {name}")
                pool.recorder.take()
                pool.recorder.take_steps()
                meter = LoadMeter()
                real[name].append(run_policy(events, name, workload, config, engine=pool,
                                             traces=traces, progress=progress(
                                                 f"{name} real {r + 1}"), **run_kwargs))
                load[name].append(meter.stop())
                steps[name]["real"].append(pool.recorder.take_steps())
                if r == 0:
                    outputs[name] = pool.recorder.take()
    finally:
        if own_pool:
            pool.shutdown()
    if pool.geometry is None:
        raise ValueError("run_fidelity: the engine pool built no engine")
    hf = model_tokenizer or ModelTokenizer.load(str(config.model))
    sim_cfg = sim_config(config, profile, pool.geometry)
    sim: dict[str, RunResult] = {}
    trace_plans: dict[str, RunResult] = {}
    differ: dict[str, int] = {}
    missed: dict[str, list[str]] = {}
    for name in policies:
        plans = plans_of(real[name][0])
        differ[name] = sum(1 for other in real[name][1:]
                           for tid, text in plans_of(other).items() if plans.get(tid) != text)
        tokens, missed[name] = task_plans(outputs[name], plans)
        tokenizer = hf.fresh()
        for generated in tokens.values():
            tokenizer.remember(generated)
        own_events, own_traces = with_plans(events, traces, plans, _task_id)
        log(f"simulated run: {name}")
        recorder = StepRecorder()
        sim[name] = run_sim(own_events, name, workload, sim_cfg, tokenizer, recorder,
                            traces=own_traces, progress=progress(f"{name} sim"), **run_kwargs)
        steps[name]["sim"] = recorder.take_steps()
        trace_plans[name] = run_sim(events, name, workload, sim_cfg, None, traces=traces,
                                    **run_kwargs)
    compared = compare(real, sim)
    return FidelityResult(compared, rankings(compared), pool.geometry, sim_cfg.load_profile(),
                          real, sim, trace_plans, differ, missed, load, steps)


def write_outputs(result: FidelityResult, out_dir: str | Path, header: Mapping[str, Any]
                  ) -> list[Path]:
    """fidelity.json (the comparison, `header` first), pairs.csv (every task's response times)
    and fidelity.png (the response-time distributions) in `out_dir`."""
    from timelyllm_ros.bench.fidelity_plots import plot_distributions
    from timelyllm_ros.bench.fidelity_stats import pairs_csv
    from timelyllm_ros.bench.metrics import json_safe

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {**dict(header), **result.to_dict(), "written": time.strftime("%Y-%m-%d %H:%M:%S")}
    paths = [out / "fidelity.json", out / "pairs.csv", out / "fidelity.png"]
    paths[0].write_text(json.dumps(json_safe(doc), indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(pairs_csv(result.policies), encoding="utf-8")
    plot_distributions(result.policies, paths[2], title=str(header.get("title", "")))
    return paths


# ---- `timelyllm bench --fidelity WORKLOAD` ------------------------------------------------------

class FidelityUsageError(ValueError):
    """Bad arguments for --fidelity (the CLI exits with status 2)."""


def main_fidelity(args: Any, cli_default_policies: str) -> int:
    """The `--fidelity` mode of `timelyllm bench` (cli/bench.py hands over its parsed
    arguments; `--policies` left at the CLI's default means vllm-stream and the default
    policy)."""
    import sys

    from timelyllm_ros.bench.fidelity_stats import format_fidelity, format_pairs
    from timelyllm_ros.bench.policies import PolicyListError, parse_policy_list
    from timelyllm_ros.bench.progress import ReplayProgress
    from timelyllm_ros.bench.workloads import WorkloadSourceError, load_bench_workload
    from timelyllm_ros.core.engine.cost_model import EngineProfileError

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    for flag, value in (("--kv-blocks", args.kv_blocks), ("--prompt-tokens", args.prompt_tokens),
                        ("--load-scale", args.load_scale),
                        ("--sweep-batch-cap", args.sweep_batch_cap)):
        if value is not None:
            raise FidelityUsageError(f"{flag}: not with --fidelity (the simulated run copies "
                                     "the real engine's geometry and prompts)")
    if args.fidelity_runs < 1:
        raise FidelityUsageError(f"--fidelity-runs: must be >= 1, got {args.fidelity_runs}")
    text = args.policies if args.policies != cli_default_policies else ",".join(DEFAULT_POLICIES)
    try:
        policies = parse_policy_list(text)
    except PolicyListError as exc:
        raise FidelityUsageError(f"--policies: {exc}") from None
    model = Path(args.model) if args.model else DEFAULT_MODEL
    if not model.is_dir():
        raise FidelityUsageError(f"--model: {model} is not a model directory")
    try:
        profile = EngineProfile.from_yaml(args.profile or DEFAULT_PROFILE)
    except EngineProfileError as exc:
        raise FidelityUsageError(f"--profile: {exc}") from None
    try:
        workload, events, run_kwargs = load_bench_workload(args.fidelity, args.seed,
                                                           args.duration_s)
    except WorkloadSourceError as exc:
        raise FidelityUsageError(str(exc)) from None
    if not events:
        raise FidelityUsageError(f"workload {workload.name}: no events")
    import importlib.util
    if importlib.util.find_spec("vllm") is None:  # fail now, not when the first engine starts
        raise FidelityUsageError("--fidelity: vLLM is not installed here")
    cache = True if args.baseline_prefix_cache is None else args.baseline_prefix_cache
    config = BenchConfig(engine="vllm", model=str(model), profile=profile, seed=args.seed,
                         batch_cap=args.batch_cap, segmented_batch_cap=args.seg_batch_cap,
                         baseline_prefix_cache=cache, robots=args.robots)
    n_tasks = sum(len(e.tasks) for e in events)
    say(f"fidelity: workload {workload.name}, {len(events)} events, {n_tasks} tasks over "
        f"{workload.duration_s:g} s; policies {', '.join(policies)}; {args.fidelity_runs} real "
        f"run(s) each on {model.name}, then the simulated engine with profile {profile.name}")
    result = run_fidelity(
        events, workload, policies, config, profile, runs=args.fidelity_runs, log=say,
        progress_factory=lambda label: ReplayProgress(label, enabled=not args.no_progress),
        **run_kwargs)
    g = result.geometry
    print(f"real engine: KV {g.kv_total_blocks} blocks of {g.kv_block_size} tokens, token "
          f"budget {g.max_num_batched_tokens}, max_model_len {g.max_model_len}, max_num_seqs "
          f"{g.max_num_seqs} (the simulated engine copies them)")
    for p in result.policies:
        print(format_pairs(p))
        print()
    print(format_fidelity(result.policies, result.rankings))
    print(format_steps(result.steps))
    for p in result.policies:
        f = Figures.of(result.sim_trace_plans[p.policy])
        print(f"{p.policy}: simulated with the traces' plans and the simulator's tokenizer: "
              f"p50 {f.p50_s * 1e3:.0f} ms, p90 {f.p90_s * 1e3:.0f} ms, utility {f.utility:.3f}; "
              f"plans that differ between real runs: {result.plans_differ[p.policy]}; tasks "
              f"whose generated tokens were not recovered: {len(result.tokens_missed[p.policy])}")
    for p in result.policies:
        runs = "; ".join(f"load {m.loadavg[0]:.1f}, CPU waiting {m.cpu_waiting_share * 100:.0f} %"
                         for m in result.load[p.policy])
        print(f"{p.policy}: machine during the real runs: {runs}")
    if args.out:
        argv = sys.argv[1:]
        if argv[:1] == ["bench"]:  # `timelyllm bench ...`: the subcommand is in argv already
            argv = argv[1:]
        header = {"command": "timelyllm bench " + " ".join(argv),
                  "workload": workload.to_dict(), "events": len(events), "tasks": n_tasks,
                  "real_runs": args.fidelity_runs,
                  "title": f"{workload.name}: real vLLM ({model.name}) vs simulated"}
        for path in write_outputs(result, args.out, header):
            say(f"wrote {path}")
    return 0
