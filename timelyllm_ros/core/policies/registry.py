"""Policies by name, as used in configs, the CLI and benchmark sweeps.

The core's own policies are defined here. Every other policy (the seed papers', or a user's own
package) is a plug-in: an entry point in the group `timelyllm_ros.policies` whose name is the
policy name and whose object is a `PolicyDefinition` (or any `factory(**params) -> Policy`).
Listing names reads package metadata only; a plug-in's module is imported the first time its
policy is asked for, so `core` never imports the papers and `get_policy("timelyllm")` loads none
of them.

    # setup.py of a package that adds a policy
    entry_points={"timelyllm_ros.policies": ["my-policy = my_pkg.policy:MY_POLICY"]}
    # my_pkg/policy.py
    MY_POLICY = PolicyDefinition(MyPolicy, name="my-policy")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, ClassVar, Mapping

from timelyllm_ros.core.policies.builtin import (EdfPolicy, FcfsPolicy, PriorityClassPolicy,
                                                  TimelyPolicy)
from timelyllm_ros.core.policies.predictive import PredictiveTimelyPolicy
from timelyllm_ros.core.policies.work_conserving import WorkConservingTimelyPolicy
from timelyllm_ros.core.sched.admission import (FixedBatchCap, LatencyGuidedAdmission,
                                                with_batch_cap)
from timelyllm_ros.core.sched.interface import AdmissionController, Policy, SchedulerContext
from timelyllm_ros.core.policies.priority import slack_scaling_names

ENTRY_POINT_GROUP = "timelyllm_ros.policies"

# The planner's default policy (the ROS planner node's `policy` parameter, config/planner.yaml),
# and what `--policies default` names in the bench: TimelyLLM with batch control predicted from
# the cost model (core/policies/predictive.py; docs/batch-control.md). The previous default,
# `timelyllm-wc` (core/policies/work_conserving.py), is kept for the comparison.
DEFAULT_POLICY = "timelyllm-pred"

PolicyFactory = Callable[..., Policy]


@dataclass(frozen=True)
class PolicyDefinition:
    """A named policy: the class that implements it and the constructor arguments that define it.
    The defining arguments (name, dispatch mode, scaling, ...) cannot be overridden by the
    params a caller passes; tuning knobs such as gen_time_s can."""

    cls: type[Policy]
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def __init__(self, cls: type[Policy], **fixed: Any) -> None:
        object.__setattr__(self, "cls", cls)
        object.__setattr__(self, "fixed", dict(fixed))

    def __call__(self, **params: Any) -> Policy:
        clash = set(params) & set(self.fixed)
        if clash:
            raise TypeError(f"policy {self.fixed.get('name')!r}: {sorted(clash)} cannot be "
                            "overridden")
        return self.cls(**self.fixed, **params)


_BUILTIN: dict[str, PolicyFactory] = {}
_REGISTERED: dict[str, PolicyFactory] = {}


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Register `factory(**params) -> Policy` under `name` at run time (tests, notebooks).
    Packages should declare an entry point instead (see the module docstring)."""
    if name in policy_names():
        raise ValueError(f"policy {name!r} is already registered")
    _REGISTERED[name] = factory


@lru_cache(maxsize=1)
def _plugins() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


@lru_cache(maxsize=None)
def _load_plugin(name: str) -> PolicyFactory:
    ep = _plugins()[name]
    factory = ep.load()
    if not callable(factory):
        raise TypeError(f"policy {name!r}: entry point {ep.value} is not a policy factory")
    return factory


def policy_names() -> list[str]:
    return sorted({*_BUILTIN, *_REGISTERED, *_plugins()})


def get_policy(name: str, **params: Any) -> Policy:
    """A fresh policy instance; `params` are passed to its constructor (TypeError if unknown)."""
    factory = _BUILTIN.get(name) or _REGISTERED.get(name)
    if factory is None:
        if name not in _plugins():
            hint = "" if _plugins() else (" (no plug-in policies are installed: run `make setup`, "
                                          "which installs this package and its entry points)")
            raise KeyError(f"unknown policy {name!r}; known policies: "
                           f"{', '.join(policy_names())}{hint}")
        factory = _load_plugin(name)
    return factory(**params)


def _builtin(name: str, cls: type[Policy], **fixed: Any) -> None:
    _BUILTIN[name] = PolicyDefinition(cls, name=name, **fixed)


