"""Discrete-event replay of a composed workload against one scheduling policy.

The harness drives the very `SegmentScheduler` the ROS planner node runs, with:

- an engine: the calibrated `SimulatedEngine` (virtual clock; plans are the traces' scripted
  plans) or the real vLLM engine (wall clock; plans are generated, the loop sleeps until events);
- simulated robots (`SimulatedRobots`): each robot executes the segments dispatched to it in order,
  one at a time, with durations drawn from the execution-time model, and reports each finished
  segment back. One-way network latency (the workload's, 8 ms in the paper) is added on the way to
  the robot and on the way back.

Loop: handle every event due at `engine.now()` (task arrivals -> `submit`, robot reports arriving
at the planner -> `on_report`), then `tick()` the scheduler (one engine step). When nothing can run,
jump (or, on the real engine, sleep) to the next event or scheduler timer. The run stops when
every task is terminal.

Determinism: event lists come from `compose` (seeded); the duration of the i-th skill call of a
task is drawn from a Generator seeded by (seed, task number, i), so every policy sees exactly the
same robot execution times, whatever order the calls are executed or generated in. The simulated
engine is deterministic too, so the same seed gives the same results.

Busy robots: `compose` draws robots per event without tracking whether a robot is still busy with
a task from an earlier event. By default (`robots="queue"`) a robot serves its tasks in arrival
order, like a real robot that does not interleave two plans: segments of a newer task wait until
the robot has finished the last segment of every earlier task. The time a segment spends waiting
for *another* task is not the LLM's doing, so it is recorded per task (`robot_blocked_s`) and
subtracted from the reported waiting time; response time and utility (the LLM's first response)
are unaffected by it. `robots="parallel"` gives every task its own executor instead (no blocking).
The scheduler is not told about such blocking, so the bench raises the scheduler's report
timeout (`report_timeout_min_s`) so that a segment queued behind another task is not declared lost.

The paper's configuration (defaults, see docs/bench.md): prompts of 2884 tokens (the paper's
latency profile; each skill set's prompt is padded with a fixed preamble, shared by all its tasks
and so cacheable like TypeFly's fixed prompt), the `vllm` / `vllm-stream` baselines without
automatic prefix caching (vLLM V0's default in 2024), TimelyLLM's segmented policies with it (their
resumption design), and every policy's own admission (latency-guided for `timelyllm*`).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim_engine import PieceTokenizer, SimulatedEngine
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.scheduler import SchedulerConfig, SegmentScheduler, TaskRejected
from timelyllm_ros.core.skills.skillset import SkillSet, load_skillsets
from timelyllm_ros.core.task import SegmentRecord, TaskRecord, TaskSnapshot, TaskSpec
from timelyllm_ros.core.tuf import TufLevels, default_config_dir, load_tuf_levels
from timelyllm_ros.lrtrace.traces import Trace, load_traces
from timelyllm_ros.lrtrace.workload import Event, Workload

NAN = float("nan")

ENGINES = ("sim", "vllm")
ROBOT_MODES = ("queue", "parallel")

# Defaults (see docs/bench.md, "Tuning" and "The paper's configuration"):
# - suspended generations are resumed as soon as admission allows (a resume lead only delays them,
#   see docs/bench.md);
# - TimelyLLM's g is the paper's profiled 90 ms (the policy's default);
# - every policy runs with its own admission: latency-guided (§4.4) for timelyllm*, KV blocks only
#   for the others; `segmented_batch_cap=N` caps the segmented policies instead;
# - prompts are padded to the paper's 2884 tokens (simulated engine) and the vllm / vllm-stream
#   baselines run without automatic prefix caching, as vLLM did by default in 2024.
DEFAULT_RESUME_LEAD_S: float | None = None
DEFAULT_GEN_TIME_S: float | None = None  # None = the policy's own default (0.09 s)
DEFAULT_SEGMENTED_BATCH_CAP: int | None = None
# Prompt length of the paper's latency profile (Table 1: first token 328 ms for 2884 tokens).
PAPER_PROMPT_TOKENS = 2884
DEFAULT_PROMPT_TOKENS: int | None = PAPER_PROMPT_TOKENS
DEFAULT_BASELINE_PREFIX_CACHE = False


def default_profile_path() -> Path:
    return default_config_dir() / "engine_profiles" / "llama3-8b-rtx4090.yaml"


def task_type(category: str, tuf_level: str) -> str:
    """Task type for reporting: drone tasks split by TUF level (`drone-normal`, `drone-urgent`);
    other categories by name (`arm`, `chat`), with `-<level>` added for a non-default level
    (`arm-urgent`). A level's `/<detail>` suffix (per-request levels such as `rt/17`) is not
    part of the type."""
    tuf_level = tuf_level.split("/", 1)[0]
    if category == "drone":
        return f"drone-{tuf_level}"
    if tuf_level in ("normal", "chat", "") or tuf_level == category:
        return category
    return f"{category}-{tuf_level}"


@dataclass
class BenchConfig:
    """How to replay: engine, seeds, and the levers a run may tune."""

    engine: str = "sim"
    # Simulated engine: an EngineProfile, a YAML path, or None for the default profile.
    profile: EngineProfile | str | Path | None = None
    # Real engine: local model directory, plus extra VllmEngineConfig fields.
    model: str | None = None
    vllm_config: Mapping[str, Any] = field(default_factory=dict)
    # Seed of robot execution durations (None = the workload's seed).
    seed: int | None = None
    # Fixed cap on running generations for every policy (the batch-cap sweep); None = see below.
    batch_cap: int | None = None
    # Without batch_cap: the cap for policies that suspend generations (dispatch "segment");
    # None = the policy's own admission. Whole / stream policies (vllm, vllm-stream) are never
    # capped unless batch_cap is set: plain vLLM admits whatever fits in the KV cache.
    segmented_batch_cap: int | None = DEFAULT_SEGMENTED_BATCH_CAP
    # False (default, the paper's configuration): the whole / stream baselines run without
    # automatic prefix caching, as vLLM V0 ran by default (enable_prefix_caching=False) when the
    # paper was written; every prompt is then prefilled in full. Segmented policies always keep
    # the cache (resuming a generation depends on it). Simulated engine: `NoPrefixCacheEngine`;
    # real engine: `VllmEngineConfig.enable_prefix_caching=False`.
    baseline_prefix_cache: bool = DEFAULT_BASELINE_PREFIX_CACHE
    # Simulated engine: pad every skill set's prompt with a fixed preamble so that the shortest
    # prompt of the workload has this many tokens (default: the paper's 2884); None = the skill
    # sets' own prompts (~420 tokens for drones). Ignored by the real engine (its model and
    # context are whatever --model is); see `effective_prompt_tokens`.
    prompt_tokens: int | None = DEFAULT_PROMPT_TOKENS
    resume_lead_s: float | None = DEFAULT_RESUME_LEAD_S
    # Override of TimelyLLM's g (applied to every policy that has a gen_time_s parameter).
    gen_time_s: float | None = DEFAULT_GEN_TIME_S
    # Extra constructor parameters per policy name, e.g. {"timelyllm-exp_decay": {...}}.
    policy_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    robots: str = "queue"
    # None = the workload's one-way latency.
    network_latency_s: float | None = None
    # Simulated robots never die; see the module docstring for why this is large.
    report_timeout_min_s: float = 3600.0
    skillsets_dir: str | Path | None = None
    exec_model_path: str | Path | None = None
    tuf_levels_path: str | Path | None = None
    # Abort a run whose clock passes the last arrival by this much (a stuck replay).
    max_overrun_s: float = 3600.0
    # Simulated engine: most running requests (vLLM's max_num_seqs); None = the engine default.
    max_num_seqs: int | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine: must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.robots not in ROBOT_MODES:
            raise ValueError(f"robots: must be one of {', '.join(ROBOT_MODES)}, got {self.robots!r}")
        for key in ("batch_cap", "segmented_batch_cap", "prompt_tokens", "max_num_seqs"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{key}: must be an integer >= 1 or None, got {value!r}")
        if self.resume_lead_s is not None and not self.resume_lead_s >= 0:
            raise ValueError(f"resume_lead_s: must be >= 0, got {self.resume_lead_s}")

    @property
    def effective_prompt_tokens(self) -> int | None:
        """The prompt length the replay pads to (None: unpadded; always None on the real engine)."""
        return self.prompt_tokens if self.engine == "sim" else None

    def load_profile(self) -> EngineProfile:
        if isinstance(self.profile, EngineProfile):
            return self.profile
        return EngineProfile.from_yaml(self.profile if self.profile is not None
                                       else default_profile_path())

    def cap_for(self, policy) -> int | None:
        """The fixed batch cap a policy runs with (None = its own admission)."""
        if self.batch_cap is not None:
            return self.batch_cap
        return self.segmented_batch_cap if policy.dispatch == "segment" else None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "engine": self.engine, "batch_cap": self.batch_cap,
            "segmented_batch_cap": self.segmented_batch_cap,
            "baseline_prefix_cache": self.baseline_prefix_cache,
            "prompt_tokens": self.effective_prompt_tokens,
            "resume_lead_s": self.resume_lead_s, "gen_time_s": self.gen_time_s,
            "robots": self.robots, "report_timeout_min_s": self.report_timeout_min_s,
        }
        if self.engine == "sim":
            profile = self.load_profile()
            out["profile"] = profile.name
            out["kv_blocks"] = profile.kv_total_blocks
            out["max_num_batched_tokens"] = profile.max_num_batched_tokens
        else:
            out["model"] = self.model
        if self.policy_params:
            out["policy_params"] = {k: dict(v) for k, v in self.policy_params.items()}
        return out


@dataclass
class SegmentResult:
    sequence: int
    text: str
    is_last: bool
    dispatched_s: float
    started_s: float
    finished_s: float


@dataclass
class TaskResult:
    """One task's outcome. Times are seconds from the start of the replay."""

    task_id: str
    trace_id: int
    category: str
    tuf_level: str
    task_type: str
    robot_id: str
    arrival_s: float
    ert_s: float
    state: str = "done"
    reason: str = ""
    response_time_s: float = NAN
    utility: float = NAN
    # Waiting caused by LLM planning: completion - arrival - execution - robot_blocked.
    waiting_time_s: float = NAN
    # The scheduler's own figure, which includes time the robot spent on other tasks.
    sched_waiting_time_s: float = NAN
    robot_blocked_s: float = 0.0
    execution_s: float = NAN
    completion_s: float = NAN
    resumes: int = 0
    # Arrival until the last segment was dispatched: the request's end-to-end latency as the
    # seed papers measure it (pauses for robot / tool execution in between included).
    latency_s: float = NAN
    generated_tokens: int = 0
    event_id: int = -1
    segments: list[SegmentResult] = field(default_factory=list)
    # Intervals in which the task's generation was running in the engine.
    generation_spans: list[tuple[float, float]] = field(default_factory=list)

    @property
    def is_done(self) -> bool:
        return self.state == "done"


