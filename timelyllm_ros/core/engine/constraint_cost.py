"""What decoding under a skill grammar costs the real engine per sequence and step, beyond the
profile (`EngineProfile.constrained_grammar_s`).

`timelyllm profile` measures plain requests: no grammar, no sessions (profiling.py). The planner
decodes every plan under its skill set's grammar (vLLM structured outputs, xgrammar) on a vLLM
streaming-input session that parks at every candidate statement end and is sent its next chunk
(vllm_sessions.py). For every sequence that samples, a step then also does:

- mask: fill the sequence's row of the token bitmask (`StructuredOutputManager.grammar_bitmask`
  -> xgrammar `fill_next_token_bitmask`), whose cost depends on the grammar state: a few
  microseconds at most states of the drone grammar, tens of milliseconds inside a quoted
  argument (its bounded repetitions make many tokens context-dependent);
- matcher: advance the sequence's matcher by the sampled token (`accept_tokens`);
- logits: mask its logits (`apply_grammar_bitmask`);
- session: park a chunk that stopped (`Scheduler._handle_stopped_request`) and send the next one
  (`VllmInternals.send_chunk`), on the steps where a statement may end.

How it is measured (`measure_skill_set`), apart from any replay:

1. The real engine, configured as the planner runs it (sessions on), generates one plan for
   each trace instruction of the skill set, all in one batch, with the skill set's grammar and
   its own prompt, as the scheduler renders it (greedy decoding: the plans the planner gets).
   The logits and session functions are timed in place (`timers`): seconds per sequence and
   step, over the steps where every plan sampled a token.
2. The mask and the matcher are timed on those plans' tokens outside the engine (`walk`): an
   xgrammar matcher compiled as vLLM compiles it is walked token by token, and at each state the
   mask is filled `repeats` times; the fastest counts (other processes only add time, as in
   profiling.py). The mean over every state of every plan is the figure per sequence and step.

The sum is the seconds per sequence and step the simulated engine charges for that grammar.
Run it with `python -m timelyllm_ros.bench.fidelity_engines` (the trace instructions come from
LRTrace, which core does not import).
"""

from __future__ import annotations

import importlib
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from timelyllm_ros.core.engine.base import EngineRequest

# (module, class or None for a module function, function, which part of the cost it is)
TIMED = (
    ("vllm.v1.structured_output", "StructuredOutputManager", "grammar_bitmask", "mask"),
    ("vllm.v1.structured_output", "StructuredOutputManager", "accept_tokens", "matcher"),
    ("vllm.v1.worker.gpu_model_runner", None, "apply_grammar_bitmask", "logits"),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "_handle_stopped_request", "session"),
    ("timelyllm_ros.core.engine.vllm_internals", "VllmInternals", "send_chunk", "session"),
)
KINDS = ("mask", "matcher", "logits", "session")


@contextmanager
def timers(targets: Sequence[tuple[str, str | None, str, str]] = TIMED
           ) -> Iterator[dict[str, float]]:
    """Wrap each target with a timer that adds its seconds to the yielded dict under its kind;
    the originals are put back on exit."""
    spent: dict[str, float] = defaultdict(float)
    restore: list[tuple[Any, str, Any]] = []

    def timed(fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[kind] += time.perf_counter() - start
        return wrapper

    try:
        for module, owner, name, kind in targets:
            holder = importlib.import_module(module)
            if owner is not None:
                holder = getattr(holder, owner)
            original = holder.__dict__[name] if owner is not None else getattr(holder, name)
            restore.append((holder, name, original))
            setattr(holder, name, timed(getattr(holder, name), kind))
        yield spent
    finally:
        for holder, name, original in reversed(restore):
            setattr(holder, name, original)


@dataclass
class Generation:
    """Plans generated together in one batch: each plan's tokens, and the seconds each timed
    kind took over the `steps` steps in which every plan sampled one token."""

    plans: list[list[int]]
    steps: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))

    def per_seq_step(self, kind: str) -> float:
        n = self.steps * len(self.plans)
        return self.seconds[kind] / n if n else float("nan")


