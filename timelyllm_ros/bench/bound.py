"""An upper bound of every policy's utility on a run: the burst bound, with the alone bound.

Two bounds, both reported (`add_bound`: `doc["bound"]` is the burst bound, `doc["bound_alone"]`
the alone bound). The **alone bound** serves each task as if it were alone on the engine. The
**burst bound** (bench/bound_burst.py, its proof sketch) is tighter where one event releases
several tasks at once: no schedule serves them all alone, since their prompts share the engine's
steps; there the k-th first segment of the event cannot be out before the k smallest prompts
are computed, and the bound assigns the event's tasks to those completion slots as well as any
schedule could (an assignment problem); for small events it also groups the tasks by the step
that completes their prompts, and searches the steps at which the prompts complete with the cost
between those groups counted (bench/bound_sequenced.py), and takes the smallest. Events released
while an earlier one may still be answering are bounded together as well, where that is lower
(`_overlapping`). A task the scheduler may refuse (its TUF reaches 0: the bench sheds a first
segment whose utility can no longer be positive, valued at its TUF then, <= 0) counts at most 0
and takes no step when refusing it is better for the others; a task whose bound response comes
after its cut-off counts 0, at its cut-off. An event with one task keeps its alone bound; where an
event's tasks have distinct prompts the burst bound is never above the alone bound (with copies
of one prompt in an event it can be: a copy may find the other's blocks in the prefix cache,
which the alone bound does not count). `BoundTask.response_time_s` and `utility` are the burst
bound's, `alone_response_time_s` and `alone_utility` the alone bound's.

The alone bound: for each task of the event list, its first segment is served on an idle, warm
engine:

    response = network latency
             + prefill of its uncached prompt tokens (the skill set's shared prompt prefix is in the
               prefix cache, as on a warm engine; the prompt's last token is always computed)
             + decode of its first segment's tokens at batch size 1

with the step costs of the run's engine profile (`EngineProfile`: the simulated engine's own cost
model, chunked by its token budget exactly as the simulated engine charges a lone request), and
the task's utility is its TUF of that response time. The first segment is what the skill
set's language cuts from the trace's plan: tokens up to the first complete statement (the whole
plan if it has one statement, cut at the task's token budget). No scheduling can give a task its
first segment sooner, except by the prefix cache holding more of its prompt than the shared
prefix (a task whose identical prompt ran before), which saves a few ms of prefill; that can put
a task's response a few ms under its bound, and never moves utility except within a few ms of
an ERT.

The prompts are the replay's (the same padding, `bench.replay`), tokenized as the simulated
engine does. On the real engine (`--engine vllm`) the bound uses the profile given with
`--profile` (default: the simulated RTX 4090) and the simulated tokenizer, so it is only an
estimate there.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from timelyllm_ros.bench.bound_burst import (GROUPED_MAX_TASKS, best_assignment,
                                             completion_floors_s, grouped_responses,
                                             prefill_floors)
from timelyllm_ros.bench.bound_sequenced import SEQUENCED_MAX_TASKS, sequenced_responses
from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.metrics import compute_metrics
# The replay's own skill sets (padding included), so that the bound sees the prompts it served.
from timelyllm_ros.bench.replay import _replay_skill_sets
from timelyllm_ros.bench.results import task_type
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.skills.skillset import SkillSet
from timelyllm_ros.core.tuf import TufLevels, load_tuf_levels
from timelyllm_ros.lrtrace.traces import Trace, load_traces
from timelyllm_ros.lrtrace.workload import Event, Workload

NAN = float("nan")


@dataclass(frozen=True)
class BoundTask:
    """One task's first segment served alone (TaskResult-like for `bench.metrics`)."""

    task_id: str
    task_type: str
    ert_s: float
    prompt_tokens: int
    uncached_tokens: int
    first_segment_tokens: int
    response_time_s: float
    utility: float
    waiting_time_s: float = NAN
    # The alone bound's figures; `response_time_s` and `utility` are the burst bound's.
    alone_response_time_s: float = NAN
    alone_utility: float = NAN