@dataclass
class RunResult:
    policy: str
    tasks: list[TaskResult]
    fetch_overhead_s: list[float]
    steps: int
    clock_s: float  # replay duration on the engine's clock
    wall_s: float
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def scheduling_overhead_ms(self) -> float:
        if not self.fetch_overhead_s:
            return 0.0
        return float(np.mean(self.fetch_overhead_s)) * 1e3


# ---------------------------------------------------------------------------------- robots

@dataclass
class _PendingSegment:
    sequence: int
    calls: tuple
    is_last: bool
    ready_s: float  # when it reaches the robot


@dataclass
class _RobotTask:
    task_id: str
    task_num: int
    pending: deque = field(default_factory=deque)
    next_call: int = 0
    last_finish: float = -math.inf
    blocked_s: float = 0.0
    execution_s: float = 0.0
    finished: bool = False  # its last segment is scheduled on the robot
    dropped: bool = False


class SimulatedRobots:
    """Robots that execute dispatched segments in order, one at a time, and report back.

    Each robot keeps its tasks in arrival order and works on the oldest unfinished one; a task's
    segments run back to back as they arrive. When a segment can start is known as soon as it is
    dispatched (or as soon as the robot's earlier task is finished), so start/finish times are
    computed exactly and the report is scheduled with `schedule_report(at, task_id, sequence,
    started, finished)` at finish + latency.
    """

    def __init__(self, exec_model: ExecutionTimeModel, seed: int, latency_s: float, mode: str,
                 schedule_report: Callable[[float, str, int, float, float], None],
                 call_durations: Mapping[tuple[int, int], float] | None = None):
        if mode not in ROBOT_MODES:
            raise ValueError(f"robots: must be one of {', '.join(ROBOT_MODES)}, got {mode!r}")
        self.exec_model = exec_model
        self.seed = int(seed)
        self.latency_s = float(latency_s)
        self.mode = mode
        self._schedule_report = schedule_report
        # (task number, call index) -> seconds, for workloads that fix each call's duration
        # (a tool's latency drawn with the workload); other calls are sampled.
        self.call_durations = dict(call_durations or {})
        self._queues: dict[str, deque[_RobotTask]] = {}
        self._free_at: dict[str, float] = {}
        self._tasks: dict[str, _RobotTask] = {}
        self._robot_of: dict[str, str] = {}

    def call_duration(self, task_num: int, call_index: int, call) -> float:
        """Duration of a task's `call_index`-th call; the same for every policy and run."""
        fixed = self.call_durations.get((int(task_num), int(call_index)))
        if fixed is not None:
            return float(fixed)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, int(task_num),
                                                            int(call_index)]))
        return float(self.exec_model.sample_segment((call,), rng))

    def add_task(self, task_id: str, task_num: int, robot_id: str) -> None:
        key = robot_id if self.mode == "queue" else f"{robot_id}/{task_id}"
        rt = _RobotTask(task_id, task_num)
        self._tasks[task_id] = rt
        self._robot_of[task_id] = key
        self._queues.setdefault(key, deque()).append(rt)
        self._free_at.setdefault(key, -math.inf)

    def dispatch(self, task_id: str, segment: SegmentRecord) -> None:
        rt = self._tasks[task_id]
        rt.pending.append(_PendingSegment(segment.sequence, tuple(segment.calls), segment.is_last,
                                          segment.dispatched_s + self.latency_s))
        self._advance(self._robot_of[task_id])

    def drop(self, task_id: str) -> None:
        """The task ended without finishing (failed / cancelled): the robot moves on."""
        rt = self._tasks.get(task_id)
        if rt is None or rt.finished or rt.dropped:
            return
        rt.dropped = True
        rt.pending.clear()
        self._advance(self._robot_of[task_id])

    def blocked_s(self, task_id: str) -> float:
        return self._tasks[task_id].blocked_s

    def execution_s(self, task_id: str) -> float:
        return self._tasks[task_id].execution_s

    def _advance(self, robot: str) -> None:
        queue = self._queues[robot]
        while queue:
            head = queue[0]
            while head.pending and not head.dropped:
                seg = head.pending.popleft()
                own_ready = max(seg.ready_s, head.last_finish)
                start = max(own_ready, self._free_at[robot])
                head.blocked_s += start - own_ready
                duration = 0.0
                for call in seg.calls:
                    duration += self.call_duration(head.task_num, head.next_call, call)
                    head.next_call += 1
                finish = start + duration
                head.execution_s += duration
                head.last_finish = finish
                self._free_at[robot] = finish
                self._schedule_report(finish + self.latency_s, head.task_id, seg.sequence,
                                      start, finish)
                if seg.is_last:
                    head.finished = True
                    break
            if head.finished or head.dropped:
                queue.popleft()
                continue
            break