def generate(engine: Any, prompts: Sequence[list[int]], regex: str, max_tokens: int, *,
             targets: Sequence[tuple[str, str | None, str, str]] = TIMED) -> Generation:
    """Generate one plan per prompt, all in one batch under `regex`, timing `targets` in the
    steps where every plan sampled exactly one token."""
    ids = [f"__constraint__{i}" for i in range(len(prompts))]
    gen = Generation([[] for _ in prompts])
    index = {rid: i for i, rid in enumerate(ids)}
    live = set(ids)
    with timers(targets) as spent:
        for rid, prompt in zip(ids, prompts):
            engine.add_request(EngineRequest(rid, list(prompt), max_tokens, output_regex=regex))
        while engine.has_unfinished_requests() and live:
            spent.clear()
            outputs = [o for o in engine.step() if o.request_id in index]
            got = {o.request_id: len(o.new_token_ids) for o in outputs}
            if all(gen.plans[index[r]] for r in ids) and all(got.get(r) == 1 for r in ids):
                gen.steps += 1
                for kind in KINDS:
                    gen.seconds[kind] += spent.get(kind, 0.0)
            for out in outputs:
                gen.plans[index[out.request_id]].extend(out.new_token_ids)
                if out.finished:
                    live.discard(out.request_id)
            if len(live) < len(ids):
                break  # a plan ended: the batch is smaller from here on; time no more steps
        spent.clear()
    while live and engine.has_unfinished_requests():  # the rest of the plans, untimed
        for out in engine.step():
            if out.request_id in live:
                gen.plans[index[out.request_id]].extend(out.new_token_ids)
                if out.finished:
                    live.discard(out.request_id)
    for rid in ids:
        engine.abort_request(rid)
    return gen


def walk(compiled_grammar: Any, plans: Sequence[Sequence[int]], vocab_size: int,
         repeats: int = 5) -> list[float]:
    """Seconds per grammar state along `plans`: the fastest of `repeats` mask fills, plus the
    matcher's advance by the plan's token (xgrammar, as vLLM's backend calls it)."""
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    out = []
    for plan in plans:
        matcher = xgr.GrammarMatcher(compiled_grammar)
        for token in plan:
            if matcher.is_terminated():
                break
            fill = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                matcher.fill_next_token_bitmask(bitmask)
                fill = min(fill, time.perf_counter() - start)
            start = time.perf_counter()
            accepted = matcher.accept_token(token)
            out.append(fill + time.perf_counter() - start)
            if not accepted:
                break
    return out


@dataclass(frozen=True)
class ConstraintCost:
    """One grammar's cost per sequence and step, and its parts (seconds)."""

    skill_set: str
    per_seq_s: float
    mask_and_matcher_s: float   # mean over the walked states
    logits_s: float             # in the engine, per sequence and step
    session_s: float
    states: int
    plans: int
    slowest_state_s: float


def measure_skill_set(engine: Any, compile_regex: Callable[[str], Any], vocab_size: int,
                      skill_set: str, prompts: Sequence[list[int]], regex: str,
                      max_tokens: int, repeats: int = 5) -> ConstraintCost:
    """Steps 1 and 2 of the module docstring for one skill set."""
    gen = generate(engine, prompts, regex, max_tokens)
    states = walk(compile_regex(regex), gen.plans, vocab_size, repeats)
    if not states or not gen.steps:
        raise RuntimeError(f"{skill_set}: no decode step to time (plans of "
                           f"{[len(p) for p in gen.plans]} tokens)")
    grammar = sum(states) / len(states)
    logits, session = gen.per_seq_step("logits"), gen.per_seq_step("session")
    return ConstraintCost(skill_set, grammar + logits + session, grammar, logits, session,
                          len(states), len(gen.plans), max(states))


# ---- the wait for a request's grammar ----------------------------------------------------------
#
# vLLM V1 builds a structured-output request's grammar matcher on a thread pool
# (`StructuredOutputManager.grammar_init`), even when the compiled grammar is cached, and its
# scheduler passes over a waiting request whose grammar is not ready yet
# (WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR). So a constrained request added to a busy engine misses
# the step that starts right after it was added (the planner adds it between two steps), and
# one added to an idle engine waits while the engine spins empty steps. A plain request does
# neither. `measure_grammar_wait` measures it; the simulated engine models it with
# `EngineProfile.grammar_init_s` (sim/requests.py).


