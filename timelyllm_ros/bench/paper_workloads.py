"""Each seed paper's own kind of workload, as a bench scenario (`timelyllm bench --workload NAME`).

The robot workloads (WID1-3) are TimelyLLM's. Seeds 001-004 were evaluated on other traffic;
each scenario below rebuilds that traffic from the distributions in
`../shared/notes/seed-digests.md` (and, where the digest only names a dataset, the moments the
reproductions in `papers/` already use), so every policy can be compared on it through the
same scheduler and simulated engine:

| scenario | paper | traffic | what the paper measures |
|---|---|---|---|
| `seed001-chat` | MC-SF | chat requests, Poisson arrivals, LMSYS-Chat-1M-like lengths, KV budget of the paper's M = 16,492 tokens | total (mean) end-to-end latency |
| `seed002-rtbe` | BROS | real-time chat (ShareGPT-like, Poisson, TTFT SLO 0.4 s, read sentence by sentence) + closed-loop best-effort batches of 64 | RT TTFT attainment and latency, BE throughput |
| `seed003-gsm8k` | hybrid | 1,319 GSM8K-like requests submitted at once, 200 slots, the paper's LLaMA-65B time model | makespan (total time) |
| `seed004-api` | LAMPS | requests that call tools (INFERCEPT's six API types) and pause for each call | mean end-to-end latency |

A request is one task. Its generated text is synthetic (words, so that the simulated engine's
tokenizer gives the drawn token counts), cut into segments by the skill set's language: a plain
completion (a reply, a batch answer) is one segment with nothing to execute (the tool-call
language without calls), RT chat is sentences (each read at 300 words per minute before
the next is needed), text ending in a `<call:NAME>` for a tool call (tool-call language), whose
duration is drawn with the workload and given to the simulated "robot" (the tool). Every request
carries its exact output length as its own `max_plan_tokens`: the hard upper bound MC-SF's
look-ahead needs, and what a chat API's max_tokens would be with a perfect length predictor (the
papers assume predicted lengths; an oracle keeps the comparison about scheduling).

Simplifications (also in docs/policies.md): tool responses add no tokens to the context (robot
skills return none; INFERCEPT's returned tokens are dropped), the simulated engine's cost model
stands in for each paper's GPU, and one network hop costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.tokenizer import PieceTokenizer
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.sampling import lognormal_by_mean_std as _lognormal_mean_std
from timelyllm_ros.papers.lamps.pause_workload import INFERCEPT_APIS
# The moments the seed reproductions use: LMSYS-Chat-1M (001), ShareGPT + BE batches (002).
from timelyllm_ros.papers.mcsf.chat_experiment import (CHAT_CAP, CHAT_OUTPUT_MEAN,
                                                       CHAT_PROMPT_MEAN, CHAT_SIGMA, PAPER_M)
from timelyllm_ros.core.skills import get_language
from timelyllm_ros.core.skills.skillset import SkillSet
from timelyllm_ros.core.tuf import TUF, TufLevels
from timelyllm_ros.lrtrace.traces import Trace
from timelyllm_ros.lrtrace.workload import Event, TaskSpec, Workload


@dataclass
class Scenario:
    """A paper workload with everything a replay needs besides the policy."""

    name: str
    paper: str
    description: str
    workload: Workload
    events: list[Event]
    traces: dict[int, Trace]
    skill_sets: dict[str, SkillSet]
    tuf_levels: TufLevels
    exec_model_spec: Mapping[str, Any]
    profile: EngineProfile
    call_durations: dict[tuple[int, int], float] = field(default_factory=dict)
    max_num_seqs: int | None = None
    # A request must wait for each tool's answer, so policies that never pause a generation
    # (whole / stream dispatch) cannot serve it.
    pauses_required: bool = False

    @property
    def num_tasks(self) -> int:
        return sum(len(e.tasks) for e in self.events)

    def configure(self, config: BenchConfig) -> BenchConfig:
        """The bench configuration for this scenario: its engine profile and slots, prompts as
        drawn (no padding), one client per request, no network hop."""
        return replace(config, profile=self.profile, max_num_seqs=self.max_num_seqs,
                       prompt_tokens=None, robots="parallel", network_latency_s=0.0)

    def exec_model(self) -> ExecutionTimeModel:
        return ExecutionTimeModel.from_mapping(self.exec_model_spec, source=self.name)

    def run_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `bench.replay.run_policy` for this scenario."""
        return {"traces": self.traces, "tuf_levels": self.tuf_levels,
                "skill_sets": self.skill_sets, "exec_model_factory": self.exec_model,
                "call_durations": self.call_durations}


