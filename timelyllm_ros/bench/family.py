"""The workload family (issue 22, point 3): workloads drawn from one fixed distribution, so that a
policy is judged on loads, mixes, contexts and engines nobody tuned it on (docs/family.md).

Member k of the family with seed S is drawn from its own generator, `numpy.random.default_rng(
[FAMILY_STREAM, S, k])`, so a member is the same whatever N is and can be replayed alone
(`timelyllm bench --family-member K --family-seed S`). In draw order, each member gets:

- an engine profile, uniform over `PROFILES`: the six GPU profiles of config/engine_profiles/
  (the KV-limited llama3-8b-fp8-rtx4080 and llama3-8b-a10, the default llama3-8b-rtx4090, the
  llama3-8b-h100, and the two llama3-70b-h100 ones); the CPU smollm profiles are left out (they
  are the fidelity check's real CPU engine, not a GPU serving a fleet);
- a trace mix, uniform over `MIXES`: drones only (traces 1-8, normal and urgent), arms only
  (9-11), drones and arms in one stream (1-11), and the fleet: drones, arms, chat users (12-14,
  one message per event) and a best-effort batch stream (15-16), at mixed-fleet.yaml's relative
  event rates 0.2 : 0.1 : 0.5 : 0.1;
- tasks per event: every stream's events start Uniform{1..max_tpe} tasks (the chat stream's
  one), max_tpe uniform in 1..8;
- per-task context, uniform over `CONTEXTS`: none; `long`, mixed-fleet-long.yaml's ranges
  (robots 200-800 tokens, chat 100-1500, batch 1000-4000); `short`, a quarter of those;
- a load: a multiple of the member's capacity (`capacity`), log-uniform in [0.05, 2]; the
  event rate is that multiple of the capacity's event rate;
- the workload's seed (events, contexts, robot execution times), uniform in [0, 2^31 - 1).

Every member has `MEMBER_DURATION_S` of arrivals, 0.008 s of network latency each way, and about
one robot per expected task in each stream (`agents`), so that a robot rarely queues a task
behind another: the family measures the planner, not a fleet too small for its load.

Capacity (`capacity`): the tasks per second the engine finishes when it runs a full batch, from
the profile's cost model and the mix's token counts on the simulated engine's tokenizer:

- per trace: prompt tokens P (skill set prompt and instruction, plus the mean context of its
  stream), of them C served from the prefix cache (the skill set's shared prompt, whole KV
  blocks), and plan tokens G (the trace's plan, cut at its token budget);
- task weights f: a stream's share of the tasks (event rate x mean tasks per event), spread
  uniformly over its traces;
- the full batch B = min(max_num_seqs (256, the simulated engine's), max_num_batched_tokens,
  (KV blocks - the shared prompts' blocks) / the blocks a generating sequence holds of its own),
  those blocks taken token-weighted (a sequence holds them while it decodes);
- a decode step at that batch, decode_step_s(B, B x ctx) with ctx the token-weighted mean
  context of a sampled token, P + (G - 1) / 2;
- engine seconds per task = sum f * prefill_per_token_s * (P - C) + E[G] * step / B, and the
  capacity is its inverse. The prefill's fixed cost is left out (one per step, shared by every
  prompt the step admits), as is re-prefilling a resumed segment (the baselines never resume).

A capacity is a throughput, not a deadline: urgent drones (ERT 0.2 s) go late well below it,
because a full batch's step is slow. Loads past 1 queue work faster than the engine can do it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np
import yaml

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.tokenizer import PieceTokenizer
from timelyllm_ros.core.skills.skillset import SkillSet, load_skillsets
from timelyllm_ros.core.tuf import default_config_dir
from timelyllm_ros.lrtrace.traces import Trace, load_traces
from timelyllm_ros.lrtrace.workload import Stream, Workload

# The first entry of every member's seed sequence, so that a family's draws share no stream with
# another use of the same small seed.
FAMILY_STREAM = 0x66616D  # "fam"
PROFILES = ("llama3-8b-rtx4090", "llama3-8b-h100", "llama3-8b-fp8-rtx4080", "llama3-8b-a10",
            "llama3-70b-tp2-h100", "llama3-70b-tp4-h100")
LOAD_RANGE = (0.05, 2.0)  # multiples of the capacity, log-uniform
MAX_TPE_RANGE = (1, 8)  # most tasks per event, uniform
MEMBER_DURATION_S = 60.0
NETWORK_LATENCY_S = 0.008
# The simulated engine's most running requests (SimulatedEngine's default, vLLM's max_num_seqs).
MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class StreamShape:
    """One stream of a mix: its traces, its relative event rate, its tasks per event (None: the
    member's max_tpe) and which of a context level's ranges its tasks get."""

    name: str
    traces: tuple[int, ...]
    share: float
    max_tpe: int | None
    context_kind: str


_DRONES = tuple(range(1, 9))
_ARMS = (9, 10, 11)
MIXES: dict[str, tuple[StreamShape, ...]] = {
    "drone": (StreamShape("drones", _DRONES, 1.0, None, "robot"),),
    "arm": (StreamShape("arms", _ARMS, 1.0, None, "robot"),),
    "mixed": (StreamShape("robots", _DRONES + _ARMS, 1.0, None, "robot"),),
    "fleet": (StreamShape("drones", _DRONES, 0.2, None, "robot"),
              StreamShape("arms", _ARMS, 0.1, None, "robot"),
              StreamShape("chat", (12, 13, 14), 0.5, 1, "chat"),
              StreamShape("batch", (15, 16), 0.1, None, "batch")),
}
_LONG = {"robot": (200, 800), "chat": (100, 1500), "batch": (1000, 4000)}
CONTEXTS: dict[str, dict[str, tuple[int, int]] | None] = {
    "none": None,
    "short": {kind: (lo // 4, hi // 4) for kind, (lo, hi) in _LONG.items()},
    "long": _LONG,
}


@dataclass(frozen=True)
class MemberParams:
    """What was drawn for one member, and the rates derived from it."""

    family_seed: int
    index: int
    profile: str
    mix: str
    max_tpe: int
    context: str
    load: float  # multiple of the capacity
    seed: int
    capacity_eps: float  # events per second at capacity
    capacity_tps: float  # tasks per second at capacity
    eps: float  # the member's events per second
    duration_s: float

    def describe(self) -> dict:
        return {"index": self.index, "profile": self.profile, "mix": self.mix,
                "max_tpe": self.max_tpe, "context": self.context, "load": self.load,
                "seed": self.seed, "capacity_events_per_s": self.capacity_eps,
                "capacity_tasks_per_s": self.capacity_tps, "events_per_s": self.eps,
                "duration_s": self.duration_s}


@dataclass(frozen=True)
class Member:
    params: MemberParams
    workload: Workload
    profile: EngineProfile


@dataclass(frozen=True)
class TraceSize:
    """Token counts of one trace's task on the simulated engine (no context)."""

    skill_set: str
    prompt_tokens: int
    cached_tokens: int  # of the prompt, served by the skill set's shared prefix (whole blocks)
    plan_tokens: int  # the plan, cut at its token budget


@dataclass(frozen=True)
class Capacity:
    batch: int  # sequences in a full batch
    step_s: float  # decode step at that batch
    context_tokens: float  # token-weighted mean context of a sampled token
    plan_tokens: float  # mean plan tokens per task
    prefill_s: float  # mean prefill seconds per task
    task_s: float  # engine seconds per task at a full batch
    tasks_per_event: float

    @property
    def tasks_per_s(self) -> float:
        return 1.0 / self.task_s

    @property
    def events_per_s(self) -> float:
        return self.tasks_per_s / self.tasks_per_event


def trace_sizes(traces: Mapping[int, Trace], skill_sets: Mapping[str, SkillSet],
                block_size: int, tokenizer: PieceTokenizer | None = None) -> dict[int, TraceSize]:
    """Each trace's prompt, cached prefix and plan tokens, as the replay renders its prompt for
    the simulated engine (its messages, one per line) and as bench/bound.py counts the prefix."""
    tokenizer = tokenizer or PieceTokenizer()

    def render(skill_set: SkillSet, instruction: str) -> list[int]:
        messages = skill_set.render_messages(instruction)
        return tokenizer.tokenize("\n".join(m["content"] for m in messages) + "\n")

    out = {}
    for tid, trace in traces.items():
        skill_set = skill_sets[trace.skill_set]
        ids, shared = render(skill_set, trace.instruction), render(skill_set, "")
        common = next((i for i, (a, b) in enumerate(zip(ids, shared)) if a != b),
                      min(len(ids), len(shared)))
        cached = min(common, len(ids) - 1) // block_size * block_size
        budget = skill_set.max_plan_tokens if trace.max_plan_tokens is None \
            else min(skill_set.max_plan_tokens, trace.max_plan_tokens)
        plan = min(len(tokenizer.tokenize(trace.plan)), budget)
        out[tid] = TraceSize(trace.skill_set, len(ids), cached, plan)
    return out


def capacity(profile: EngineProfile, streams: Sequence[Stream], sizes: Mapping[int, TraceSize],
             max_num_seqs: int = MAX_NUM_SEQS) -> Capacity:
    """The engine's throughput on this mix at a full batch (module docstring, "Capacity")."""
    if not streams:
        raise ValueError("capacity: no stream")
    tasks_rate = [st.eps * (1 + st.max_tpe) / 2 for st in streams]
    total = sum(tasks_rate)
    if not total > 0:
        raise ValueError("capacity: the streams' event rates sum to 0")
    block = profile.kv_block_size
    weight, prompt, uncached, plan, own_blocks = [], [], [], [], []
    shared_blocks: dict[str, int] = {}  # per skill set: its shared prompt, cached once
    for st, rate in zip(streams, tasks_rate):
        context = 0.0 if st.context_tokens is None else sum(st.context_tokens) / 2
        for tid in st.traces:
            size = sizes[tid]
            p = size.prompt_tokens + context
            weight.append(rate / total / len(st.traces))
            prompt.append(p)
            uncached.append(p - size.cached_tokens)
            plan.append(size.plan_tokens)
            own_blocks.append(math.ceil((p + size.plan_tokens) / block)
                              - size.cached_tokens // block)
            shared_blocks[size.skill_set] = size.cached_tokens // block
    f, p, u, g, own = (np.asarray(x, dtype=float) for x in
                       (weight, prompt, uncached, plan, own_blocks))
    mean_plan = float(f @ g)
    token_weight = f * g / mean_plan
    context = float(token_weight @ (p + (g - 1) / 2))
    held = float(token_weight @ own)
    free_blocks = profile.kv_total_blocks - sum(shared_blocks.values())
    batch = max(1, min(max_num_seqs, profile.max_num_batched_tokens,
                       int(free_blocks // held) if held > 0 else max_num_seqs))
    step = profile.decode_step_s(batch, batch * context)
    prefill = float(f @ u) * profile.prefill_per_token_s
    task_s = prefill + mean_plan * step / batch
    tasks_per_event = total / sum(st.eps for st in streams)
    return Capacity(batch=batch, step_s=step, context_tokens=context, plan_tokens=mean_plan,
                    prefill_s=prefill, task_s=task_s, tasks_per_event=tasks_per_event)


def profile_path(name: str):
    return default_config_dir() / "engine_profiles" / f"{name}.yaml"


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(math.log(lo), math.log(hi))))


def _rate(value: float) -> float:
    """A stream's rate to 6 significant digits, so that the workload written as YAML composes
    exactly the same events when read back (its rate is the sum of the written ones)."""
    return float(f"{value:.6g}")


class _Inputs:
    """What every member's derivation reads: the traces, their token counts per KV block size,
    and the profiles (each loaded once)."""

    def __init__(self) -> None:
        self.traces = load_traces()
        self.skill_sets = load_skillsets(default_config_dir() / "skillsets")
        self._sizes: dict[int, dict[int, TraceSize]] = {}
        self._profiles: dict[str, EngineProfile] = {}

    def sizes(self, block_size: int) -> dict[int, TraceSize]:
        if block_size not in self._sizes:
            self._sizes[block_size] = trace_sizes(self.traces, self.skill_sets, block_size)
        return self._sizes[block_size]

    def profile(self, name: str) -> EngineProfile:
        if name not in self._profiles:
            self._profiles[name] = EngineProfile.from_yaml(profile_path(name))
        return self._profiles[name]


_INPUTS: _Inputs | None = None


def _inputs() -> _Inputs:
    global _INPUTS
    if _INPUTS is None:
        _INPUTS = _Inputs()
    return _INPUTS


def draw_member(family_seed: int, index: int,
                duration_s: float = MEMBER_DURATION_S) -> Member:
    """Member `index` of the family `family_seed` (module docstring); `duration_s` shortens its
    arrivals (tests) and leaves every draw as it is."""
    if isinstance(family_seed, bool) or not isinstance(family_seed, int) or family_seed < 0:
        raise ValueError(f"family seed: must be an integer >= 0, got {family_seed!r}")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"family member: must be an integer >= 0, got {index!r}")
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise ValueError(f"member duration_s: must be a number > 0, got {duration_s!r}")
    rng = np.random.default_rng([FAMILY_STREAM, family_seed, index])
    profile_name = str(rng.choice(PROFILES))
    mix = str(rng.choice(list(MIXES)))
    max_tpe = int(rng.integers(MAX_TPE_RANGE[0], MAX_TPE_RANGE[1] + 1))
    context = str(rng.choice(list(CONTEXTS)))
    load = _log_uniform(rng, *LOAD_RANGE)
    seed = int(rng.integers(0, 2**31 - 1))

    inputs = _inputs()
    profile = inputs.profile(profile_name)
    ranges = CONTEXTS[context]
    shapes = MIXES[mix]
    # Relative rates first: the capacity depends on the mix, not on the absolute rate.
    relative = [Stream(s.name, s.share, s.max_tpe or max_tpe, s.traces, 1,
                       None if ranges is None else ranges[s.context_kind]) for s in shapes]
    cap = capacity(profile, relative, inputs.sizes(profile.kv_block_size))
    eps_total = load * cap.events_per_s
    scale = eps_total / sum(st.eps for st in relative)
    streams = []
    for st in relative:
        eps = _rate(st.eps * scale)
        expected_tasks = eps * (1 + st.max_tpe) / 2 * duration_s
        streams.append(replace(st, eps=eps, agents=max(st.max_tpe, math.ceil(expected_tasks))))
    streams = tuple(streams)
    name = f"family-s{family_seed}-m{index:02d}"
    workload = Workload(
        name=name, eps=sum(st.eps for st in streams), max_tpe=max(st.max_tpe for st in streams),
        traces=tuple(dict.fromkeys(t for st in streams for t in st.traces)),
        agents=sum(st.agents for st in streams), duration_s=float(duration_s), seed=seed,
        network_latency_s=NETWORK_LATENCY_S,
        description=(f"family {family_seed} member {index}: {mix} on {profile_name}, max_tpe "
                     f"{max_tpe}, context {context}, load {load:.3f} x capacity "
                     f"({cap.events_per_s:.4g} events/s)"),
        streams=streams)
    params = MemberParams(family_seed=family_seed, index=index, profile=profile_name, mix=mix,
                          max_tpe=max_tpe, context=context, load=load, seed=seed,
                          capacity_eps=cap.events_per_s, capacity_tps=cap.tasks_per_s,
                          eps=workload.eps, duration_s=float(duration_s))
    return Member(params, workload, profile)


def draw_family(n: int, family_seed: int, duration_s: float = MEMBER_DURATION_S) -> list[Member]:
    """Members 0..n-1 of the family `family_seed`."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"family size: must be an integer >= 1, got {n!r}")
    return [draw_member(family_seed, k, duration_s) for k in range(n)]


def member_yaml(member: Member) -> str:
    """The member's workload as a workload file (lrtrace/workloads/*.yaml), with the command that
    replays it alone in a comment; reading it back composes the same events."""
    p = member.params
    header = (f"# {member.workload.description}\n"
              f"# Replay alone: timelyllm bench --workload FILE --profile "
              f"config/engine_profiles/{p.profile}.yaml --policies default,vllm-stream,"
              f"vllm-priority --bound\n")
    # A workload with streams names its rates, robots and traces per stream only.
    data = {k: v for k, v in member.workload.to_dict().items()
            if k not in ("eps", "max_tpe", "traces", "agents")}
    return header + yaml.safe_dump(data, sort_keys=False, width=100)


def describe_distribution() -> dict:
    """The distribution as the family's JSON records it (module docstring)."""
    return {"profiles": list(PROFILES),
            "mixes": {name: [{"name": s.name, "traces": list(s.traces), "share": s.share,
                              "max_tpe": s.max_tpe or "member", "context": s.context_kind}
                             for s in shapes] for name, shapes in MIXES.items()},
            "max_tpe": list(MAX_TPE_RANGE),
            "contexts": {k: None if v is None else {kind: list(r) for kind, r in v.items()}
                         for k, v in CONTEXTS.items()},
            "load": {"low": LOAD_RANGE[0], "high": LOAD_RANGE[1], "draw": "log-uniform",
                     "unit": "capacity"},
            "network_latency_s": NETWORK_LATENCY_S, "max_num_seqs": MAX_NUM_SEQS}