def alone_latency_s(profile: EngineProfile, prompt_tokens: int, cached_tokens: int,
                    output_tokens: int) -> float:
    """Engine time from admission until `output_tokens` tokens of a lone request are out, as the
    simulated engine charges it: the uncached prompt in chunks of the step's token budget (every
    step also pays the decode term of its one sequence), the first token with the last chunk,
    then one decode step per further token at batch size 1."""
    if output_tokens < 1:
        raise ValueError(f"output_tokens must be >= 1, got {output_tokens}")
    cached = max(0, min(cached_tokens, prompt_tokens - 1))
    computed, left = cached, prompt_tokens - cached
    budget = profile.max_num_batched_tokens
    total = 0.0
    while left > 0:
        chunk = min(left, budget)
        computed += chunk
        left -= chunk
        total += profile.step_s(chunk, 1, computed)
    for _ in range(output_tokens - 1):
        computed += 1
        total += profile.decode_step_s(1, computed)
    return total


def first_segment_tokens(engine: SimulatedEngine, skill_set: SkillSet, plan: str,
                         max_tokens: int) -> int:
    """Tokens the simulated engine emits before the scheduler can dispatch the plan's first
    segment: up to the first complete statement of the skill set's language, or the whole plan
    (cut at `max_tokens`) when it ends first. 0 if the plan yields no segment at all."""
    ids = engine.tokenize(plan)[:max(0, max_tokens)]
    if not ids:
        return 0
    language = skill_set.language
    ends, text = [], ""
    for token in ids:
        text += engine.decode([token])
        ends.append(len(text))
    # The boundary on the whole text, checked on the prefix that first contains it (a language
    # that needs to see past a boundary to find it would disagree; then walk token by token).
    end = language.next_boundary(text, 0)
    if end is not None:
        k = next((i for i, e in enumerate(ends) if e >= end), None)
        if k is not None and language.next_boundary(text[:ends[k]], 0) == end:
            return k + 1
        for i, e in enumerate(ends):
            if language.next_boundary(text[:e], 0) is not None:
                return i + 1
    tail = language.final_segment_end(text, 0)
    return len(ids) if tail is not None and text[:tail].strip() else 0


def upper_bound(events: Sequence[Event], workload: Workload, config: BenchConfig | None = None,
                *, traces: Mapping[int, Trace] | None = None,
                tuf_levels: TufLevels | None = None,
                skill_sets: Mapping[str, SkillSet] | None = None,
                **_run_kwargs: Any) -> list[BoundTask]:
    """The bound of every task of `events`: the burst bound (`response_time_s`, `utility`) with
    the alone bound beside it (`alone_response_time_s`, `alone_utility`); module docstring.
    Takes the same arguments as `bench.replay.run_policy` (the scenario's traces, TUF levels and
    skill sets); the others (execution model, call durations) do not change a first response
    and are ignored."""
    config = config or BenchConfig()
    traces = traces if traces is not None else load_traces()
    tuf_levels = tuf_levels if tuf_levels is not None else load_tuf_levels(config.tuf_levels_path)
    skill_sets = _replay_skill_sets(events, traces, config, skill_sets)
    profile = config.load_profile()
    engine = SimulatedEngine(profile)  # its tokenizer and chat rendering; it never steps
    latency = workload.network_latency_s if config.network_latency_s is None \
        else config.network_latency_s
    shared_prompt: dict[str, list[int]] = {}
    sizes_of: dict[tuple[int, str], tuple[int, int, int]] = {}
    out = []
    releases = []  # (release time, its tasks' bounds, their prompts) of each timed event
    for event in events:
        alone, prompts = [], []
        for spec in event.tasks:
            trace = traces[spec.trace_id]
            skill_set = skill_sets[trace.skill_set]
            instruction = _instruction(spec, trace)
            sizes = sizes_of.get((trace.trace_id, instruction))
            ids = None  # a burst needs every prompt's tokens to see what they share
            if sizes is None or len(event.tasks) > 1:
                ids = engine.render_chat(skill_set.render_messages(instruction))
            if sizes is None:
                sizes = sizes_of[trace.trace_id, instruction] = _sizes(
                    engine, skill_set, trace, ids, shared_prompt)
            prompt, cached, n_first = sizes
            tuf = tuf_levels.get(spec.tuf_level)
            if n_first:
                response = latency + alone_latency_s(profile, prompt, cached, n_first)
                utility = float(tuf.utility(response))
            else:
                response = utility = NAN
            alone.append(BoundTask(
                task_id=f"t{spec.task_id:05d}", task_type=task_type(trace.category, spec.tuf_level),
                ert_s=tuf.ert_s, prompt_tokens=prompt, uncached_tokens=prompt - cached,
                first_segment_tokens=n_first, response_time_s=response, utility=utility,
                alone_response_time_s=response, alone_utility=utility))
            prompts.append((_tokens_of(ids, engine, skill_set, instruction), tuf))
        bounded = _burst(profile, latency, alone, prompts)
        out.extend(bounded)
        if event.after_event is None:  # (a closed-loop event's release is not known here)
            releases.append((event.time_s, bounded, prompts))
    return _overlapping(profile, latency, out, releases)


