"""What `timelyllm bench --fidelity` takes from the real engine for the simulated one
(bench/fidelity.py): its geometry, its tokenizer, and the tokens it generated for every task;
and how loaded the machine was while it ran.

Why the generated tokens and not only the text: under the skill grammar SmolLM2 writes plans in
tokens that are not the tokenizer's own split of the text (`tk` as `t`, `k`; `356` as `3`, `5`,
`6`), so the plan text re-tokenized has 10-15 % fewer tokens than the engine generated, and each
generated token is one engine step. The simulated engine must generate the same tokens.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.engines import EnginePool, build_engine
from timelyllm_ros.core.engine.base import EngineAdapter
from timelyllm_ros.core.engine.cost_model import EngineProfile


@dataclass(frozen=True)
class RealGeometry:
    """What the simulated engine must copy from the real one: its KV cache (blocks and block
    size), its token budget per step, its context length and its slot count."""

    kv_total_blocks: int
    kv_block_size: int
    max_num_batched_tokens: int
    max_model_len: int
    max_num_seqs: int | None

    @classmethod
    def of(cls, engine: EngineAdapter) -> "RealGeometry":
        kv = engine.kv_usage()
        return cls(int(kv.total_blocks), int(kv.block_size), int(engine.max_num_batched_tokens()),
                   int(engine.max_model_len()), engine.capabilities().max_num_seqs)

    def apply(self, profile: EngineProfile) -> EngineProfile:
        return dataclasses.replace(profile, kv_total_blocks=self.kv_total_blocks,
                                   kv_block_size=self.kv_block_size,
                                   max_num_batched_tokens=self.max_num_batched_tokens,
                                   max_model_len=self.max_model_len)


class ModelTokenizer:
    """The model's tokenizer for the simulated engine (its `tokenize`, `decode` and, through
    `use_in`, its `render_chat`), with the chat template, as `VllmEngine` tokenizes. Texts given
    to `remember` (a real run's plans with the tokens it generated, and each of their tails at a
    token boundary) tokenize to those tokens."""

    def __init__(self, hf_tokenizer: Any):
        self._tok = hf_tokenizer
        self._known: dict[str, list[int]] = {}

    @classmethod
    def load(cls, model_dir: str | Path) -> "ModelTokenizer":
        from transformers import AutoTokenizer
        return cls(AutoTokenizer.from_pretrained(str(model_dir)))

    def fresh(self) -> "ModelTokenizer":
        """The same tokenizer, remembering nothing."""
        return ModelTokenizer(self._tok)

    def remember(self, tokens: Sequence[tuple[int, str]]) -> None:
        """A generated sequence as (token id, its text) pairs: its text and every tail of it
        that starts at a token tokenize to those tokens from then on."""
        ids = [t for t, _ in tokens]
        texts = [s for _, s in tokens]
        for i in range(len(tokens)):
            tail = "".join(texts[i:])
            if tail:
                self._known.setdefault(tail, ids[i:])

    def tokenize(self, text: str) -> list[int]:
        known = self._known.get(text)
        if known is not None:
            return list(known)
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=True,
                                clean_up_tokenization_spaces=False)

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        text = self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self._tok.encode(text, add_special_tokens=False))

    def use_in(self, engine: Any) -> Any:
        """`engine` (a simulated engine with no request yet) tokenizing with this tokenizer."""
        engine.tokenizer = self
        engine.render_chat = self.render_chat
        return engine


def plan_tokens(outputs: Sequence[tuple[int, str]], plan: str) -> list[tuple[int, str]] | None:
    """The tokens of `plan` among a task's engine outputs in order ((id, text) pairs of every
    run of it): each output whose text continues the plan where the previous one ended. An
    output that does not (a token vLLM hands out again on a resume, `held` in vllm_sessions.py)
    is left out. None if the kept tokens do not spell the plan exactly."""
    kept: list[tuple[int, str]] = []
    pos = 0
    for token, text in outputs:
        if text and plan.startswith(text, pos):
            kept.append((token, text))
            pos += len(text)
        elif not text and pos == len(plan) and kept:
            kept.append((token, text))  # the end of sequence, after the whole plan
    return kept if pos == len(plan) else None


# Batch sizes grouped for the step-time comparison: (label, smallest, largest).
BATCH_BUCKETS = (("1", 1, 1), ("2-3", 2, 3), ("4-7", 4, 7), ("8-15", 8, 15), ("16+", 16, 1 << 30))


class StepRecorder:
    """Wraps an engine's `step` to keep every task's outputs ((token id, text) pairs by task
    id; engine request ids are `<task id>#<n>`, bench.replay and the scheduler's) and every
    step's duration (`last_step_timing`: measured on the real engine, modelled on the simulated
    one) with its batch size."""

    def __init__(self) -> None:
        self.outputs: dict[str, list[tuple[int, str]]] = {}
        self.steps: list[tuple[float, int]] = []

    def wrap(self, engine: EngineAdapter) -> EngineAdapter:
        step = engine.step

        def recorded_step() -> list:
            outs = step()
            if outs:
                timing = engine.last_step_timing()
                self.steps.append((float(timing.duration_s), int(timing.batch_size)))
            for out in outs:
                if out.request_id.startswith("__"):  # warm-up, profiling
                    continue
                task = out.request_id.split("#", 1)[0]
                got = self.outputs.setdefault(task, [])
                ids = list(out.new_token_ids)
                if len(ids) == 1:
                    got.append((ids[0], out.new_text))
                else:  # a step that produced several tokens: one text for all of them
                    got.extend((t, out.new_text if i == len(ids) - 1 else "")
                               for i, t in enumerate(ids))
            return outs

        engine.step = recorded_step  # type: ignore[method-assign]
        return engine

    def take(self) -> dict[str, list[tuple[int, str]]]:
        """The outputs recorded so far (and forget them)."""
        outputs, self.outputs = self.outputs, {}
        return outputs

    def take_steps(self) -> dict[str, dict[str, float]]:
        """The steps recorded so far by batch bucket: count, fastest and median seconds (and
        forget them)."""
        steps, self.steps = self.steps, []
        out = {}
        for label, lo, hi in BATCH_BUCKETS:
            durations = sorted(d for d, b in steps if lo <= b <= hi)
            if durations:
                out[label] = {"steps": len(durations), "min_s": durations[0],
                              "median_s": durations[len(durations) // 2]}
        return out


class RecordingPool(EnginePool):
    """An EnginePool whose engines record every task's generated tokens (`recorder`) and that
    remembers the geometry of the first engine it builds (`build`: the builder, default
    bench.engines.build_engine)."""

    def __init__(self, config: BenchConfig, build: Callable[..., EngineAdapter] | None = None):
        self._inner = build or build_engine
        super().__init__(config, build=self._build_and_record)
        self.geometry: RealGeometry | None = None
        self.recorder = StepRecorder()

    def _build_and_record(self, config: BenchConfig, **kw: Any) -> EngineAdapter:
        engine = self._inner(config, **kw)
        if self.geometry is None:
            self.geometry = RealGeometry.of(engine)
        return self.recorder.wrap(engine)


@dataclass
class MachineLoad:
    """How busy the machine was over an interval: the load average at its end and the share of
    it in which runnable tasks waited for a CPU (Linux PSI `cpu some`; NaN where unknown)."""

    loadavg: tuple[float, float, float]
    cpu_waiting_share: float = float("nan")
    cpus: int | None = field(default_factory=os.cpu_count)


class LoadMeter:
    """Measures `MachineLoad` over an interval: `start()`, then `stop()`."""

    PSI = Path("/proc/pressure/cpu")

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._psi0 = self._psi_total_us()

    @classmethod
    def _psi_total_us(cls) -> float | None:
        try:
            first = cls.PSI.read_text().splitlines()[0]
            return float(dict(kv.split("=") for kv in first.split()[1:])["total"])
        except (OSError, IndexError, KeyError, ValueError):
            return None

    def stop(self) -> MachineLoad:
        elapsed_us = (time.monotonic() - self._t0) * 1e6
        psi = self._psi_total_us()
        share = float("nan")
        if psi is not None and self._psi0 is not None and elapsed_us > 0:
            share = (psi - self._psi0) / elapsed_us
        return MachineLoad(tuple(round(x, 2) for x in os.getloadavg()), share)


def task_plans(outputs: Mapping[str, Sequence[tuple[int, str]]],
               plans: Mapping[str, str]) -> tuple[dict[str, list[tuple[int, str]]], list[str]]:
    """Per task, the tokens that spell its plan (`plan_tokens`), and the tasks where they do not
    (their plans are then tokenized by the tokenizer, as a fallback)."""
    found, missed = {}, []
    for task, plan in plans.items():
        tokens = plan_tokens(outputs.get(task, ()), plan)
        if tokens is None:
            missed.append(task)
        else:
            found[task] = tokens
    return found, sorted(missed)


def format_steps(steps: Mapping[str, Mapping[str, Any]]) -> str:
    """Per policy and batch bucket, the real runs' median step [fastest] against the simulated
    run's median, in ms (steps that produced output)."""
    lines = ["engine step (ms) by running batch: real runs' median [fastest] (steps) against the "
             "simulated run's median"]
    for policy, by in steps.items():
        for label, _, _ in BATCH_BUCKETS:
            real = [run.get(label) for run in by.get("real", [])]
            sim = by.get("sim", {}).get(label)
            if sim is None and not any(real):
                continue
            cells = "  ".join(f"{r['median_s'] * 1e3:7.1f} [{r['min_s'] * 1e3:5.1f}] "
                              f"({r['steps']:4d})" if r else f"{'-':>22}" for r in real)
            sim_cell = f"{sim['median_s'] * 1e3:7.1f} ({sim['steps']:4d})" if sim else "-"
            lines.append(f"  {policy:<14} batch {label:<5} {cells}  sim {sim_cell}")
    return "\n".join(lines)