# ---------------------------------------------------------------------------------- the replay

class _Listener:
    def __init__(self, robots: SimulatedRobots, on_terminal: Callable[[TaskSnapshot], None]):
        self.robots = robots
        self.on_terminal = on_terminal
        self.terminal: set[str] = set()

    def on_segment(self, task: TaskRecord, segment: SegmentRecord) -> None:
        self.robots.dispatch(task.task_id, segment)

    def on_status(self, snapshot: TaskSnapshot) -> None:
        if snapshot.is_terminal and snapshot.task_id not in self.terminal:
            self.terminal.add(snapshot.task_id)
            if snapshot.state != "done" and snapshot.task_id in self.robots._tasks:
                self.robots.drop(snapshot.task_id)
            self.on_terminal(snapshot)


def make_policy(name: str, config: BenchConfig):
    """The named policy with the run's overrides (KeyError names the known policies)."""
    params = dict(config.policy_params.get(name, {}))
    policy = get_policy(name, **params)
    if config.gen_time_s is not None and hasattr(policy, "gen_time_s") \
            and "gen_time_s" not in params:
        policy = get_policy(name, gen_time_s=config.gen_time_s, **params)
    return policy


def build_engine(config: BenchConfig, prefix_cache: bool = True, policy=None):
    """A fresh engine; `prefix_cache=False` turns automatic prefix caching off. On the simulated
    engine a policy may bring its own engine model (`Policy.make_simulated_engine`: BROS's
    bidirectional KV blocks, MC-SF's clearing baselines)."""
    scheduling = policy.engine_scheduling if policy is not None else "fcfs"
    if config.engine == "sim":
        kwargs = {} if config.max_num_seqs is None else {"max_num_seqs": config.max_num_seqs}
        kwargs["scheduling_policy"] = scheduling
        own = (policy.make_simulated_engine(config.load_profile(), **kwargs)
               if policy is not None else None)
        if own is not None:
            return own
        if not prefix_cache:
            return NoPrefixCacheEngine(config.load_profile(), **kwargs)
        return SimulatedEngine(config.load_profile(), **kwargs)
    if not config.model:
        raise ValueError("engine vllm: --model DIR (a local model directory) is required")
    from timelyllm_ros.core.engine.vllm_engine import VllmEngine, VllmEngineConfig
    values = {"model": str(config.model), "scheduling_policy": scheduling,
              **dict(config.vllm_config)}
    if not prefix_cache:
        values["enable_prefix_caching"] = False
    return VllmEngine(VllmEngineConfig.from_mapping(values))


