"""`timelyllm bench --overhead`: the cost of generating a plan in segments (the paper's Table 4).

On the real engine, each skill set's tasks are generated one at a time, three ways:
- nonstop: the `vllm` policy (the whole plan in one request, dispatched at the end);
- segmented, preserve: `timelyllm` suspending at every statement boundary on a vLLM session
  (`sessions: true`), the robot's execution time zero (it reports at once), so everything the
  segmentation adds shows: the suspension, the resume (one token computed again), the
  scheduler's work in between;
- segmented, discard: the same with every suspension an abort + resubmit through the prefix
  cache (the pre-session path), for comparison.

The three plans of a task are the same text under greedy decoding only up to the owed-text
constraint, so the figure compared is the generation time *per generated token*: from the
task's submission to the end of its generation, divided by its tokens. Runs alternate between
the modes task by task in a rotating order (the first run of an instruction prefills it, the others find
it cached) and the median per mode is kept (a shared machine adds noise, never speed).
Overhead = segmented / nonstop - 1.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from timelyllm_ros.core.engine.base import DISCARD, PRESERVE
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.builtin import TimelyPolicy
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.sched.interface import PauseInfo
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.core.task import TaskSpec

MODES = ("nonstop", "segmented-preserve", "segmented-discard")


@dataclass
class _Segmented(TimelyPolicy):
    """TimelyLLM with a fixed pause handling for every suspension."""

    name: str = "timelyllm-overhead"
    handling: str = PRESERVE

    def pause_handling(self, pause: PauseInfo) -> str:
        return self.handling


@dataclass
class OverheadRow:
    skill_set: str
    tasks: int
    s_per_token: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, float] = field(default_factory=dict)
    segments: dict[str, float] = field(default_factory=dict)
    recomputed_per_resume: dict[str, float] = field(default_factory=dict)

    def overhead(self, mode: str) -> float:
        return self.s_per_token[mode] / self.s_per_token["nonstop"] - 1.0


class _Sink:
    def __init__(self):
        self.segments = []

    def on_segment(self, dispatch):
        self.segments.append(dispatch)

    def on_status(self, snapshot):
        pass


def _policy(mode: str):
    if mode == "nonstop":
        return get_policy("vllm")
    return _Segmented(handling=PRESERVE if mode.endswith("preserve") else DISCARD)


def generate_one(engine, skill_sets, exec_model, mode: str, task_id: str, skill_set: str,
                 instruction: str, level) -> tuple[float, int, int, list[int]]:
    """(seconds to generate, tokens, segments, recomputed tokens per resume) for one task,
    robots reporting each segment the moment it is dispatched."""
    sink = _Sink()
    sch = SegmentScheduler(engine, _policy(mode), skill_sets, exec_model, sink,
                           SchedulerConfig(network_latency_s=0.0, report_timeout_min_s=3600.0))
    spec = TaskSpec(task_id, f"robot_{task_id}", skill_set, instruction, level, engine.now(),
                    "normal")
    start = time.perf_counter()
    task = sch.submit(spec)
    reported = 0
    while not task.generation_finished and not task.lifecycle.is_terminal:
        sch.tick()
        while reported < len(sink.segments):
            seg = sink.segments[reported]
            reported += 1
            now = engine.now()
            sch.on_report(seg.task_id, seg.sequence, now, now, True)
    elapsed = time.perf_counter() - start
    while reported < len(sink.segments):
        seg = sink.segments[reported]
        reported += 1
        sch.on_report(seg.task_id, seg.sequence, engine.now(), engine.now(), True)
    if task.lifecycle.is_terminal and task.state != "done":
        raise RuntimeError(f"{task_id} ({mode}): {task.state}: {task.lifecycle.reason}")
    recomputed = []
    for k in range(1, task.engine_requests):
        stats = engine.request_stats(f"{task_id}#{k}")
        if stats is not None:
            recomputed.append(stats.recomputed_tokens)
    return elapsed, len(task.generated.token_ids), len(task.segments), recomputed


def measure_overhead(engine, skill_sets, instructions: dict[str, list[str]], levels,
                     exec_model: ExecutionTimeModel, repeats: int = 3,
                     log: Callable[[str], None] | None = None) -> list[OverheadRow]:
    """One row per skill set (instructions: skill set -> task instructions)."""
    rows = []
    for skill_set, texts in instructions.items():
        per: dict[str, list[tuple[float, int, int, list[int]]]] = {m: [] for m in MODES}
        for r in range(repeats):
            for i, text in enumerate(texts):
                # Interleaved (load spikes hit every mode alike), in a rotating order: the mode
                # that runs first for an instruction prefills it, the others find it cached.
                k = (r + i) % len(MODES)
                for mode in MODES[k:] + MODES[:k]:
                    tid = f"ovh-{skill_set}-{mode}-{r}-{i}"
                    per[mode].append(generate_one(engine, skill_sets, exec_model, mode, tid,
                                                  skill_set, text, levels.get("normal")))
            if log:
                log(f"{skill_set}: round {r + 1}/{repeats} done")
        row = OverheadRow(skill_set, len(texts))
        rows.append(row)
        for mode, samples in per.items():
            row.s_per_token[mode] = statistics.median(s / max(1, n) for s, n, _, _ in samples)
            row.tokens[mode] = statistics.mean(n for _, n, _, _ in samples)
            row.segments[mode] = statistics.mean(k for _, _, k, _ in samples)
            resumes = [x for _, _, _, rec in samples for x in rec]
            row.recomputed_per_resume[mode] = statistics.mean(resumes) if resumes else 0.0
        if log:
            log(format_overhead([row]))
    return rows


def format_overhead(rows: list[OverheadRow]) -> str:
    head = ("| skill set | tasks | tokens/plan | segments | nonstop ms/token | "
            "segmented ms/token (preserve) | overhead | recomputed/resume | "
            "segmented ms/token (discard) | overhead | recomputed/resume |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r.skill_set} | {r.tasks} | {r.tokens['nonstop']:.0f} | "
            f"{r.segments['segmented-preserve']:.1f} | {1e3 * r.s_per_token['nonstop']:.1f} | "
            f"{1e3 * r.s_per_token['segmented-preserve']:.1f} | "
            f"{100 * r.overhead('segmented-preserve'):+.1f}% | "
            f"{r.recomputed_per_resume['segmented-preserve']:.1f} | "
            f"{1e3 * r.s_per_token['segmented-discard']:.1f} | "
            f"{100 * r.overhead('segmented-discard'):+.1f}% | "
            f"{r.recomputed_per_resume['segmented-discard']:.1f} |")
    return "\n".join(lines)


def run_overhead(model: str, skill_sets, traces, levels, exec_model_path, *,
                 tasks_per_skill_set: int = 3, repeats: int = 3, only: list[str] | None = None,
                 log: Callable[[str], None] | None = None) -> list[OverheadRow]:
    """Build the real engine (sessions on) and measure every skill set that has traces."""
    from timelyllm_ros.core.engine.vllm_engine import VllmEngine
    from timelyllm_ros.core.engine.vllm_engine_config import VllmEngineConfig

    engine = VllmEngine(VllmEngineConfig(model=model))
    try:
        exec_model = ExecutionTimeModel.from_yaml(exec_model_path)
        warm = SegmentScheduler(engine, get_policy("vllm"), skill_sets, exec_model, _Sink())
        warm.warm_prefix_cache()
        instructions: dict[str, list[str]] = {}
        for trace in traces.values():
            if trace.skill_set in skill_sets and (not only or trace.skill_set in only):
                instructions.setdefault(trace.skill_set, [])
                if len(instructions[trace.skill_set]) < tasks_per_skill_set:
                    instructions[trace.skill_set].append(trace.instruction)
        return measure_overhead(engine, skill_sets, instructions, levels, exec_model,
                                repeats=repeats, log=log)
    finally:
        engine.shutdown()


def main_overhead(model: str | None, repeats: int = 3, tasks_per_skill_set: int = 3,
                  json_path: str | None = None, only: list[str] | None = None) -> int:
    """What `timelyllm bench --overhead` runs: print the table (and write JSON if asked)."""
    import json
    import sys

    from timelyllm_ros.core.engine.model_prep import DEFAULT_MODEL_DIR
    from timelyllm_ros.core.skills.skillset import load_skillsets
    from timelyllm_ros.core.tuf import default_config_dir, load_tuf_levels
    from timelyllm_ros.lrtrace.traces import load_traces

    config = default_config_dir()
    # The paper's Table 4 measures segmentation alone: no waits for robot reports.
    skill_sets = {n: dataclasses.replace(s, observations=False)
                  for n, s in load_skillsets(config / "skillsets").items()}
    rows = run_overhead(str(model or DEFAULT_MODEL_DIR), skill_sets, load_traces(),
                        load_tuf_levels(config / "tuf_levels.yaml"),
                        config / "exec_model.yaml", tasks_per_skill_set=tasks_per_skill_set,
                        repeats=repeats, only=only, log=lambda m: print(m, file=sys.stderr))
    print(format_overhead(rows))
    if json_path:
        with open(json_path, "w") as f:
            json.dump([{"skill_set": r.skill_set, "tasks": r.tasks,
                        "s_per_token": r.s_per_token, "tokens": r.tokens,
                        "segments": r.segments,
                        "recomputed_per_resume": r.recomputed_per_resume,
                        "overhead": {m: r.overhead(m) for m in MODES if m != "nonstop"}}
                       for r in rows], f, indent=2)
    return 0