# ---------------------------------------------------------------------------- building blocks

_WORDS = ("plan", "route", "check", "answer", "value", "result", "step", "object", "reason",
          "table", "number", "sum", "next", "then", "so", "we", "get", "the", "a", "it")
_TOKENIZER = PieceTokenizer()


def _words(n: int, offset: int = 0, capital: bool = True) -> str:
    """n words, each one token on the simulated engine's tokenizer (" word")."""
    if n <= 0:
        return ""
    words = [_WORDS[(offset + i) % len(_WORDS)] for i in range(n)]
    if capital:
        words[0] = words[0].capitalize()
    return words[0] + "".join(" " + w for w in words[1:])


def token_count(text: str) -> int:
    return len(_TOKENIZER.tokenize(text))


def _instruction(tokens: int, seed: int) -> str:
    """A user prompt of `tokens` tokens; distinct per request (`seed`) so that requests share
    only the skill set's system prompt in the prefix cache, as independent users do."""
    head = f"Request {seed}:"
    return head + " " + _words(max(1, tokens - token_count(head) - 1), offset=seed, capital=False)


def _paragraph(tokens: int, offset: int) -> str:
    """One paragraph of about `tokens` tokens ending with a period (no blank line: one segment)."""
    return _words(max(1, tokens - 1), offset) + "."


def _sentences(lengths: list[int], offset: int) -> str:
    """Sentences separated by blank lines (chat-paragraph segments), each of about its length."""
    parts = [_words(max(1, n - 2), offset + i) + "." for i, n in enumerate(lengths)]
    return "\n\n".join(parts)


def _skill_set(name: str, language: str, system_prompt: str, *, max_segment_tokens: int,
               max_plan_tokens: int, max_statements: int) -> SkillSet:
    return SkillSet(name=name, language=get_language(language), system_prompt=system_prompt,
                    user_template="{instruction}", max_statements=max_statements,
                    max_segment_tokens=max_segment_tokens, max_plan_tokens=max_plan_tokens)


def _poisson_times(rng: np.random.Generator, rate: float, duration_s: float) -> list[float]:
    times, t = [], 0.0
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t >= duration_s:
            return times
        times.append(t)


_READING = {"kind": "reading", "words_per_minute": 300}
_NO_EXECUTION = {"kind": "constant", "seconds": 0.0}


class _Builder:
    """Collects synthetic traces and events with consecutive ids."""

    def __init__(self) -> None:
        self.traces: dict[int, Trace] = {}
        self.events: list[Event] = []
        self._task = 0

    def add(self, time_s: float, tasks: list[tuple[str, str, str, str, str]],
            after_event: int | None = None) -> int:
        """tasks: (category, tuf level, skill set, instruction, plan). Returns the event id."""
        specs = []
        for category, level, skill_set, instruction, plan in tasks:
            tid = len(self.traces) + 1
            self.traces[tid] = Trace(tid, instruction, category, level, skill_set, plan,
                                     max_plan_tokens=token_count(plan))
            specs.append(TaskSpec(self._task, f"{category}_{self._task:05d}", tid, level))
            self._task += 1
        event_id = len(self.events)
        self.events.append(Event(float(time_s), event_id, tuple(specs), after_event))
        return event_id


# ---------------------------------------------------------------------------- 001: MC-SF

