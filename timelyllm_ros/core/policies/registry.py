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
from typing import Any, Callable, Mapping

from timelyllm_ros.core.policies.builtin import (EdfPolicy, FcfsPolicy, PriorityClassPolicy,
                                                  TimelyPolicy)
from timelyllm_ros.core.policies.work_conserving import WorkConservingTimelyPolicy
from timelyllm_ros.core.sched.interface import Policy
from timelyllm_ros.core.policies.priority import slack_scaling_names

ENTRY_POINT_GROUP = "timelyllm_ros.policies"

# The planner's default policy (the ROS planner node's `policy` parameter, config/planner.yaml),
# and what `--policies default` names in the bench: work-conserving TimelyLLM
# (core/policies/work_conserving.py; docs/bench.md, "The modern comparison").
DEFAULT_POLICY = "timelyllm-wc"

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


_builtin("vllm", FcfsPolicy, dispatch="whole")
_builtin("vllm-stream", FcfsPolicy, dispatch="stream")
_builtin("vllm-priority", PriorityClassPolicy)
_builtin("fcfs-seg", FcfsPolicy, dispatch="segment")
_builtin("edf-seg", EdfPolicy, dispatch="segment")
_builtin("timelyllm", TimelyPolicy, slack_scaling="max_slack_g")
_builtin("timelyllm-wc", WorkConservingTimelyPolicy)
_builtin("timelyllm-wc-serve", WorkConservingTimelyPolicy, hopeless="serve")
for _scaling in slack_scaling_names():
    _builtin(f"timelyllm-{_scaling}", TimelyPolicy, slack_scaling=_scaling)
