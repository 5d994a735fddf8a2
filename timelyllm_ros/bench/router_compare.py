"""`timelyllm router-compare`: the planner's own placement (`engine.replicas`,
core/engine/replicas.py) against vllm-router (`--policy consistent_hash`, `engine.router`) on
the same two `vllm serve` workers, the same workload, in alternating order (docs/router.md).

Per placement:
- sequential: tasks one at a time; each resume's prompt tokens served from the prefix cache,
  read from the workers' counters (router_workload.MeteredRuns), against the whole blocks of
  the plan so far;
- burst: tasks submitted at once; each run's time to first token, each task's response time
  (arrival to its first segment at the robot), and how many runs each worker served;
- worker death: worker 1 is killed while plans are on it; what happens to its generating runs,
  its suspended plans, new plans while it is down, and new plans once it is back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from timelyllm_ros.bench.router_workload import (MeteredRuns, Robots, drone_tasks,
                                                 lrtrace_tasks, make_scheduler, percentile,
                                                 run_one_after_another, run_tasks)
from timelyllm_ros.bench.vllm_deployment import Deployment
from timelyllm_ros.core.engine.base import EngineAdapter
from timelyllm_ros.core.engine.factory import EngineSpec, build_engine

PLACEMENTS = ("vllm-router", "replicas")


def build_placement(placement: str, dep: Deployment) -> EngineAdapter:
    if placement == "vllm-router":
        params = {"kind": "openai", "url": dep.router.url, "router": True,
                  "max_num_seqs": dep.max_num_seqs}
    elif placement == "replicas":
        params = {"kind": "openai", "replicas": dep.worker_urls(),
                  "max_num_seqs": dep.max_num_seqs}
    else:
        raise ValueError(f"placement: {placement!r} is not one of {PLACEMENTS}")
    return build_engine(EngineSpec.from_params(params))


def runs_served(url: str) -> float:
    """Requests a worker has started streaming (its time-to-first-token histogram's count:
    observed for every request, also the ones the planner aborts at a segment boundary)."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=5.0).text.splitlines():
        if line.startswith("vllm:time_to_first_token_seconds_count"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class PlacementResult:
    resumes: int = 0
    resumes_whole_plan_cached: int = 0
    cached_tokens: list[int] = field(default_factory=list)
    whole_blocks: list[int] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    response_s: list[float] = field(default_factory=list)
    runs_per_worker: list[float] = field(default_factory=list)
    tasks_done: int = 0
    tasks: int = 0
    death: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        def ms(values, q):
            value = percentile(values, q)
            return None if value is None else round(1e3 * value, 1)
        return {"resumes": self.resumes, "resumes_whole_plan_cached":
                self.resumes_whole_plan_cached,
                "cached_share": (round(sum(self.cached_tokens) / sum(self.whole_blocks), 4)
                                 if self.whole_blocks else None),
                "ttft_p50_ms": ms(self.ttft_s, 50), "ttft_p99_ms": ms(self.ttft_s, 99),
                "response_p50_ms": ms(self.response_s, 50),
                "response_p99_ms": ms(self.response_s, 99),
                "runs_per_worker": [int(x) for x in self.runs_per_worker],
                "tasks_done": self.tasks_done, "tasks": self.tasks, "death": self.death}


def _sequential(placement: str, dep: Deployment, prefix: str, count: int, block: int,
                result: PlacementResult) -> None:
    engine = build_placement(placement, dep)
    try:
        sch, runs = run_one_after_another(engine, dep.worker_urls(), prefix, count)
        for run in runs:
            if run.resume >= 1 and run.cached is not None:
                result.resumes += 1
                result.cached_tokens.append(run.cached)
                result.whole_blocks.append(run.full_blocks(block))
                result.resumes_whole_plan_cached += run.cached >= run.full_blocks(block)
        result.tasks += count
        result.tasks_done += sum(t.state == "done" for t in sch.tasks.values())
    finally:
        engine.shutdown()


def _burst(placement: str, dep: Deployment, prefix: str, count: int,
           result: PlacementResult) -> None:
    engine = build_placement(placement, dep)
    try:
        meter = MeteredRuns(engine, dep.worker_urls(), per_run_counters=False)
        sch = make_scheduler(engine)
        sch.warm_prefix_cache()
        before = [runs_served(u) for u in dep.worker_urls()]
        for spec in drone_tasks(prefix, count, engine.now()):
            sch.submit(spec)
        run_tasks(sch, Robots(exec_s=0.5), timeout_s=600)
        after = [runs_served(u) for u in dep.worker_urls()]
        moved = [a - b for a, b in zip(after, before)]
        result.runs_per_worker = ([x + y for x, y in zip(result.runs_per_worker, moved)]
                                  if result.runs_per_worker else moved)
        result.ttft_s += [r.ttft_s for r in meter.finish()
                          if r.request_id.startswith(prefix) and r.ttft_s is not None]
        result.response_s += [t.response_time_s for t in sch.tasks.values()
                              if t.state == "done"]
        result.tasks += count
        result.tasks_done += sum(t.state == "done" for t in sch.tasks.values())
    finally:
        engine.shutdown()


def _running_on(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=5.0).text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _death(placement: str, dep: Deployment, prefix: str, count: int,
           result: PlacementResult, log: Callable[[str], None]) -> None:
    """Kill worker 1 while plans run on it, then bring it back (module docstring)."""
    victim = dep.worker_urls()[1]
    engine = build_placement(placement, dep)
    try:
        meter = MeteredRuns(engine, dep.worker_urls(), per_run_counters=False)
        sch = make_scheduler(engine)
        robots = Robots(exec_s=2.0)
        # Chat and drone plans taking turns: a chat run (up to 60 tokens) is long enough to be
        # caught generating when the worker dies, drone plans are suspended between runs.
        for spec in lrtrace_tasks(prefix, count, engine.now(), ("chat", "drone")):
            sch.submit(spec)
        polled = {"at": 0.0}

        def victim_busy(_):
            now = time.monotonic()
            if now - polled["at"] < 0.2:
                return False
            polled["at"] = now
            chats = [t for t in sch.tasks.values() if t.spec.skill_set == "chat"]
            return _running_on(victim) > 0 and any(meter.generating(t.task_id) for t in chats)
        run_tasks(sch, robots, timeout_s=120, until=victim_busy)
        dep.servers[1].kill()
        killed_at = time.monotonic()
        run_tasks(sch, robots, timeout_s=300)
        errors = [r for r in meter.runs.values() if r.error]
        after_kill = list(sch.tasks.values())
        # New plans while it is down.
        down_prefix = f"{prefix}-down"
        for spec in lrtrace_tasks(down_prefix, count, engine.now(), ("chat", "drone")):
            sch.submit(spec)
        run_tasks(sch, robots, timeout_s=300)
        down_tasks = [t for t in sch.tasks.values() if t.task_id.startswith(down_prefix)]
        # Back: restart it and send new plans.
        dep.restart(1)
        dep.wait_router_sees({0, 1}, time.monotonic() + 60)
        back_at = time.monotonic()
        before = runs_served(victim)
        back_prefix = f"{prefix}-back"
        for spec in lrtrace_tasks(back_prefix, count, engine.now(), ("chat", "drone")):
            sch.submit(spec)
        run_tasks(sch, robots, timeout_s=300)
        back_tasks = [t for t in sch.tasks.values() if t.task_id.startswith(back_prefix)]
        result.death = {
            "tasks_at_kill": len(after_kill),
            "runs_ended_with_error": len(errors),
            "error_example": errors[0].error if errors else "",
            "tasks_failed": sum(t.state == "failed" for t in after_kill),
            "failure_reasons": sorted({t.lifecycle.reason or "" for t in after_kill
                                       if t.state == "failed"}),
            "tasks_done_after_kill": sum(t.state == "done" for t in after_kill),
            "first_error_after_kill_s": (round(min(r.ended_s for r in errors) - killed_at, 2)
                                         if errors else None),
            "new_plans_while_down_done": sum(t.state == "done" for t in down_tasks),
            "new_plans_while_down": len(down_tasks),
            "new_plans_after_restart_done": sum(t.state == "done" for t in back_tasks),
            "runs_on_restarted_worker": int(runs_served(victim) - before),
            "seconds_after_rejoin": round(time.monotonic() - back_at, 1),
        }
        log(f"{placement} worker death: {result.death}")
    finally:
        engine.shutdown()
        if not dep.servers[1].alive():
            dep.restart(1)
            dep.wait_router_sees({0, 1}, time.monotonic() + 60)


def compare(dep: Deployment, *, rounds: int = 2, sequential_tasks: int = 4,
            burst_tasks: int = 6, death_tasks: int = 4, block_size: int = 32,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Both placements, alternating which goes first each round; the death test last."""
    results = {p: PlacementResult() for p in PLACEMENTS}
    for r in range(rounds):
        order = PLACEMENTS if r % 2 == 0 else PLACEMENTS[::-1]
        for placement in order:
            tag = "vr" if placement == "vllm-router" else "rp"
            log(f"round {r + 1}/{rounds}: {placement} sequential")
            _sequential(placement, dep, f"s{r}{tag}", sequential_tasks, block_size,
                        results[placement])
            log(f"round {r + 1}/{rounds}: {placement} burst")
            _burst(placement, dep, f"b{r}{tag}", burst_tasks, results[placement])
    for placement in PLACEMENTS:
        tag = "vr" if placement == "vllm-router" else "rp"
        log(f"{placement}: worker death")
        _death(placement, dep, f"d{tag}", death_tasks, results[placement], log)
    return {p: results[p].summary() for p in PLACEMENTS}


def markdown_table(summary: dict[str, Any]) -> str:
    a, b = summary["vllm-router"], summary["replicas"]

    def row(label, fn):
        return f"| {label} | {fn(a)} | {fn(b)} |"

    def death(key):
        return lambda s: s["death"].get(key, "-")
    lines = ["| | vllm-router (consistent_hash) | engine.replicas (ours) |", "|---|---|---|",
             row("resumes with the whole plan so far cached",
                 lambda s: f"{s['resumes_whole_plan_cached']} / {s['resumes']}"),
             row("prompt tokens cached / whole blocks, all resumes", lambda s: s["cached_share"]),
             row("run time to first token p50 / p99 (burst)",
                 lambda s: f"{s['ttft_p50_ms']} / {s['ttft_p99_ms']} ms"),
             row("task response p50 / p99 (burst)",
                 lambda s: f"{s['response_p50_ms']} / {s['response_p99_ms']} ms"),
             row("runs per worker, worker 0 / worker 1 (burst)",
                 lambda s: " / ".join(map(str, s["runs_per_worker"]))),
             row("tasks done", lambda s: f"{s['tasks_done']} / {s['tasks']}"),
             row("worker killed: runs ended with an error", death("runs_ended_with_error")),
             row("worker killed: tasks failed / done of those running",
                 lambda s: f"{s['death'].get('tasks_failed')} / "
                           f"{s['death'].get('tasks_done_after_kill')} of "
                           f"{s['death'].get('tasks_at_kill')}"),
             row("new plans while it is down: done",
                 lambda s: f"{s['death'].get('new_plans_while_down_done')} / "
                           f"{s['death'].get('new_plans_while_down')}"),
             row("after restart: new plans done / runs on the restarted worker",
                 lambda s: f"{s['death'].get('new_plans_after_restart_done')} / "
                           f"{s['death'].get('runs_on_restarted_worker')}")]
    return "\n".join(lines)