@dataclass(frozen=True)
class GrammarWait:
    """What the grammar wait costs on one engine.

    idle_s: per request added alone to an idle engine, seconds from `add_request` to the start
    of the step that computed its prompt. plain_idle_s: the same without a grammar.
    busy_missed: per request added between two steps of a busy engine, the steps that ran
    without it before the one that computed its prompt; plain_busy_missed: without a grammar.
    together_missed: per group of requests added at once to an idle engine, each one's
    non-empty steps before the one that computed its prompt (in the order added)."""

    idle_s: list[float]
    plain_idle_s: list[float]
    busy_missed: list[int]
    plain_busy_missed: list[int]
    together_missed: list[list[int]]

    @property
    def median_idle_s(self) -> float:
        ordered = sorted(self.idle_s)
        return ordered[len(ordered) // 2] if ordered else float("nan")


def _first_token(engine: Any, request_ids: Sequence[str], clock: Callable[[], float]
                 ) -> dict[str, tuple[float, int]]:
    """Step until each of `request_ids` produced a token: per request, the start time of that
    step and the number of non-empty steps (steps with any output) before it."""
    found: dict[str, tuple[float, int]] = {}
    busy_before = 0
    while len(found) < len(request_ids):
        if not engine.has_unfinished_requests():
            raise RuntimeError(f"requests {sorted(set(request_ids) - set(found))} ended "
                               "without a token")
        outputs = engine.step()
        # When the step began computing (the simulated engine's step may first wait for a
        # grammar inside it; the real engine spins empty steps instead).
        start = clock() - float(engine.last_step_timing().duration_s)
        for out in outputs:
            if out.request_id in request_ids and out.new_token_ids \
                    and out.request_id not in found:
                found[out.request_id] = (start, busy_before)
        if outputs:
            busy_before += 1
    return found


def _drain(engine: Any, request_ids: Sequence[str]) -> None:
    for rid in request_ids:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()


def measure_grammar_wait(engine: Any, prompts: Sequence[list[int]], regex: str, *,
                         repeats: int = 5, together: int = 3, gap_s: float = 0.2,
                         busy_prompt: Sequence[int] | None = None,
                         clock: Callable[[], float] = time.perf_counter,
                         sleep: Callable[[float], None] = time.sleep) -> GrammarWait:
    """Measure `GrammarWait` on `engine` (otherwise idle; configured as the planner runs it),
    with each prompt `repeats` times under `regex` and without it. Each request generates a
    few tokens and is aborted. `gap_s`: idle time before each idle sample (the engine has been
    idle a while when a task arrives). The busy engine decodes one plain request of
    `busy_prompt` (default: the first prompt)."""
    if not prompts:
        raise ValueError("measure_grammar_wait: no prompts")
    background = list(busy_prompt if busy_prompt is not None else prompts[0])
    n = 0

    def rid(kind: str) -> str:
        nonlocal n
        n += 1
        return f"__grammar_wait__{kind}{n}"

    def add(request_id: str, prompt: Sequence[int], constrained: bool) -> None:
        # (A simulated engine generates the script; a real one ignores it.)
        engine.add_request(EngineRequest(request_id, list(prompt), 16,
                                         output_regex=regex if constrained else None,
                                         scripted_text=" x" * 16))

    for prompt in prompts:  # warm: the grammar compiled, every prompt's prefix cached
        warm = rid("warm")
        add(warm, prompt, True)
        _first_token(engine, [warm], clock)
        _drain(engine, [warm])
    idle: dict[bool, list[float]] = {True: [], False: []}
    busy: dict[bool, list[int]] = {True: [], False: []}
    groups: list[list[int]] = []
    for _ in range(repeats):
        for prompt in prompts:
            for constrained in (True, False):
                sleep(gap_s)
                one = rid("idle")
                added = clock()
                add(one, prompt, constrained)
                idle[constrained].append(_first_token(engine, [one], clock)[one][0] - added)
                _drain(engine, [one])
                runner = rid("busy")
                add(runner, background, False)
                _first_token(engine, [runner], clock)
                engine.step()
                one = rid("busy")
                add(one, prompt, constrained)
                busy[constrained].append(_first_token(engine, [one], clock)[one][1])
                _drain(engine, [runner, one])
        sleep(gap_s)
        ids = [rid("together") for _ in range(together)]
        for i, request_id in enumerate(ids):
            add(request_id, prompts[i % len(prompts)], True)
        found = _first_token(engine, ids, clock)
        groups.append([found[r][1] for r in ids])
        _drain(engine, ids)
    return GrammarWait(idle[True], idle[False], busy[True], busy[False], groups)