def seed001_chat(seed: int = 1, duration_s: float = 60.0, rate_per_s: float = 12.0) -> Scenario:
    """Chat requests under a tight KV budget (001). Prompt and output lengths lognormal with
    LMSYS-Chat-1M's means (69.5 / 214.5 tokens, sigma 1, capped at 1,024); Poisson arrivals;
    the engine's KV holds the paper's M = 16,492 tokens. A reply is one segment (the paper's
    request has no pauses); its TUF is `reply` (full utility within 10 s)."""
    rng = np.random.default_rng(seed)
    times = _poisson_times(rng, rate_per_s, duration_s)
    n = len(times)

    def draw(mean: float) -> np.ndarray:
        mu = math.log(mean) - CHAT_SIGMA ** 2 / 2
        return np.clip(np.rint(rng.lognormal(mu, CHAT_SIGMA, n)), 1, CHAT_CAP).astype(int)

    prompts, outputs = draw(CHAT_PROMPT_MEAN), draw(CHAT_OUTPUT_MEAN)
    b = _Builder()
    for i, t in enumerate(times):
        b.add(t, [("chat", "reply", "chat-reply", _instruction(int(prompts[i]), i),
                   _paragraph(int(outputs[i]), i))])
    block = 16
    profile = replace(EngineProfile(), name="llama3-8b-rtx4090-kv16492",
                      kv_block_size=block, kv_total_blocks=math.ceil(PAPER_M / block))
    return Scenario(
        name="seed001-chat", paper="001 MC-SF",
        description=f"{n} chat requests at {rate_per_s:g}/s over {duration_s:g} s, "
                    f"KV {PAPER_M} tokens",
        workload=Workload("seed001-chat", rate_per_s, 1, tuple(b.traces) or (1,), n or 1,
                          duration_s, seed, 0.0, "001: chat under a tight KV budget"),
        events=b.events, traces=b.traces,
        skill_sets={"chat-reply": _skill_set(
            "chat-reply", "tool-call", "You are a helpful assistant.",
            max_segment_tokens=CHAT_CAP + 8, max_plan_tokens=CHAT_CAP + 8, max_statements=1)},
        tuf_levels=TufLevels({"reply": TUF(10.0, 0.2, 1.0)}, source="seed001-chat"),
        exec_model_spec={"skills": {"default": _NO_EXECUTION, "say": _NO_EXECUTION}},
        profile=profile)


# ---------------------------------------------------------------------------- 002: BROS

# BROS's default SLOs (digest), and how steeply an RT reply loses utility past its deadline.
TTFT_SLO_S = 0.4
TPOT_SLO_S = 0.2
RT_U0 = 2.0
RT_SLOPE = RT_U0 / 0.6

def seed002_rtbe(seed: int = 1, duration_s: float = 60.0, rt_rate_per_s: float = 2.0,
                 be_batch: int = 64, be_batches: int = 400) -> Scenario:
    """Real-time chat plus closed-loop best-effort batches (002).

    RT: Poisson arrivals, ShareGPT-like lognormal prompt (222.8 +- 256.4) and output
    (234.5 +- 268.5) tokens, clipped to [4, 2048]; the reply is read sentence by sentence (12-30
    tokens each) at 300 words per minute, so every sentence after the first is due when the
    previous one has been read (the TPOT SLO of a streamed reply); TUF `rt/<k>`: ERT = when the
    first sentence (k tokens) would be complete if streamed within BROS's SLOs, TTFT 0.4 s +
    (k - 1) * TPOT 0.2 s; U0 2, zero 0.6 s later. Its deadline-miss rate is the TTFT-attainment
    counterpart for sentence-level delivery. BE: batches of 64 requests, prompt U(512, 1024), output
    U(32, 128), one segment each, TUF `be` (full utility within 60 s); the next batch is
    submitted when the previous one has completed, until `duration_s`.
    """
    from timelyllm_ros.papers.bros.reproduction_workload import HybridWorkload
    w = HybridWorkload()
    rng = np.random.default_rng(seed)
    times = _poisson_times(rng, rt_rate_per_s, duration_s)
    b = _Builder()
    levels = {"be": TUF(60.0, 0.05, 1.0)}
    for i, t in enumerate(times):
        p = int(np.clip(_lognormal_mean_std(rng, w.rt_prompt_mean, w.rt_prompt_std, 1)[0], 4,
                        w.max_len))
        o = int(np.clip(_lognormal_mean_std(rng, w.rt_output_mean, w.rt_output_std, 1)[0], 4,
                        w.max_len))
        lengths = []
        while sum(lengths) < o:
            lengths.append(int(rng.integers(12, 31)))
        lengths[-1] = max(3, lengths[-1] - (sum(lengths) - o))
        plan = _sentences(lengths, i)
        first = token_count(plan[:plan.find("\n\n") + 2] if "\n\n" in plan else plan)
        # Streamed, the first sentence would be complete TTFT + (k - 1) * TPOT after arrival.
        level = f"rt/{first}"
        levels[level] = TUF(TTFT_SLO_S + TPOT_SLO_S * (first - 1), RT_SLOPE, RT_U0)
        b.add(t, [("chat", level, "rt-chat", _instruction(p, i), plan)])
    previous = None
    for k in range(be_batches):
        tasks = []
        for j in range(be_batch):
            p = int(rng.integers(512, 1025))
            o = int(rng.integers(32, 129))
            tasks.append(("chat", "be", "be-batch", _instruction(p, 10_000 + k * be_batch + j),
                          _paragraph(o, j)))
        previous = b.add(0.0, tasks, after_event=previous)
    n = sum(len(e.tasks) for e in b.events)
    return Scenario(
        name="seed002-rtbe", paper="002 BROS",
        description=f"{len(times)} RT chats at {rt_rate_per_s:g}/s + closed-loop BE batches of "
                    f"{be_batch} over {duration_s:g} s",
        workload=Workload("seed002-rtbe", rt_rate_per_s, be_batch, tuple(b.traces), n,
                          duration_s, seed, 0.0, "002: RT chat + closed-loop BE batches"),
        events=b.events, traces=b.traces,
        skill_sets={
            "rt-chat": _skill_set("rt-chat", "chat-paragraph", "You are a helpful assistant.",
                                  max_segment_tokens=40, max_plan_tokens=w.max_len + 64,
                                  max_statements=w.max_len),
            "be-batch": _skill_set("be-batch", "tool-call", "Summarise the document.",
                                   max_segment_tokens=136, max_plan_tokens=136,
                                   max_statements=1)},
        tuf_levels=TufLevels(levels, source="seed002-rtbe"),
        exec_model_spec={"skills": {"default": _NO_EXECUTION, "say": _READING}},
        profile=EngineProfile())