class EnginePool:
    """Real engines for a run of several policies: one engine at a time, kept while consecutive
    policies need the same prefix-caching setting and engine scheduling, and rebuilt when they
    do not (a vLLM engine holds most of the machine's memory, so two are never alive
    together)."""

    def __init__(self, config: BenchConfig, build: Callable[..., Any] | None = None):
        self.config = config
        self._build = build or build_engine
        self._engine = None
        self._key: tuple | None = None

    def get(self, prefix_cache: bool = True, policy=None):
        key = (prefix_cache, policy.engine_scheduling if policy is not None else "fcfs")
        if self._engine is None or self._key != key:
            self.shutdown()
            self._engine = self._build(self.config, prefix_cache=prefix_cache, policy=policy)
            self._key = key
        return self._engine

    def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        self._key = None
        if engine is not None:
            engine.shutdown()


def _prompt_length(tokenizer: PieceTokenizer, skill_set: SkillSet, instruction: str) -> int:
    # As SegmentScheduler._prompt_ids builds a prompt for an engine without a chat template.
    messages = skill_set.render_messages(instruction)
    return len(tokenizer.tokenize("\n".join(m["content"] for m in messages) + "\n"))


_PREAMBLE_HEAD = ("Context shared by every task of this robot kind (fixed preamble: scene, skill "
                  "documentation and worked examples, here as filler words so that the prompt "
                  "has the length of the paper's latency profile):")
