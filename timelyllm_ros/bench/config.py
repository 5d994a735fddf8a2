"""How a replay runs: the engine, the seeds and the levers a run may tune (`BenchConfig`), with
the paper's configuration as the defaults (docs/bench.md, "Tuning" and "The paper's
configuration")."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.sched.interface import Policy
from timelyllm_ros.core.tuf import default_config_dir

ENGINES = ("sim", "vllm")
# queue: a busy robot serves its tasks in arrival order; dispatch: a robot runs segments in the
# order they reach it, across tasks (as ros/robot_server.py does); parallel: every task has its
# own robot (bench/simulated_robots.py).
ROBOT_MODES = ("queue", "dispatch", "parallel")

# Defaults:
# - suspended generations are resumed as soon as admission allows (a resume lead only delays them,
#   see docs/bench.md);
# - TimelyLLM's g is the paper's profiled 90 ms (the policy's default);
# - every policy runs with its own admission: latency-guided (§4.4) for timelyllm*, KV blocks only
#   for the others; `segmented_batch_cap=N` caps the segmented policies instead;
# - the configuration a user runs today: the skill sets' own prompts (plus each task's own
#   context) and prefix caching for every policy, baselines included. The paper's 2024
#   configuration (`timelyllm bench --paper-config`): prompts padded to 2884 tokens (simulated
#   engine) and the vllm / vllm-stream baselines without automatic prefix caching.
DEFAULT_RESUME_LEAD_S: float | None = None
DEFAULT_GEN_TIME_S: float | None = None  # None = the policy's own default (0.09 s)
DEFAULT_SEGMENTED_BATCH_CAP: int | None = None
# Prompt length of the paper's latency profile (Table 1: first token 328 ms for 2884 tokens).
PAPER_PROMPT_TOKENS = 2884
DEFAULT_PROMPT_TOKENS: int | None = None
DEFAULT_BASELINE_PREFIX_CACHE = True


def default_profile_path() -> Path:
    return default_config_dir() / "engine_profiles" / "llama3-8b-rtx4090.yaml"


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
    # True (default): every policy keeps vLLM's automatic prefix caching. False (the paper's
    # configuration): the whole / stream baselines run without
    # automatic prefix caching, as vLLM V0 ran by default (enable_prefix_caching=False) when the
    # paper was written; every prompt is then prefilled in full. Segmented policies always keep
    # the cache (resuming a generation depends on it). Simulated engine: `NoPrefixCacheEngine`;
    # real engine: `VllmEngineConfig.enable_prefix_caching=False`.
    baseline_prefix_cache: bool = DEFAULT_BASELINE_PREFIX_CACHE
    # Simulated engine: pad every skill set's prompt with a fixed preamble so that the shortest
    # prompt of the workload has this many tokens (default: the paper's 2884); None = the skill
    # sets' own prompts (~420 tokens for drones; the default). Ignored by the real engine (its model and
    # context are whatever --model is); see `effective_prompt_tokens`.
    prompt_tokens: int | None = DEFAULT_PROMPT_TOKENS
    resume_lead_s: float | None = DEFAULT_RESUME_LEAD_S
    # The scheduler's eviction of parked generations for urgent admissions (core/sched/parked.py).
    evict_parked: bool = True
    # Override of TimelyLLM's g (applied to every policy derived from TimelyPolicy).
    gen_time_s: float | None = DEFAULT_GEN_TIME_S
    # Extra constructor parameters per policy name, e.g. {"timelyllm-exp_decay": {...}}.
    policy_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    robots: str = "queue"
    # None = the workload's one-way latency.
    network_latency_s: float | None = None
    # Simulated robots never die. A segment queued on a busy robot behind another task's
    # segments is not reported for a while, and the scheduler is not told why, so the timeout
    # is large enough that it is never declared lost (bench/replay.py, "Busy robots").
    report_timeout_min_s: float = 3600.0
    skillsets_dir: str | Path | None = None
    exec_model_path: str | Path | None = None
    tuf_levels_path: str | Path | None = None
    # Abort a run in which nothing progressed (no task arrived or ended, no segment was
    # dispatched, no robot reported) for this long on the engine's clock: a livelock (engine
    # steps that produce nothing) or a deadlock. It must exceed the longest quiet gap of a
    # healthy run, one robot executing one segment while nothing else happens (tens of seconds
    # for the traces' longest calls); docs/overload.md.
    max_stall_s: float = 600.0
    # Optional hard limit: abort a run whose clock passes the last arrival by this much, even
    # if it still progresses (a test that wants a livelock with stray progress cut short).
    # None: no limit. A fixed limit cannot tell a stuck run from a deep but draining backlog:
    # the old default of 3600 s aborted every policy on a workload whose busiest robot was
    # given 4,144 s of execution and finished 3,965 s after the last arrival (docs/overload.md).
    max_overrun_s: float | None = None
    # Simulated engine: most running requests (vLLM's max_num_seqs); None = the engine default.
    max_num_seqs: int | None = None
    # Simulated engine: this many replicas in parallel behind the replica router's placement
    # (core/engine/sim/fleet.py), each with the profile's KV and `max_num_seqs` slots.
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine: must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.robots not in ROBOT_MODES:
            raise ValueError(f"robots: must be one of {', '.join(ROBOT_MODES)}, got {self.robots!r}")
        optional_counts = (("batch_cap", self.batch_cap),
                           ("segmented_batch_cap", self.segmented_batch_cap),
                           ("prompt_tokens", self.prompt_tokens),
                           ("max_num_seqs", self.max_num_seqs))
        for key, value in optional_counts:
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{key}: must be an integer >= 1 or None, got {value!r}")
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) \
                or self.replicas < 1:
            raise ValueError(f"replicas: must be an integer >= 1, got {self.replicas!r}")
        if self.replicas > 1 and self.engine != "sim":
            raise ValueError(f"replicas: {self.replicas} simulated replicas need engine sim, not "
                             f"{self.engine} (real servers: the planner's engine.replicas)")
        if not self.max_stall_s > 0:
            raise ValueError(f"max_stall_s: must be > 0, got {self.max_stall_s}")
        if self.max_overrun_s is not None and not self.max_overrun_s > 0:
            raise ValueError(f"max_overrun_s: must be > 0 or None, got {self.max_overrun_s}")
        if self.resume_lead_s is not None and not self.resume_lead_s >= 0:
            raise ValueError(f"resume_lead_s: must be >= 0, got {self.resume_lead_s}")

    @classmethod
    def paper(cls, **overrides: Any) -> "BenchConfig":
        """The paper's 2024 configuration (`timelyllm bench --paper-config`): prompts padded to
        2884 tokens and baselines without prefix caching."""
        fields_ = {"prompt_tokens": PAPER_PROMPT_TOKENS, "baseline_prefix_cache": False}
        fields_.update(overrides)
        return cls(**fields_)

    @property
    def effective_prompt_tokens(self) -> int | None:
        """The prompt length the replay pads to (None: unpadded; always None on the real engine)."""
        return self.prompt_tokens if self.engine == "sim" else None

    def load_profile(self) -> EngineProfile:
        if isinstance(self.profile, EngineProfile):
            return self.profile
        return EngineProfile.from_yaml(self.profile if self.profile is not None
                                       else default_profile_path())

    def cap_for(self, policy: Policy) -> int | None:
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
        if not self.evict_parked:  # (named only when off: the golden records predate it)
            out["evict_parked"] = False
        if self.engine == "sim":
            profile = self.load_profile()
            out["profile"] = profile.name
            out["kv_blocks"] = profile.kv_total_blocks
            out["max_num_batched_tokens"] = profile.max_num_batched_tokens
            if self.replicas > 1:  # (named only with several: the golden records predate it)
                out["replicas"] = self.replicas
        else:
            out["model"] = self.model
        if self.policy_params:
            out["policy_params"] = {k: dict(v) for k, v in self.policy_params.items()}
        return out