def _overlapping(profile: EngineProfile, latency_s: float, out: list[BoundTask],
                 releases: list[tuple[float, list[BoundTask], list]]) -> list[BoundTask]:
    """`out` with the events released while an earlier event's tasks may still be answering
    bounded together (the sequenced bound, bench/bound_sequenced.py), where that is lower.

    Each event alone assumes an engine free at its release. A run of events, each released
    before the latest answer the bound allows the events before it, shares the engine's steps
    instead. Bounding such a run as one burst released at its first event's time, each task
    answering no sooner than its own release plus its alone floor and valued at its response
    from its own release, is an upper bound too: it only lets later tasks start earlier. Runs
    of at most SEQUENCED_MAX_TASKS answered tasks; the smaller sum of utility is kept."""
    index: dict[int, int] = {}  # position in `out` by task identity, built when first needed
    runs: list[list] = []
    latest = -math.inf
    for time_s, bounded, prompts in sorted(releases, key=lambda r: r[0]):
        if runs and time_s < latest:
            runs[-1].append((time_s, bounded, prompts))
        else:
            runs.append([(time_s, bounded, prompts)])
            latest = -math.inf
        latest = max([latest] + [time_s + t.response_time_s for t in bounded
                                 if t.first_segment_tokens])
    for run in runs:
        members = [(time_s, task, prompts[j]) for time_s, bounded, prompts in run
                   for j, task in enumerate(bounded) if task.first_segment_tokens]
        if len(run) < 2 or not 2 <= len(members) <= SEQUENCED_MAX_TASKS:
            continue
        start = run[0][0]
        offsets = [time_s - start for time_s, _, _ in members]
        floors, alone = _floors(profile, latency_s, [t for _, t, _ in members],
                                [p for _, _, p in members], offsets)
        utilities = [_from_release(p[1].utility, offset)
                     for offset, (_, _, p) in zip(offsets, members)]
        together, total = sequenced_responses(
            profile, latency_s, floors, [t.prompt_tokens for _, t, _ in members],
            [t.first_segment_tokens for _, t, _ in members], alone, utilities,
            [_sheddable(p[1]) for _, _, p in members])
        if total < sum(t.utility for _, t, _ in members):
            index = index or {id(task): k for k, task in enumerate(out)}
            for offset, (_, task, (_, tuf)), response in zip(offsets, members, together):
                out[index[id(task)]] = _answered(task, tuf, response - offset)
    return out


def _tokens_of(ids: list[int] | None, engine: SimulatedEngine, skill_set: SkillSet,
               instruction: str):
    """The prompt's tokens when asked for: `ids` if rendered already, else rendered then (a
    task alone in its event needs them only if a later event overlaps it)."""
    if ids is not None:
        return lambda: ids
    return functools.cache(lambda: engine.render_chat(skill_set.render_messages(instruction)))