_PREAMBLE_WORDS = ("scene", "object", "table", "bottle", "person", "window", "door", "chair",
                   "example", "plan", "skill", "move", "turn", "check", "visible", "report")


def pad_skill_sets(skill_sets: Mapping[str, SkillSet], prompt_tokens: int | None,
                   instructions: Mapping[str, Iterable[str]]) -> dict[str, SkillSet]:
    """Skill sets whose system prompts start with a fixed preamble, sized so that the shortest
    prompt of each set (over `instructions[name]`) has `prompt_tokens` tokens on the simulated
    engine's tokenizer. The preamble is the same for every task of a set, so prefix caching can
    share it as it shares the real fixed prompt. Sets already that long, sets without
    instructions and `prompt_tokens=None` are returned unchanged."""
    out = dict(skill_sets)
    if prompt_tokens is None:
        return out
    tokenizer = PieceTokenizer()
    for name, skill_set in skill_sets.items():
        texts = list(instructions.get(name, ()))
        if not texts:
            continue
        shortest = min(texts, key=lambda t: _prompt_length(tokenizer, skill_set, t))
        missing = prompt_tokens - _prompt_length(tokenizer, skill_set, shortest)
        if missing <= 0:
            continue
        words = max(0, missing - len(tokenizer.tokenize(_PREAMBLE_HEAD + "\n\n")))
        for _ in range(8):  # each " word" is one token: converges in a step or two
            preamble = _PREAMBLE_HEAD + "".join(
                " " + _PREAMBLE_WORDS[i % len(_PREAMBLE_WORDS)] for i in range(words))
            padded = replace(skill_set, system_prompt=preamble + "\n\n" + skill_set.system_prompt)
            diff = prompt_tokens - _prompt_length(tokenizer, padded, shortest)
            if diff == 0 or words + diff < 0:
                break
            words += diff
        out[name] = padded
    return out


