"""`timelyllm bench`: replay a workload under several policies and report the paper's metrics.

    timelyllm bench --workload WID1 --policies vllm,vllm-stream,fcfs-seg,edf-seg,timelyllm \\
        [--engine sim|vllm] [--seed N] [--batch-cap N] [--sweep-batch-cap 1,2,4,8,16] \\
        [--json FILE] [--plots DIR] [--profile config/engine_profiles/X.yaml] [--model DIR] \\
        [--duration-s S] [--prompt-tokens N|none] [--baseline-prefix-cache on|off] \
        [--kv-blocks N]

Every policy replays the same event list with the same robot execution times. Defaults are the
paper's configuration: 2884-token prompts (simulated engine), vllm / vllm-stream without prefix
caching, each policy's own admission. Exit status 2 for bad arguments (unknown policy, workload,
profile), 1 if a replay fails.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence, TextIO

import yaml

from timelyllm_ros.bench.harness import (DEFAULT_BASELINE_PREFIX_CACHE, DEFAULT_GEN_TIME_S,
                                         DEFAULT_RESUME_LEAD_S, DEFAULT_SEGMENTED_BATCH_CAP,
                                         PAPER_PROMPT_TOKENS, ROBOT_MODES, BenchConfig,
                                         EnginePool, RunResult, run_policy, shorten)
from timelyllm_ros.bench.metrics import (compute_metrics, format_ratios, format_table, json_safe,
                                         results_json)

DEFAULT_POLICIES = "vllm,vllm-stream,fcfs-seg,edf-seg,timelyllm"


class UsageError(Exception):
    """Bad arguments: reported on stderr with exit status 2."""


class TextProgress:
    """A one-line progress bar on a stream (no dependencies).

    On a terminal the line is redrawn in place, at most every `min_interval_s`; otherwise only the
    final line of each run is written, so logs stay short.
    """

    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30,
                 min_interval_s: float = 0.1, enabled: bool = True):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.min_interval_s = min_interval_s
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0.0
        self._start = time.perf_counter()

    def render(self, done: int, total: int, clock_s: float) -> str:
        frac = done / total if total else 1.0
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        return (f"{self.label:<22} [{bar}] {done}/{total} tasks  clock {clock_s:7.1f} s  "
                f"wall {time.perf_counter() - self._start:6.1f} s")

    def __call__(self, done: int, total: int, clock_s: float) -> None:
        if not self.enabled:
            return
        final = done >= total
        now = time.perf_counter()
        if self.tty and (final or now - self._last >= self.min_interval_s):
            self._last = now
            self.stream.write("\r" + self.render(done, total, clock_s) + ("\n" if final else ""))
            self.stream.flush()
        elif not self.tty and final:
            self.stream.write(self.render(done, total, clock_s) + "\n")
            self.stream.flush()


def _optional_number(kind):
    def parse(text: str):
        if text.lower() in ("none", "off", ""):
            return None
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__} or 'none', got {text!r}")
        return value
    return parse


def _caps(text: str) -> list[int]:
    try:
        caps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not caps or any(c < 1 for c in caps):
        raise argparse.ArgumentTypeError(f"batch caps must be integers >= 1, got {text!r}")
    return caps


_UNPADDED = "none"


def _prompt_tokens(text: str) -> int | str:
    if text.lower() in ("none", "off"):
        return _UNPADDED
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'none', got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'none', got {text!r}")
    return value


def _on_off(text: str) -> bool:
    if text.lower() in ("on", "true", "yes", "1"):
        return True
    if text.lower() in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="timelyllm bench",
        description="Replay an LRTrace workload under several scheduling policies (same events, "
                    "same robot timings) and report time utility, response and waiting time.")
    p.add_argument("--workload", required=True,
                   help="preset name (WID1, WID2, WID3), a seed paper's workload (seed001-chat, "
                        "seed002-rtbe, seed003-gsm8k, seed004-api; simulated engine only) or a "
                        "workload / event-list YAML file")
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help=f"comma-separated policy names (default: {DEFAULT_POLICIES})")
    p.add_argument("--engine", choices=("sim", "vllm"), default="sim",
                   help="sim: calibrated simulated engine in virtual time (default); "
                        "vllm: the real engine in wall-clock time (needs --model)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of event composition and robot execution times "
                        "(default: the workload's)")
    p.add_argument("--batch-cap", type=int, default=None,
                   help="fixed cap on running generations for every policy")
    p.add_argument("--seg-batch-cap", type=_optional_number(int),
                   default=DEFAULT_SEGMENTED_BATCH_CAP,
                   help="without --batch-cap: cap for segmented policies (fcfs-seg, edf-seg, "
                        "timelyllm*); 'none' = each policy's own admission, latency-guided for "
                        "timelyllm* (default: none)")
    p.add_argument("--sweep-batch-cap", type=_caps, default=None, metavar="1,2,4,8,16",
                   help="also run every policy at each of these batch caps (Fig. 8)")
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE",
                   help="write the metrics as JSON")
    p.add_argument("--plots", default=None, metavar="DIR", help="write figures (PNG) here")
    p.add_argument("--profile", default=None,
                   help="engine profile YAML for the simulated engine "
                        "(default: config/engine_profiles/llama3-8b-rtx4090.yaml)")
    p.add_argument("--kv-blocks", type=int, default=None, metavar="N",
                   help="simulated engine: KV cache of N blocks instead of the profile's (how "
                        "much a policy's KV handling matters depends on the KV pressure)")
    p.add_argument("--model", default=None, help="local model directory (--engine vllm)")
    p.add_argument("--duration-s", type=float, default=None,
                   help="replay only the first S seconds of the workload")
    p.add_argument("--requests", type=int, default=None, metavar="N",
                   help="a seed paper's workload with a fixed request count (seed003-gsm8k, "
                        "seed004-api): only its first N requests")
    p.add_argument("--resume-lead-s", type=_optional_number(float), default=DEFAULT_RESUME_LEAD_S,
                   help="resume a suspended generation no earlier than this long before its "
                        "robot is expected to finish ('none' = as soon as admitted; default)")
    p.add_argument("--gen-time-s", type=_optional_number(float), default=DEFAULT_GEN_TIME_S,
                   help="TimelyLLM's per-segment generation time g (default: the policy's, 0.09)")
    p.add_argument("--robots", choices=ROBOT_MODES, default="queue",
                   help="queue: a busy robot queues a new task behind its current one (default); "
                        "parallel: every task gets its own robot")
    p.add_argument("--baseline-prefix-cache", type=_on_off, default=DEFAULT_BASELINE_PREFIX_CACHE,
                   metavar="on|off",
                   help="off (default, the paper's configuration): vllm / vllm-stream run "
                        "without automatic prefix caching, as vLLM V0 did by default in 2024; "
                        "on: with it. Segmented policies always keep it. Both engines.")
    p.add_argument("--prompt-tokens", type=_prompt_tokens, default=None,
                   metavar="N|none",
                   help="simulated engine: pad each skill set's prompt with a fixed (shared, "
                        "cacheable) preamble to N tokens (default: the paper's "
                        f"{PAPER_PROMPT_TOKENS}); none = the skill sets' own prompts")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def load_events_for(spec: str, seed: int | None, duration_s: float | None):
    """(workload, events) for a preset, a workload file or an event-list file."""
    from timelyllm_ros.lrtrace.workload import (Workload, WorkloadError, compose, load_events,
                                                load_workload)
    path = Path(spec)
    if path.is_file():
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"workload {spec}: cannot read: {exc}") from None
        if isinstance(data, dict) and "events" in data:
            try:
                events = load_events(path)
            except WorkloadError as exc:
                raise UsageError(f"workload: {exc}") from None
            if duration_s is not None:
                events = [e for e in events if e.time_s < duration_s]
            last = max((e.time_s for e in events), default=0.0)
            traces = sorted({t.trace_id for e in events for t in e.tasks}) or [1]
            workload = Workload(name=path.stem, eps=0.0, max_tpe=max(
                (len(e.tasks) for e in events), default=1), traces=tuple(traces),
                agents=len({t.robot_id for e in events for t in e.tasks}) or 1,
                duration_s=duration_s or last + 1.0, seed=seed or 0,
                description=f"event list {path}")
            return workload, events
    try:
        workload = load_workload(spec)
    except WorkloadError as exc:
        raise UsageError(f"workload: {exc}") from None
    if seed is not None:
        workload = replace(workload, seed=seed)
    try:
        workload = shorten(workload, duration_s)
    except ValueError as exc:
        raise UsageError(f"--duration-s: {exc}") from None
    return workload, compose(workload)


def _check_policies(text: str) -> list[str]:
    from timelyllm_ros.core.policies.registry import policy_names
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise UsageError("--policies: no policy given")
    known = policy_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--policies: unknown policy {unknown[0]!r}; known policies: "
                         f"{', '.join(known)}")
    if len(set(names)) != len(names):
        raise UsageError("--policies: a policy is listed twice")
    return names


def _workload_block(workload, events, config: BenchConfig, runs: dict[str, RunResult],
                    seed: int) -> dict[str, Any]:
    tasks = next(iter(runs.values())).tasks if runs else []
    return {
        **workload.to_dict(),
        "seed": seed,
        "events": len(events),
        "tasks": sum(len(e.tasks) for e in events),
        "tasks_by_type": dict(Counter(t.task_type for t in tasks)),
        "bench": config.describe(),
        "policy_batch_cap": {n: r.config.get("policy_batch_cap") for n, r in runs.items()},
        "tasks_without_response": {n: sum(1 for t in r.tasks if not math.isfinite(t.response_time_s))
                                   for n, r in runs.items()},
        "tasks_not_done": {n: sum(1 for t in r.tasks if t.state != "done")
                           for n, r in runs.items()},
        "virtual_clock_s": {n: r.clock_s for n, r in runs.items()},
    }


def _run_all(events, policies, workload, config, engine, progress: bool, label: str = "",
             run_kwargs: dict[str, Any] | None = None) -> dict[str, RunResult]:
    runs = {}
    for name in policies:
        bar = TextProgress(f"{label}{name}", enabled=progress)
        runs[name] = run_policy(events, name, workload, config, engine=engine, progress=bar,
                                **(run_kwargs or {}))
    return runs


def _load_scenario(args: argparse.Namespace, policies: list[str]):
    """(scenario, policies to run) for a paper workload (`seed001-chat`, ...)."""
    import inspect

    from timelyllm_ros.bench.paper_workloads import SCENARIOS, build_scenario
    from timelyllm_ros.core.policies.registry import get_policy
    if args.engine != "sim":
        raise UsageError(f"workload {args.workload}: the paper workloads run on the simulated "
                         "engine only (their plans are scripted token counts)")
    params: dict[str, Any] = {}
    if args.duration_s is not None:
        accepted = inspect.signature(SCENARIOS[args.workload.lower()]).parameters
        if "duration_s" not in accepted:
            raise UsageError(f"--duration-s: workload {args.workload} has a fixed request count")
        params["duration_s"] = args.duration_s
    if args.requests is not None:
        accepted = inspect.signature(SCENARIOS[args.workload.lower()]).parameters
        if "n" not in accepted:
            raise UsageError(f"--requests: workload {args.workload} is bounded by time "
                             "(use --duration-s)")
        if args.requests < 1:
            raise UsageError(f"--requests: must be >= 1, got {args.requests}")
        params["n"] = args.requests
    scenario = build_scenario(args.workload, seed=args.seed, **params)
    if not scenario.pauses_required:
        return scenario, policies
    kept = [p for p in policies if get_policy(p).dispatch == "segment"]
    skipped = [p for p in policies if p not in kept]
    if skipped:
        print(f"workload {scenario.name}: skipping {', '.join(skipped)}: a request that calls a "
              "tool must pause for the answer, and these policies never pause a generation",
              file=sys.stderr)
    if not kept:
        raise UsageError(f"workload {scenario.name}: no policy left that pauses generations")
    return scenario, kept


def format_sweep(sweep: dict[str, Any]) -> str:
    caps = sweep["batch_cap"]
    names = list(sweep["policies"])
    rows = []
    for i, cap in enumerate(caps):
        cells = [str(cap)]
        for n in names:
            u = sweep["policies"][n]["utility_mean"][i]
            w = sweep["policies"][n]["waiting_time_mean_s"][i]
            cells.append(f"{u:.3f} ({w * 1e3:.0f})")
        rows.append(cells)
    header = ["cap", *names]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["batch-cap sweep: mean utility (mean waiting time, ms)"]
    for r in [header, *rows]:
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return _main(args)
    except UsageError as exc:
        print(f"timelyllm bench: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a replay that cannot finish (see harness.run_policy)
        print(f"timelyllm bench: replay failed: {exc}", file=sys.stderr)
        return 1


def _main(args: argparse.Namespace) -> int:
    policies = _check_policies(args.policies)
    if args.batch_cap is not None and args.batch_cap < 1:
        raise UsageError("--batch-cap: must be >= 1")
    if args.seg_batch_cap is not None and args.seg_batch_cap < 1:
        raise UsageError("--seg-batch-cap: must be >= 1 or none")
    if args.engine == "vllm" and not args.model:
        raise UsageError("--engine vllm needs --model DIR (a local model directory)")
    if args.prompt_tokens is None:  # default: the paper's profile on the simulated engine
        prompt_tokens = PAPER_PROMPT_TOKENS if args.engine == "sim" else None
    elif args.prompt_tokens == _UNPADDED:
        prompt_tokens = None
    elif args.engine == "vllm":
        raise UsageError("--prompt-tokens pads prompts on the simulated engine only "
                         "(--engine vllm uses the skill sets' prompts as they are)")
    else:
        prompt_tokens = args.prompt_tokens
    if args.profile is not None:
        from timelyllm_ros.core.engine.cost_model import EngineProfile, EngineProfileError
        try:
            profile = EngineProfile.from_yaml(args.profile)
        except EngineProfileError as exc:
            raise UsageError(f"--profile: {exc}") from None
    else:
        profile = None
    from timelyllm_ros.bench.paper_workloads import is_scenario
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
        workload, events = load_events_for(args.workload, args.seed, args.duration_s)
    if not events:
        raise UsageError(f"workload {workload.name}: no events in {workload.duration_s:g} s")
    try:
        config = BenchConfig(engine=args.engine, profile=profile, model=args.model,
                             seed=args.seed, batch_cap=args.batch_cap,
                             segmented_batch_cap=args.seg_batch_cap,
                             baseline_prefix_cache=args.baseline_prefix_cache,
                             prompt_tokens=prompt_tokens, resume_lead_s=args.resume_lead_s,
                             gen_time_s=args.gen_time_s,
                             robots=args.robots)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if scenario is not None:
        config = scenario.configure(config)
    if args.kv_blocks is not None:
        if args.engine != "sim":
            raise UsageError("--kv-blocks: the real engine's KV size is vLLM's (memory_fraction)")
        try:
            config = replace(config, profile=replace(config.load_profile(),
                                                     kv_total_blocks=args.kv_blocks))
        except ValueError as exc:
            raise UsageError(f"--kv-blocks: {exc}") from None
        print(f"KV cache: {args.kv_blocks} blocks", file=sys.stderr)
    seed = workload.seed if args.seed is None else args.seed
    progress = not args.no_progress
    n_tasks = sum(len(e.tasks) for e in events)
    prompt_desc = f"{prompt_tokens}-token prompts" if prompt_tokens else "unpadded prompts"
    if scenario is not None:
        print(f"workload {scenario.name} (seed {scenario.paper}): {scenario.description}; "
              f"engine profile {scenario.profile.name}", file=sys.stderr)
    print(f"workload {workload.name}: {len(events)} events, {n_tasks} tasks over "
          f"{workload.duration_s:g} s (seed {seed}); engine {args.engine}; {prompt_desc}; "
          f"baseline prefix cache {'on' if args.baseline_prefix_cache else 'off'}", file=sys.stderr)

    engine = None
    if args.engine == "vllm":
        try:
            import vllm  # noqa: F401 - fail early with a usage error, not mid-run
        except ImportError as exc:
            raise UsageError(f"--engine vllm: vLLM is not importable here ({exc})") from None
        engine = EnginePool(config)
    try:
        runs = _run_all(events, policies, workload, config, engine, progress,
                        run_kwargs=run_kwargs)
        doc = results_json(runs, _workload_block(workload, events, config, runs, seed))
        if scenario is not None:
            from timelyllm_ros.bench.paper_metrics import paper_metrics
            doc["paper_metrics"] = {n: paper_metrics(r.tasks) for n, r in runs.items()}
        sweep = None
        if args.sweep_batch_cap:
            sweep = {"batch_cap": list(args.sweep_batch_cap),
                     "policies": {n: {"utility_mean": [], "waiting_time_mean_s": [],
                                      "by_type_utility": []} for n in policies}}
            for cap in args.sweep_batch_cap:
                capped = replace(config, batch_cap=cap)
                for name, run in _run_all(events, policies, workload, capped, engine, progress,
                                          label=f"cap {cap}: ", run_kwargs=run_kwargs).items():
                    m = compute_metrics(run.tasks, run.fetch_overhead_s)
                    entry = sweep["policies"][name]
                    entry["utility_mean"].append(m["overall"]["utility_mean"])
                    entry["waiting_time_mean_s"].append(m["overall"]["waiting_time_mean_s"])
                    entry["by_type_utility"].append(
                        {t: b["utility_mean"] for t, b in m["by_type"].items()})
            doc["sweep"] = sweep
    finally:
        if engine is not None:
            engine.shutdown()

    print(format_table(doc))
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
        for path in write_all(runs, doc, args.plots, sweep=sweep, title=title):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