def _from_release(utility, offset_s: float):
    """A TUF of the response from its own release, as a function of the time from a release
    `offset_s` earlier."""
    return lambda t: utility(t - offset_s)


def _burst(profile: EngineProfile, latency_s: float, alone: list[BoundTask],
           prompts: list[tuple[Callable[[], list[int]], Any]]) -> list[BoundTask]:
    """One event's tasks under the burst bound (bench/bound_burst.py): the alone bound when at
    most one of them has a first segment."""
    served = [i for i, t in enumerate(alone) if t.first_segment_tokens]
    if len(served) < 2:
        return [_answered(t, tuf, t.response_time_s) if t.first_segment_tokens else t
                for t, (_, tuf) in zip(alone, prompts)]
    floors, alone_floors = _floors(profile, latency_s, [alone[i] for i in served],
                                   [prompts[i] for i in served])
    slots = completion_floors_s(profile, [alone[i].prompt_tokens for i in served], floors,
                                [alone[i].first_segment_tokens for i in served])
    utilities = [prompts[i][1].utility for i in served]
    sheddable = [_sheddable(prompts[i][1]) for i in served]
    responses = best_assignment(alone_floors, latency_s + slots, utilities, sheddable)
    # Each is an upper bound of the event's summed utility: the smallest is one too.
    prompt_tokens = [alone[i].prompt_tokens for i in served]
    segments = [alone[i].first_segment_tokens for i in served]
    for limit, bound in ((GROUPED_MAX_TASKS, grouped_responses),
                         (SEQUENCED_MAX_TASKS, sequenced_responses)):
        if len(served) <= limit:
            other, other_utility = bound(profile, latency_s, floors, prompt_tokens, segments,
                                         alone_floors, utilities, sheddable)
            if other_utility < _summed(utilities, responses):
                responses = other
    out = list(alone)
    for i, response in zip(served, responses):
        out[i] = _answered(alone[i], prompts[i][1], response)
    return out


def _floors(profile: EngineProfile, latency_s: float, tasks: Sequence[BoundTask],
            prompts: Sequence[tuple[Callable[[], list[int]], Any]],
            offsets_s: Sequence[float] | None = None) -> tuple[list[int], list[float]]:
    """For tasks bounded together: each one's prefill floor (`prefill_floors`: the prompt
    tokens it computes whatever the others leave in the prefix cache) and alone floor (its
    alone response with only that floor computed, from `offsets_s` after the first release;
    a task may hit blocks another prompt computed, but alone it still computes its floor)."""
    floors = prefill_floors([ids() for ids, _ in prompts],
                            [t.prompt_tokens - t.uncached_tokens for t in tasks],
                            profile.kv_block_size)
    offsets_s = offsets_s if offsets_s is not None else [0.0] * len(tasks)
    alone = [offset + latency_s + alone_latency_s(profile, t.prompt_tokens, t.prompt_tokens - m,
                                                  t.first_segment_tokens)
             for offset, t, m in zip(offsets_s, tasks, floors)]
    return floors, alone


def _sheddable(tuf) -> bool:
    """Whether the bench may refuse the task (its TUF reaches 0: the scheduler sheds a first
    segment whose utility can no longer be positive)."""
    return tuf.slope_per_s > 0


def _summed(utilities, responses: Sequence[float]) -> float:
    """Summed utility of `responses`, a refused task's (NaN) counted at 0."""
    return sum(0.0 if math.isnan(r) else u(r) for u, r in zip(utilities, responses))


def _answered(task: BoundTask, tuf, response_s: float) -> BoundTask:
    """`task` under the burst bound answering at `response_s`. NaN, or a response after its
    TUF's cut-off: refused at the cut-off (utility 0, the most a refusal gets; a late answer
    would get less)."""
    if math.isnan(response_s) or (_sheddable(tuf) and response_s > tuf.cutoff_s):
        return replace(task, response_time_s=tuf.cutoff_s, utility=0.0)
    return replace(task, response_time_s=response_s, utility=float(tuf.utility(response_s)))