class NoPrefixCacheEngine(SimulatedEngine):
    """SimulatedEngine with automatic prefix caching off: no request reuses blocks computed for
    another, so every prompt is prefilled in full (vLLM V0's default, enable_prefix_caching=False).
    Overrides the engine's one prefix-cache lookup, `_prefix_hits`."""

    name = "sim-no-prefix-cache"

    def _prefix_hits(self, seq):
        return []


ProgressFn = Callable[[int, int, float], None]


def run_policy(events: Sequence[Event], policy_name: str, workload: Workload,
               config: BenchConfig | None = None, *, traces: Mapping[int, Trace] | None = None,
               tuf_levels: TufLevels | None = None,
               skill_sets: Mapping[str, SkillSet] | None = None,
               engine=None, progress: ProgressFn | None = None,
               exec_model_factory: Callable[[], ExecutionTimeModel] | None = None,
               call_durations: Mapping[tuple[int, int], float] | None = None) -> RunResult:
    """Replay `events` under `policy_name` and return every task's outcome.

    `engine`: an engine to reuse, or an `EnginePool` (the real vLLM engine is expensive to
    build); by default a fresh one is built from `config` (always pass none for the simulated
    engine, whose clock and cache must start fresh for every policy).

    `skill_sets`: default = those of config/skillsets that the workload's traces use (a planner
    serving only drones has only the drone set; the scheduler sizes its admission check by the
    largest max_segment_tokens of its sets), padded to `config.effective_prompt_tokens`.

    `exec_model_factory`: the scheduler's execution-time model (a fresh one per run, it learns
    online; default: config.exec_model_path). `call_durations`: (task number, call index) ->
    seconds the simulated robot takes for that call, instead of sampling the model.

    Events with `after_event` are released that many seconds after every task of the event they
    name has ended (closed loop); one that would be released after `workload.duration_s` is not
    submitted, nor is anything waiting on it.
    """
    config = config or BenchConfig()
    wall_start = time.perf_counter()
    traces = traces if traces is not None else load_traces()
    tuf_levels = tuf_levels if tuf_levels is not None else load_tuf_levels(config.tuf_levels_path)
    if skill_sets is None:
        skill_sets = load_skillsets(config.skillsets_dir or default_config_dir() / "skillsets")
        used = {traces[t.trace_id].skill_set for e in events for t in e.tasks}
        skill_sets = {n: s for n, s in skill_sets.items() if n in used} or skill_sets
    instructions: dict[str, set[str]] = {}
    for event in events:
        for t in event.tasks:
            trace = traces[t.trace_id]
            instructions.setdefault(trace.skill_set, set()).add(trace.instruction)
    skill_sets = pad_skill_sets(skill_sets, config.effective_prompt_tokens, instructions)
    exec_model = (exec_model_factory() if exec_model_factory is not None  # fresh: it learns online
                  else ExecutionTimeModel.from_yaml(config.exec_model_path))
    policy = make_policy(policy_name, config)
    latency = workload.network_latency_s if config.network_latency_s is None \
        else config.network_latency_s
    seed = workload.seed if config.seed is None else config.seed
    own_engine = engine is None
    prefix_cache = config.baseline_prefix_cache or policy.dispatch == "segment"
    if isinstance(engine, EnginePool):
        engine = engine.get(prefix_cache, policy)
    elif engine is None:
        engine = build_engine(config, prefix_cache=prefix_cache, policy=policy)
    simulated = config.engine == "sim"

    heap: list[tuple[float, int, str, Any]] = []
    order = 0

    def push(at: float, kind: str, payload: Any) -> None:
        nonlocal order
        heapq.heappush(heap, (at, order, kind, payload))
        order += 1

    total = sum(len(e.tasks) for e in events)
    done_count = 0
    t0 = 0.0

    def on_terminal(_snap: TaskSnapshot) -> None:
        nonlocal done_count
        done_count += 1
        if progress is not None:
            progress(done_count, total, engine.now() - t0)

    robots = SimulatedRobots(exec_model, seed, latency, config.robots,
                             lambda at, tid, seq, st, fin: push(at, "report", (tid, seq, st, fin)),
                             call_durations=call_durations)
    loop = _ClosedLoop(events)
    listener = _Listener(robots, lambda snap: (on_terminal(snap), loop.task_ended(snap.task_id)))
    scheduler = SegmentScheduler(
        engine, policy, dict(skill_sets), exec_model, listener,
        SchedulerConfig(network_latency_s=latency, batch_cap=config.cap_for(policy),
                        resume_lead_s=config.resume_lead_s,
                        report_timeout_min_s=config.report_timeout_min_s))
    scheduler.warm_prefix_cache()

    t0 = engine.now()
    meta: dict[str, tuple[Any, Trace, int]] = {}
    for event in loop.open_events:
        push(t0 + event.time_s, "arrival", event)
    arrivals_left = len(events)
    last_arrival = t0 + (max((e.time_s for e in loop.open_events), default=0.0))
    horizon = t0 + workload.duration_s

    def release_ready(now: float) -> None:
        nonlocal arrivals_left, last_arrival
        for event in loop.take_ready():
            at = now + event.time_s
            if at > horizon:
                arrivals_left -= loop.drop(event)
                continue
            push(at, "arrival", event)
            last_arrival = max(last_arrival, at)

    try:
        while True:
            now = engine.now()
            while heap and heap[0][0] <= now:
                at, _, kind, payload = heapq.heappop(heap)
                if kind == "arrival":
                    arrivals_left -= 1
                    for spec in payload.tasks:  # before submit: a rejection ends a task at once
                        loop.submitted(_task_id(spec), payload.event_id)
                    _submit_event(scheduler, robots, payload, at, traces, tuf_levels, simulated,
                                  meta)
                else:
                    task_id, seq, started, finished = payload
                    scheduler.on_report(task_id, seq, started, finished, True)
            if arrivals_left == 0 and len(listener.terminal) >= len(scheduler.tasks):
                break
            if now > last_arrival + config.max_overrun_s:
                stuck = [t.task_id for t in scheduler.active_tasks()][:5]
                raise RuntimeError(f"{policy_name}: replay still running {config.max_overrun_s:.0f} s "
                                   f"after the last arrival (active tasks e.g. {stuck})")
            progressed = scheduler.tick()
            if loop.has_ready():
                release_ready(engine.now())
                continue
            if progressed:
                continue
            candidates = [heap[0][0]] if heap else []
            timer = scheduler.next_timer_s()
            if timer is not None:
                candidates.append(timer)
            if not candidates:
                raise RuntimeError(f"{policy_name}: nothing runs, nothing is due, and tasks "
                                   f"{[t.task_id for t in scheduler.active_tasks()][:5]} are "
                                   "not finished")
            target = min(candidates)
            if target <= now:
                # A timer already due that the scheduler could not act on (e.g. KV blocks);
                # let a little time pass rather than spin.
                target = now + 1e-3
            engine.advance_idle(target)
    finally:
        if own_engine and not simulated:
            engine.shutdown()

    clock_s = engine.now() - t0
    tasks = [_task_result(scheduler.tasks[tid], meta[tid], robots, t0) for tid in scheduler.tasks]
    return RunResult(policy=policy_name, tasks=tasks,
                     fetch_overhead_s=list(scheduler.fetch_overhead_s), steps=scheduler.steps,
                     clock_s=clock_s, wall_s=time.perf_counter() - wall_start,
                     config={**config.describe(), "seed": seed, "network_latency_s": latency,
                             "policy_batch_cap": config.cap_for(policy),
                             "engine_prefix_cache": prefix_cache,
                             "prompt_tokens_min": min(
                                 (len(t.prompt_ids) for t in scheduler.tasks.values()
                                  if t.prompt_ids), default=0)})