# ---- `python -m timelyllm_ros.bench.fidelity_engines`: the grammar cost per skill set ----------

def _counts(values: Any) -> str:
    """`3 x 1, 2 x 0`: how often each value occurs, most frequent first."""
    from collections import Counter
    return ", ".join(f"{n} x {v}" for v, n in Counter(values).most_common())


def grammar_key(regex: str) -> str:
    """The substring that names a skill set's grammar in `constrained_grammar_s`: the start of
    its regex (a resumed generation's regex contains the whole of it)."""
    return regex[:24]


def measure_constraint_cost(argv: Sequence[str] | None = None) -> int:
    """Measure, per skill set, what its grammar costs a sequence per step on the real engine
    and how long a request waits for its grammar (core/engine/constraint_cost.py), and print
    the profile lines."""
    import argparse
    from dataclasses import asdict

    from timelyllm_ros.core.engine.constraint_cost import measure_grammar_wait, measure_skill_set
    from timelyllm_ros.core.engine.factory import EngineSpec
    from timelyllm_ros.core.engine.factory import build_engine as build_from_spec
    from timelyllm_ros.core.engine.profiling import cpu_pressure, machine_description
    from timelyllm_ros.core.engine.vllm_engine_config import VllmEngineConfig
    from timelyllm_ros.core.skills.skillset import load_skillsets
    from timelyllm_ros.core.tuf import default_config_dir
    from timelyllm_ros.lrtrace.traces import load_traces

    p = argparse.ArgumentParser(prog="python -m timelyllm_ros.bench.fidelity_engines",
                                description=measure_constraint_cost.__doc__)
    p.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    p.add_argument("--skill-sets", default="drone,arm")
    p.add_argument("--repeats", type=int, default=5, help="mask fills per grammar state")
    p.add_argument("--wait-repeats", type=int, default=5,
                   help="samples per trace prompt of the grammar wait (grammar_init_s)")
    p.add_argument("--only-wait", action="store_true",
                   help="measure only the grammar wait, not the cost per step")
    args = p.parse_args(argv)
    started, meter = time.monotonic(), LoadMeter()
    import xgrammar as xgr
    from transformers import AutoConfig, AutoTokenizer

    vocab = int(AutoConfig.from_pretrained(args.model).vocab_size)
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(
        AutoTokenizer.from_pretrained(args.model), vocab_size=vocab))
    engine = build_from_spec(EngineSpec(kind="vllm",
                                        vllm=asdict(VllmEngineConfig(model=args.model))))
    sets = load_skillsets(default_config_dir() / "skillsets")
    traces = load_traces()
    results = []
    waits: list[float] = []
    for name in args.skill_sets.split(","):
        skill_set = sets[name]
        prompts = [engine.render_chat(skill_set.render_messages(t.instruction, ""))
                   for t in traces.values() if t.skill_set == name]
        regex = skill_set.output_regex()
        wait = measure_grammar_wait(engine, prompts, regex, repeats=args.wait_repeats)
        waits.extend(wait.idle_s)
        print(f"{name}: grammar wait, idle engine: median {wait.median_idle_s * 1e3:.2f} ms, "
              f"min {min(wait.idle_s) * 1e3:.2f} ms over {len(wait.idle_s)} requests (without "
              f"a grammar: median {sorted(wait.plain_idle_s)[len(wait.plain_idle_s) // 2] * 1e3:.2f}"
              f" ms); busy engine, steps missed: {_counts(wait.busy_missed)} (without a grammar: "
              f"{_counts(wait.plain_busy_missed)}); {len(wait.together_missed[0])} added at once, "
              f"steps each missed: {_counts(tuple(g) for g in wait.together_missed)}", flush=True)
        if args.only_wait:
            continue
        cost = measure_skill_set(engine, compiler.compile_regex, vocab, name, prompts, regex,
                                 skill_set.max_plan_tokens, args.repeats)
        results.append((grammar_key(regex), cost))
        print(f"{name}: {cost.plans} plans, {cost.states} grammar states; per sequence and "
              f"step: mask+matcher {cost.mask_and_matcher_s * 1e3:.3f} ms (slowest state "
              f"{cost.slowest_state_s * 1e3:.1f} ms), logits {cost.logits_s * 1e3:.3f} ms, "
              f"session {cost.session_s * 1e3:.3f} ms: {cost.per_seq_s * 1e3:.3f} ms", flush=True)
    load = meter.stop()
    if results:
        print("constrained_grammar_s:")
    for key, cost in results:
        print(f"  {key!r}: {cost.per_seq_s!r}  # {cost.skill_set}")
    waits.sort()
    # The fastest, as `timelyllm profile` keeps the fastest sample: other processes only add
    # to the hand-off to the grammar thread.
    print(f"grammar_init_s: {waits[0]!r}  # fastest of {len(waits)} requests on the idle "
          f"engine (median {waits[len(waits) // 2]!r})")
    print(f"{machine_description()}; load {load.loadavg}, CPU waiting "
          f"{load.cpu_waiting_share * 100:.0f} % (PSI avg300 {cpu_pressure()}%); "
          f"{time.monotonic() - started:.0f} s")
    import os
    os._exit(0)  # vLLM's engine threads would hold the interpreter


if __name__ == "__main__":
    raise SystemExit(measure_constraint_cost())