# ---- The TimelyLLM authors' two systems, as they ran their experiment 7.4.1 -----------------
# Settings read from their code, github.com/MarkoMile/TimelyLLM (the authors' code and its port
# to vLLM 0.27.1), files as of commit 10c6761 (the one lrtrace/authors/ imports data from) and of
# the port (c7f9771), which agree on every setting below:
# - timelyllm/config.py: presets exp741_timelyllm_high (run_mode "rtllm") and exp741_vllm_high
#   (run_mode "vllm"), 42 agents, robot_system "typefly", whose defaults (ROBOT_DEFAULTS) are
#   seg_exe 0.09 s and lmax 10; comm_time 0.008 s.
# - timelyllm/rtengine/vllm_llm_scheduler.py, RequestScheduler.__init__: one engine for both runs,
#   EngineArgs(max_num_seqs=8, enable_prefix_caching=True, dtype="half", ...): at most 8 running
#   generations, the rest waiting in vLLM's FCFS queue.
# - the same file, infer_start: run_mode "rtllm" runs schedule_timely, which admits a queued
#   generation when the most urgent running one still makes its segment ((lmax - tokens so far)
#   / token speed < its slack) and KV is free. It never reads `batchsize` (config default 6):
#   only the *-fixed run modes (the 7.4.3 presets) cap the batch at `batchsize`.
#   run_mode "vllm" runs vllm_schedule: every request goes to the engine at once, the whole
#   plan is generated and then sent to the robot as one piece.
# - the same file, RequestScheduler._update_queue_priority: a queued generation whose utility
#   can no longer be positive is dropped (our `hopeless="shed"`, for first segments).
# - resumption (TaskDetails._update_input, get_task): the prompt plus the generated token ids are
#   submitted again, served by the prefix cache: our discard pause handling, the default.
# What they ran and we do not: their priority function (an exponential of the time to the
# robot's predicted finish) instead of our reconstruction of Eq. 4 (PUD / max(slack, g)); their
# dropping of queued *resumes* past their cut-off; their admission checks only the most urgent
# running generation, ours every one that can still make its budget (core/sched/admission.py).
# docs/fidelity.md reports both systems on the authors' workload.
AUTHORS_MAX_NUM_SEQS = 8     # vllm_llm_scheduler.py: RequestScheduler.__init__, max_num_seqs
AUTHORS_SEG_EXE_S = 0.09     # config.py: ROBOT_DEFAULTS["typefly"] (seg_exe, our g)
AUTHORS_LMAX = 10            # config.py: ROBOT_DEFAULTS["typefly"] (lmax)


@dataclass
class AuthorsVllmPolicy(FcfsPolicy):
    """The authors' vLLM baseline (exp741_vllm_high): FCFS, the whole plan generated and then
    dispatched, at most `batch_cap` running generations (their engine's max_num_seqs), prefix
    caching on. The settings and their sources are above this class."""

    name: str = "authors-vllm"
    dispatch: str = "whole"
    batch_cap: int = AUTHORS_MAX_NUM_SEQS
    # Their engine had automatic prefix caching on (enable_prefix_caching=True): the bench keeps
    # it on for this policy whatever its baseline setting (bench/replay.py).
    always_prefix_cache: ClassVar[bool] = True

    def make_admission(self, ctx: SchedulerContext) -> AdmissionController | None:
        return FixedBatchCap(self.batch_cap)


@dataclass
class AuthorsTimelyPolicy(TimelyPolicy):
    """The authors' TimelyLLM (exp741_timelyllm_high): segmented, suspended at every boundary,
    resumed by resubmitting the token ids (prefix cache), g = 0.09 s, latency-guided admission
    with segments of at most `max_segment_tokens` (their lmax) behind a cap of `batch_cap`
    running generations (their engine's max_num_seqs), and queued tasks whose utility can no
    longer be positive dropped. Our Eq. 4 priority (see above for what differs)."""

    name: str = "authors-timelyllm"
    gen_time_s: float = AUTHORS_SEG_EXE_S
    max_segment_tokens: int = AUTHORS_LMAX
    batch_cap: int = AUTHORS_MAX_NUM_SEQS
    hopeless: str = "shed"
    always_prefix_cache: ClassVar[bool] = True

    def make_admission(self, ctx: SchedulerContext) -> AdmissionController | None:
        return with_batch_cap(self.batch_cap, LatencyGuidedAdmission(
            max_segment_tokens=self.max_segment_tokens))


_builtin("vllm", FcfsPolicy, dispatch="whole")
_builtin("vllm-stream", FcfsPolicy, dispatch="stream")
_builtin("vllm-priority", PriorityClassPolicy)
_builtin("fcfs-seg", FcfsPolicy, dispatch="segment")
_builtin("edf-seg", EdfPolicy, dispatch="segment")
_builtin("timelyllm", TimelyPolicy, slack_scaling="max_slack_g")
_builtin("timelyllm-wc", WorkConservingTimelyPolicy)
_builtin("timelyllm-wc-serve", WorkConservingTimelyPolicy, hopeless="serve")
# Batch control predicted from the cost model (core/policies/predictive.py,
# docs/batch-control.md).
_builtin("timelyllm-pred", PredictiveTimelyPolicy)
for _scaling in slack_scaling_names():
    _builtin(f"timelyllm-{_scaling}", TimelyPolicy, slack_scaling=_scaling)
_builtin("authors-vllm", AuthorsVllmPolicy)
_builtin("authors-timelyllm", AuthorsTimelyPolicy)