def _task_id(spec) -> str:
    return f"t{spec.task_id:05d}"


class _ClosedLoop:
    """Which events wait for another event's tasks to end (`Event.after_event`)."""

    def __init__(self, events: Sequence[Event]):
        self.open_events = [e for e in events if e.after_event is None]
        self._waiting_on: dict[int, list[Event]] = {}
        for e in events:
            if e.after_event is not None:
                self._waiting_on.setdefault(e.after_event, []).append(e)
        known = {e.event_id for e in events}
        missing = sorted(set(self._waiting_on) - known)
        if missing:
            raise ValueError(f"events: after_event {missing[0]} names no event")
        self._left = {e.event_id: len(e.tasks) for e in events}
        self._event_of: dict[str, int] = {}
        self._ready: list[Event] = []

    def submitted(self, task_id: str, event_id: int) -> None:
        self._event_of[task_id] = event_id

    def task_ended(self, task_id: str) -> None:
        event_id = self._event_of.pop(task_id, None)
        if event_id is None:
            return
        self._left[event_id] -= 1
        if self._left[event_id] == 0:
            self._ready.extend(self._waiting_on.pop(event_id, ()))

    def has_ready(self) -> bool:
        return bool(self._ready)

    def take_ready(self) -> list[Event]:
        ready, self._ready = self._ready, []
        return ready

    def drop(self, event: Event) -> int:
        """Forget `event` and every event waiting on it; returns how many events that was."""
        dropped = 1
        for child in self._waiting_on.pop(event.event_id, ()):
            dropped += self.drop(child)
        return dropped