# ---------------------------------------------------------------------------- 003: hybrid

def seed003_gsm8k(seed: int = 0, n: int = 1319, slots: int = 200) -> Scenario:
    """A GSM8K-like batch (003): n requests submitted at t = 0 with GSM8K's reported moments
    (prompts 68.4 +- 25.0 tokens; outputs 344.8 +- 188.0 under a 512 cap, `papers.hybrid.gsm8k.
    gsm8k_like`), `slots` running at most, on the paper's fitted LLaMA-65B time model (prefill
    25 ms + 0.13 ms/token, decode 29 ms + 0.21 ms/sequence) with KV for every slot's full
    context. TUF `batch`: full utility within 300 s."""
    from timelyllm_ros.papers.hybrid.gsm8k import GSM8K_MAX_OUTPUT, gsm8k_like  # imports SciPy
    w = gsm8k_like(n=n, seed=seed)
    b = _Builder()
    b.add(0.0, [("chat", "batch", "gsm8k", _instruction(int(w.prompt_tokens[i]), i),
                 _paragraph(int(w.output_tokens[i]), i)) for i in range(n)])
    block = 16
    longest = int(w.prompt_tokens.max()) + GSM8K_MAX_OUTPUT + 64
    profile = EngineProfile(
        name="llama65b-8npu-paper003", prefill_fixed_s=0.025, prefill_per_token_s=0.00013,
        decode_fixed_s=0.029, decode_per_seq_s=0.00021, decode_per_ctx_token_s=0.0,
        kv_block_size=block, kv_total_blocks=slots * math.ceil(longest / block),
        max_model_len=4096, source="seed 003's fitted time model (digest)")
    return Scenario(
        name="seed003-gsm8k", paper="003 hybrid",
        description=f"{n} GSM8K-like requests at t=0, {slots} slots",
        workload=Workload("seed003-gsm8k", 0.0, n, tuple(b.traces), n, 1.0, seed, 0.0,
                          "003: GSM8K-like batch"),
        events=b.events, traces=b.traces,
        skill_sets={"gsm8k": _skill_set(
            "gsm8k", "tool-call", "Solve the math word problem step by step.",
            max_segment_tokens=GSM8K_MAX_OUTPUT + 8, max_plan_tokens=GSM8K_MAX_OUTPUT + 8,
            max_statements=1)},
        tuf_levels=TufLevels({"batch": TUF(300.0, 0.01, 1.0)}, source="seed003-gsm8k"),
        exec_model_spec={"skills": {"default": _NO_EXECUTION, "say": _NO_EXECUTION}},
        profile=profile, max_num_seqs=slots)