def _instruction(spec: Any, trace: Trace) -> str:
    """The instruction the planner receives for this task: the trace's, plus the task's own
    context where the event list gives it one (`TaskSpec.instruction_for`)."""
    instruction_for = getattr(spec, "instruction_for", None)
    return instruction_for(trace) if instruction_for is not None else trace.instruction


def _sizes(engine: SimulatedEngine, skill_set: SkillSet, trace: Trace, ids: list[int],
           shared_prompt: dict[str, list[int]]) -> tuple[int, int, int]:
    """(prompt tokens, of them served from the warm prefix cache, first-segment tokens) of the
    prompt `ids`."""
    fixed = shared_prompt.get(skill_set.name)
    if fixed is None:  # what `SegmentScheduler.warm_prefix_cache` prefills at start-up
        fixed = shared_prompt[skill_set.name] = engine.render_chat(skill_set.render_messages(""))
    common = 0
    for a, b in zip(ids, fixed):
        if a != b:
            break
        common += 1
    block = engine.profile.kv_block_size
    cached = min(common, len(ids) - 1) // block * block
    budget = skill_set.max_plan_tokens if trace.max_plan_tokens is None \
        else min(skill_set.max_plan_tokens, trace.max_plan_tokens)
    return len(ids), cached, first_segment_tokens(engine, skill_set, trace.plan, budget)


def bound_block(tasks: Sequence[BoundTask]) -> dict[str, Any]:
    """The bound as the results document reports it: the paper's metrics over the bound's tasks
    (`overall`, `by_type`; no waiting time: the bound has no robots) and its inputs in mean."""
    metrics = compute_metrics(tasks)
    del metrics["scheduling_overhead_ms"]
    n = len(tasks) or 1
    metrics["tasks"] = len(tasks)
    metrics["tasks_without_response"] = sum(1 for t in tasks
                                            if not math.isfinite(t.response_time_s))
    metrics["uncached_prompt_tokens_mean"] = sum(t.uncached_tokens for t in tasks) / n
    metrics["first_segment_tokens_mean"] = sum(t.first_segment_tokens for t in tasks) / n
    return metrics


def fraction_of_bound(utility: float | None, bound_utility: float | None) -> float:
    """A policy's mean utility as a fraction of the bound's (NaN when the bound is not > 0)."""
    if utility is None or bound_utility is None:
        return NAN
    if not (math.isfinite(utility) and math.isfinite(bound_utility)) or bound_utility <= 0:
        return NAN
    return utility / bound_utility


def alone_tasks(tasks: Iterable[BoundTask]) -> list[BoundTask]:
    """The alone bound's tasks: each task's alone figures as its response and utility."""
    return [replace(t, response_time_s=t.alone_response_time_s, utility=t.alone_utility)
            for t in tasks]


def add_bound(doc: dict[str, Any], tasks: Iterable[BoundTask]) -> dict[str, Any]:
    """Put the bound into a results document: `doc["bound"]` (the burst bound) and
    `doc["bound_alone"]` (the alone bound), and each policy's overall
    `utility_fraction_of_bound` and `utility_fraction_of_alone_bound`."""
    tasks = list(tasks)
    doc["bound"] = bound_block(tasks)
    doc["bound_alone"] = bound_block(alone_tasks(tasks))
    bound_u = doc["bound"]["overall"]["utility_mean"]
    alone_u = doc["bound_alone"]["overall"]["utility_mean"]
    for metrics in doc["policies"].values():
        utility = metrics["overall"]["utility_mean"]
        metrics["utility_fraction_of_bound"] = fraction_of_bound(utility, bound_u)
        metrics["utility_fraction_of_alone_bound"] = fraction_of_bound(utility, alone_u)
    return doc
