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