# ---------------------------------------------------------------------------- 004: LAMPS

def seed004_api(seed: int = 1, n: int = 300, rate_per_s: float = 4.0) -> Scenario:
    """Requests that pause for tool calls (004), INFERCEPT's mix as `seeds.lamps` draws it:
    API type uniform over math / qa / ve / chatbot / image / tts; number of calls and call
    durations from the type's (mean, sd) as truncated normals; prompt U(100, 600) tokens; text
    before each call lognormal(40, 30) tokens; a final answer after the last call. The scheduler
    predicts a call's duration by its type's mean (LAMPS's historical-mean predictor, an
    execution-time model of constants); the tool takes the drawn duration. TUF `agent`: full
    utility while the first segment comes within 2 s."""
    rng = np.random.default_rng(seed)
    apis = list(INFERCEPT_APIS)
    b = _Builder()
    durations: dict[tuple[int, int], float] = {}
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(1.0 / rate_per_s))
        api = apis[int(rng.integers(len(apis)))]
        (dur_mean, dur_sd), (calls_mean, calls_sd) = INFERCEPT_APIS[api]
        calls = int(np.clip(round(rng.normal(calls_mean, calls_sd)), 1, 40))
        prompt = int(rng.integers(100, 601))
        parts = []
        for c in range(calls):
            words = int(np.clip(_lognormal_mean_std(rng, 40, 30, 1)[0], 2, 400))
            parts.append(_words(words, i + c) + f" <call:{api}>")
            durations[(i, c)] = max(float(rng.normal(dur_mean, dur_sd)), 1e-5)
        parts.append(" " + _paragraph(int(np.clip(_lognormal_mean_std(rng, 40, 30, 1)[0], 2, 400)),
                                      i))
        b.add(t, [("agent", "agent", "tool-agent", _instruction(prompt, i), " ".join(parts))])
    skills = {"default": _NO_EXECUTION}
    skills.update({api: {"kind": "constant", "seconds": mean}
                   for api, ((mean, _), _) in INFERCEPT_APIS.items()})
    longest = max(token_count(tr.plan) for tr in b.traces.values())
    return Scenario(
        name="seed004-api", paper="004 LAMPS",
        description=f"{n} tool-calling requests at {rate_per_s:g}/s (INFERCEPT API mix)",
        workload=Workload("seed004-api", rate_per_s, 1, tuple(b.traces), n, t + 1.0, seed, 0.0,
                          "004: requests with API-call pauses"),
        events=b.events, traces=b.traces,
        skill_sets={"tool-agent": _skill_set(
            "tool-agent", "tool-call", "You are an agent; call tools with <call:NAME>.",
            max_segment_tokens=420, max_plan_tokens=longest + 8, max_statements=64)},
        tuf_levels=TufLevels({"agent": TUF(2.0, 0.5, 1.0)}, source="seed004-api"),
        exec_model_spec={"skills": skills},
        profile=EngineProfile(), call_durations=durations, pauses_required=True)


# ---------------------------------------------------------------------------- registry

SCENARIOS: dict[str, Callable[..., Scenario]] = {
    "seed001-chat": seed001_chat,
    "seed002-rtbe": seed002_rtbe,
    "seed003-gsm8k": seed003_gsm8k,
    "seed004-api": seed004_api,
}


def scenario_names() -> list[str]:
    return list(SCENARIOS)


def is_scenario(name: str) -> bool:
    return str(name).lower() in SCENARIOS


def build_scenario(name: str, seed: int | None = None, **params: Any) -> Scenario:
    """The named scenario; `seed` overrides its default seed, `params` its size parameters."""
    key = str(name).lower()
    if key not in SCENARIOS:
        raise KeyError(f"unknown paper workload {name!r}; known: {', '.join(SCENARIOS)}")
    if seed is not None:
        params["seed"] = seed
    return SCENARIOS[key](**params)