def _submit_event(scheduler: SegmentScheduler, robots: SimulatedRobots, event: Event, at: float,
                  traces: Mapping[int, Trace], tuf_levels: TufLevels, simulated: bool,
                  meta: dict) -> None:
    for spec in event.tasks:
        trace = traces[spec.trace_id]
        task_id = _task_id(spec)
        meta[task_id] = (spec, trace, event.event_id)
        robots.add_task(task_id, spec.task_id, spec.robot_id)
        try:
            scheduler.submit(TaskSpec(
                task_id=task_id, robot_id=spec.robot_id, skill_set=trace.skill_set,
                instruction=trace.instruction, tuf=tuf_levels.get(spec.tuf_level), arrival_s=at,
                urgency=spec.tuf_level, scripted_plan=trace.plan if simulated else None,
                max_plan_tokens=trace.max_plan_tokens))
        except TaskRejected:
            pass  # recorded by the scheduler as a rejected task; the listener saw it


def _spans(task: TaskRecord, t0: float, end: float) -> list[tuple[float, float]]:
    spans = []
    history = task.lifecycle.history
    for i, (state, at) in enumerate(history):
        if state == "generating":
            stop = history[i + 1][1] if i + 1 < len(history) else end
            spans.append((at - t0, stop - t0))
    return spans


def _task_result(task: TaskRecord, meta: tuple, robots: SimulatedRobots, t0: float) -> TaskResult:
    spec, trace, event_id = meta
    blocked = robots.blocked_s(task.task_id)
    segments = [SegmentResult(s.sequence, s.text, s.is_last, s.dispatched_s - t0,
                              (s.started_s - t0) if s.started_s is not None else NAN,
                              (s.finished_s - t0) if s.finished_s is not None else NAN)
                for s in task.segments]
    done = task.state == "done"
    execution = sum(s.finished_s - s.started_s for s in task.segments) if done else NAN
    completion = (max(s.finished_s for s in task.segments) - t0) if done else NAN
    sched_wait = task.waiting_time_s if done else NAN
    end = task.lifecycle.history[-1][1]
    latency = (max(s.dispatched_s for s in task.segments) - task.spec.arrival_s) if done else NAN
    return TaskResult(
        task_id=task.task_id, trace_id=trace.trace_id, category=trace.category,
        tuf_level=spec.tuf_level, task_type=task_type(trace.category, spec.tuf_level),
        robot_id=spec.robot_id, arrival_s=task.spec.arrival_s - t0, ert_s=task.spec.tuf.ert_s,
        state=task.state, reason=task.lifecycle.reason or "",
        response_time_s=task.response_time_s, utility=task.utility,
        waiting_time_s=(sched_wait - blocked) if done else NAN, sched_waiting_time_s=sched_wait,
        robot_blocked_s=blocked, execution_s=execution, completion_s=completion,
        resumes=task.resumes, latency_s=latency,
        generated_tokens=len(task.generated.token_ids), event_id=event_id, segments=segments,
        generation_spans=_spans(task, t0, end))


def shorten(workload: Workload, duration_s: float | None) -> Workload:
    """The workload cut to `duration_s` (events are a prefix of the full run's: same seed)."""
    if duration_s is None:
        return workload
    if not duration_s > 0:
        raise ValueError(f"duration_s: must be > 0, got {duration_s}")
    return replace(workload, duration_s=float(duration_s))


def run_policies(events: Sequence[Event], policies: Iterable[str], workload: Workload,
                 config: BenchConfig, *, progress_factory: Callable[[str], ProgressFn] | None = None,
                 engine=None, **kw) -> dict[str, RunResult]:
    """Run each policy on the same events (a fresh simulated engine each; a shared real one)."""
    out = {}
    for name in policies:
        progress = progress_factory(name) if progress_factory else None
        out[name] = run_policy(events, name, workload, config, engine=engine, progress=progress,
                               **kw)
    return out
