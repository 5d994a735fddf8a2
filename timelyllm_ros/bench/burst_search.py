"""The best schedule found by search for one event's first segments on the simulated engine.

A reference beside the burst bound (bench/bound_burst.py), not a bound: the bound is an upper
limit of every schedule; this is what one schedule actually gets, so the best schedule of a
burst lies between the two. It serves to tell a loose bound from a policy that loses.

A burst (an event, or events released close together: `release_s` each) is served alone: an
idle engine whose prefix cache holds the skill sets' shared prompts (the replay's warm-up) and,
with `event_tasks(..., earlier=True)`, every prompt and plan of the events before it (what the
replay's cache holds at light load if nothing was evicted; the bound assumes the shared prompts
only). A schedule says, for each task, before which engine step of the burst it is added to the
engine (`schedule[i]`, steps counted from the burst's first; a task released later joins at the
first step after its release); once added, the engine admits it as the simulated engine does
(core/engine/sim/engine.py: FCFS, chunked prefill under the token budget, prefix hits on whole
blocks that earlier steps computed). A task leaves the batch on the step that emits its first
segment's last token: a planner does that by suspending it with preserve (free in the simulated
engine) and resuming it once the burst's other first segments are out. Utility counts first
segments only, as the bench does, so what the plans do afterwards is not part of it.

`simulate` is a re-implementation of the engine's step for that case (the same cost terms,
chunking and prefix hits; it refuses a profile with grammar waits); `replay_on_engine` runs a
schedule on the real `SimulatedEngine`, and the tests check the two agree. `search` is a
depth-first branch and bound over every admission schedule: at each step boundary any subset of
the tasks not yet added may be added (an idle engine must take at least one: waiting idle only
delays; with nothing released it waits for the next release), pruned where the utility already fixed plus each open task's utility at its own
earliest possible response cannot beat the best schedule so far. Within one step the added
tasks join the queue in task order (that only matters when their prompts overflow the budget).
With no node limit hit the search is exhaustive over that space and `complete` is true.

`relaxed(event)` is the same event on an engine that charges nothing per sequence or per
context token. The searched space leaves out suspending a sequence for some steps (preserve,
then resume), which saves exactly those terms of the steps it sits out (and costs a token of
prefill on resume): the relaxed engine's best is an optimistic figure for schedules that also
do that. Neither figure is a bound: other events' work, earlier prompts in the prefix cache
beyond `earlier`, and chunks split by other requests are outside the searched space.

The report per family member (bench/burst_search_report.py):

    python -m timelyllm_ros.bench.burst_search_report --family-seed 1 --member 39 --event 0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from timelyllm_ros.bench.bound import _instruction, first_segment_tokens
from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.replay import _replay_skill_sets
from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.engine.sim.pauses import common_prefix
from timelyllm_ros.core.tuf import TUF, load_tuf_levels
from timelyllm_ros.lrtrace.traces import load_traces
from timelyllm_ros.lrtrace.workload import Event, Workload


@dataclass(frozen=True)
class BurstTask:
    task_id: str
    prompt: tuple[int, ...]
    plan: str  # the trace's plan: what the simulated engine emits
    script: tuple[int, ...]  # the plan's tokens
    first_tokens: int  # tokens up to the first segment (bench.bound.first_segment_tokens)
    tuf: TUF
    regex: str | None = None
    release_s: float = 0.0  # after the burst's first release (a burst of several events)


@dataclass(frozen=True)
class BurstEvent:
    profile: EngineProfile
    latency_s: float
    tasks: tuple[BurstTask, ...]
    warm: tuple[tuple[tuple[int, ...], str | None], ...] = ()  # shared prompts, their grammar
    max_num_seqs: int = 256


def event_tasks(burst: Sequence[Event], events: Sequence[Event], workload: Workload,
                config: BenchConfig, earlier: bool = True) -> BurstEvent:
    """The tasks of the events `burst` (one, or several close together: each task released at
    its event's time after the first's) with the prompts, scripts and first segments the replay
    gives them (`events`: the whole replay, whose traces choose the skill sets as it does).
    The prefix cache holds the skill sets' shared prompts and, with `earlier`, every prompt and
    plan of the events released before (the replay's cache at light load, if nothing was
    evicted; the bound assumes only the shared prompts)."""
    traces = load_traces()
    tufs = load_tuf_levels(config.tuf_levels_path)
    skill_sets = _replay_skill_sets(events, traces, config, None)
    profile = config.load_profile()
    engine = SimulatedEngine(profile)
    latency = workload.network_latency_s if config.network_latency_s is None \
        else config.network_latency_s
    start = min(e.time_s for e in burst)
    tasks = []
    for event in burst:
        for spec in event.tasks:
            trace = traces[spec.trace_id]
            skill_set = skill_sets[trace.skill_set]
            budget = skill_set.max_plan_tokens if trace.max_plan_tokens is None \
                else min(skill_set.max_plan_tokens, trace.max_plan_tokens)
            prompt = engine.render_chat(skill_set.render_messages(_instruction(spec, trace)))
            tasks.append(BurstTask(
                f"t{spec.task_id:05d}", tuple(prompt), trace.plan,
                tuple(engine.tokenize(trace.plan)),
                first_segment_tokens(engine, skill_set, trace.plan, budget),
                tufs.get(spec.tuf_level), skill_set.output_regex(), event.time_s - start))
    warm = [(tuple(engine.render_chat(s.render_messages(""))), s.output_regex())
            for s in skill_sets.values()]
    if earlier:  # what the events before it computed: each prompt and its plan
        for event in events:
            if event.time_s >= start:
                continue
            for spec in event.tasks:
                trace = traces[spec.trace_id]
                skill_set = skill_sets[trace.skill_set]
                ids = engine.render_chat(skill_set.render_messages(_instruction(spec, trace)))
                warm.append((tuple(ids + engine.tokenize(trace.plan)), None))
    return BurstEvent(profile, latency, tuple(tasks), tuple(warm))


class _Model:
    """What `simulate` and `search` precompute about an event."""

    def __init__(self, event: BurstEvent) -> None:
        p = event.profile
        if p.grammar_init_s > 0:
            raise ValueError("burst search: the profile has grammar waits, which the search "
                             "does not model; replay schedules with replay_on_engine")
        self.event, self.p, self.bs = event, p, p.kv_block_size
        tasks = event.tasks
        self.n = len(tasks)
        if any(t.first_tokens < 1 or t.first_tokens > len(t.script) for t in tasks):
            raise ValueError("burst search: every task needs a first segment within its script")
        self.length = [len(t.prompt) for t in tasks]
        self.g = [t.first_tokens for t in tasks]
        self.grammar = [p.constrained_seq_s(t.regex) for t in tasks]
        # Whole blocks a prompt may find cached: from the warm prompts, and from another task's
        # tokens (prompt, then script) once that task has computed them.
        cap = [(n - 1) // self.bs for n in self.length]
        self.warm_hits = [min(cap[i], max((common_prefix(t.prompt, w) // self.bs
                                           for w, _ in event.warm), default=0))
                          for i, t in enumerate(tasks)]
        self.shared = [[common_prefix(a.prompt, b.prompt + b.script) if i != j else 0
                        for j, b in enumerate(tasks)] for i, a in enumerate(tasks)]
        self.cap = cap
        self.utility = [t.tuf.utility for t in tasks]
        self.release = [t.release_s for t in tasks]

    def hits(self, i: int, committed: Sequence[int]) -> int:
        best = self.warm_hits[i]
        for j in range(self.n):
            if committed[j]:
                best = max(best, min(self.shared[i][j] // self.bs, committed[j]))
        return min(best, self.cap[i])

    def step(self, t: float, running: list, queue: list, committed: list, responses: list):
        """One engine step (engine.py `step`), in place. `running`: [task, computed, tokens,
        generated, prefilling] lists in admission order; `queue`: tasks added, not admitted."""
        p, budget = self.p, self.p.max_num_batched_tokens
        chunks = []
        for seq in running:
            chunk = min(seq[2] - seq[1], budget)
            budget -= chunk
            chunks.append(chunk)
        while queue and budget > 0 and len(running) < self.event.max_num_seqs:
            i = queue.pop(0)
            computed = self.hits(i, committed) * self.bs
            chunk = min(self.length[i] - computed, budget)
            budget -= chunk
            running.append([i, computed, self.length[i], 0, True])
            chunks.append(chunk)
        prefill, batch = 0, []
        for seq, chunk in zip(running, chunks):
            if not chunk:
                continue
            if seq[4]:
                prefill += chunk
            seq[1] += chunk
            seq[4] = seq[1] < seq[2]
            batch.append(seq)
        context = sum(seq[1] for seq in batch)
        t += p.step_s(prefill, len(batch), context)
        t += sum(self.grammar[seq[0]] for seq in batch if not seq[4])
        for seq in batch:
            committed[seq[0]] = max(committed[seq[0]], seq[1] // self.bs)
            if not seq[4]:
                seq[2] += 1
                seq[3] += 1
                if seq[3] == self.g[seq[0]]:
                    responses[seq[0]] = t - self.release[seq[0]] + self.event.latency_s
        running[:] = [seq for seq in running if responses[seq[0]] is None]
        return t

    def earliest(self, t: float, running: list, waiting: Sequence[int]) -> dict[int, float]:
        """A floor of each open task's response: its own remaining prompt and steps alone."""
        p = self.p
        out = {}
        for i, computed, tokens, generated, prefilling in running:
            left = tokens - computed if prefilling else 0
            steps = (math.ceil(left / p.max_num_batched_tokens) - 1 if left else 0) \
                + self.g[i] - generated
            out[i] = t + p.prefill_per_token_s * left + p.prefill_fixed_s * (left > 0) \
                + steps * p.decode_step_s(1, computed) + self.event.latency_s - self.release[i]
        for i in waiting:
            left = max(1, self.length[i] - self.bs * max(
                [self.warm_hits[i]] + [min(self.shared[i][j] // self.bs, self.cap[i])
                                      for j in range(self.n) if j != i]))
            out[i] = max(t, self.release[i]) + p.prefill_per_token_s * left + p.prefill_fixed_s \
                + self.g[i] * p.decode_step_s(1, 0) + self.event.latency_s - self.release[i]
        return out


def _added_now(model: _Model, schedule: Sequence[int], step: int, t: float,
               pending: list[int], idle: bool) -> tuple[list[int], float]:
    """The tasks added before step `step`: those due (their schedule step is this one, or
    past) and released. An idle engine with none of them released waits for the first."""
    due = [i for i in pending if schedule[i] <= step]
    add = [i for i in due if model.release[i] <= t]
    if idle and due and not add:
        t = min(model.release[i] for i in due)
        add = [i for i in due if model.release[i] <= t]
    return add, t


def simulate(event: BurstEvent, schedule: Sequence[int]) -> list[float]:
    """Each task's response (seconds after its release) under `schedule`: task i is added to
    the engine before the event's step number schedule[i] (steps counted from 0), or, if it
    is released later, before the first step after its release. An idle engine skips to the
    next step a task is due at, and waits for the first release among those due if none is
    released (module docstring)."""
    model = _Model(event)
    if len(schedule) != model.n or min(schedule, default=0) < 0:
        raise ValueError("simulate: one step number >= 0 per task")
    responses: list = [None] * model.n
    running: list = []
    queue: list = []
    committed = [0] * model.n
    pending = sorted(range(model.n), key=lambda i: (schedule[i], i))
    t, step = 0.0, 0
    while pending or running or queue:
        idle = not running and not queue
        if idle:
            step = max(step, min(schedule[i] for i in pending))
        add, t = _added_now(model, schedule, step, t, pending, idle)
        for i in add:
            pending.remove(i)
            queue.append(i)
        t = model.step(t, running, queue, committed, responses)
        step += 1
    return responses


@dataclass(frozen=True)
class SearchResult:
    utility: float  # summed over the event's tasks
    responses: tuple[float, ...]
    schedule: tuple[int, ...]  # `simulate`'s argument
    nodes: int
    complete: bool  # False: stopped at the node limit, the best found so far


def search(event: BurstEvent, node_limit: int = 2_000_000) -> SearchResult:
    """The best schedule (module docstring): depth-first over the subsets of released tasks
    added at each step, branch and bound. An idle engine adds a nonempty subset of the released
    tasks, or waits for the next release when none is."""
    model = _Model(event)
    n = model.n
    first = simulate(event, [0] * n)
    best = [sum(u(r) for u, r in zip(model.utility, first)), tuple(first), (0,) * n]
    nodes = 0

    def dfs(t, step, running, queue, left, committed, responses, schedule, fixed):
        nonlocal nodes
        nodes += 1
        if nodes > node_limit:
            return False
        open_ = [seq[0] for seq in running] + queue + left
        if not open_:
            if fixed > best[0] + 1e-12:
                best[:] = [fixed, tuple(responses), tuple(schedule)]
            return True
        floors = model.earliest(t, running, queue + left)
        if fixed + sum(model.utility[i](floors[i]) for i in open_) <= best[0] + 1e-12:
            return True
        ready = [i for i in left if model.release[i] <= t]
        idle = not running and not queue
        if idle and not ready:  # nothing to do until the next release
            later = min(model.release[i] for i in left)
            return dfs(later, step, running, queue, left, committed, responses, schedule, fixed)
        for mask in sorted(range(1 << len(ready)), key=lambda m: -bin(m).count("1")):
            add = [ready[k] for k in range(len(ready)) if mask >> k & 1]
            if idle and not add:
                continue  # waiting idle only delays
            r2, q2 = [list(seq) for seq in running], queue + add
            c2, resp2, sched2 = list(committed), list(responses), list(schedule)
            for i in add:
                sched2[i] = step
            t2 = model.step(t, r2, q2, c2, resp2)
            gained = sum(model.utility[i](resp2[i]) for i in range(n)
                         if resp2[i] is not None and responses[i] is None)
            if not dfs(t2, step + 1, r2, q2, [i for i in left if i not in add], c2, resp2,
                       sched2, fixed + gained):
                return False
        return True

    complete = dfs(0.0, 0, [], [], list(range(n)), [0] * n, [None] * n, [0] * n, 0.0)
    return SearchResult(best[0], best[1], best[2], nodes, complete)


def replay_on_engine(event: BurstEvent, schedule: Sequence[int]) -> list[float]:
    """`simulate`, on the real simulated engine: warmed as the replay warms it, each task added
    as `simulate` adds it, with max_tokens = its first segment (it leaves the batch with it)."""
    model = _Model(event)
    engine = SimulatedEngine(event.profile, max_num_seqs=event.max_num_seqs)
    for k, (ids, regex) in enumerate(event.warm):
        engine.add_request(EngineRequest(f"warm{k}", list(ids), max_tokens=1,
                                         output_regex=regex, scripted_text=" "))
    while engine.has_unfinished_requests():
        engine.step()
    start = engine.now()
    responses: list = [None] * model.n
    emitted = [0] * model.n
    by_id = {t.task_id: i for i, t in enumerate(event.tasks)}
    pending = sorted(range(model.n), key=lambda i: (schedule[i], i))
    step = 0
    while pending or engine.has_unfinished_requests():
        idle = not engine.has_unfinished_requests()
        if idle:
            step = max(step, min(schedule[i] for i in pending))
        add, t = _added_now(model, schedule, step, engine.now() - start, pending, idle)
        engine.advance_idle(start + t)
        for i in add:
            pending.remove(i)
            task = event.tasks[i]
            engine.add_request(EngineRequest(task.task_id, list(task.prompt),
                                             max_tokens=task.first_tokens,
                                             output_regex=task.regex, scripted_text=task.plan))
        for out in engine.step():
            i = by_id[out.request_id]
            emitted[i] += len(out.new_token_ids)
            if emitted[i] == event.tasks[i].first_tokens:
                responses[i] = engine.now() - start - model.release[i] + event.latency_s
        step += 1
    return responses


def relaxed(event: BurstEvent) -> BurstEvent:
    """`event` on an engine that charges nothing per sequence or per context token (nor for
    grammars): its best schedule is at least what any schedule of the searched kind gets with
    suspensions as well (module docstring)."""
    profile = replace(event.profile, decode_per_seq_s=0.0, decode_per_ctx_token_s=0.0,
                      constrained_per_seq_s=0.0, constrained_grammar_s=())
    return replace(event, profile=profile)
