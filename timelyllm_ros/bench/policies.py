"""The policies a replay compares: a checked list of names, and each policy built with the run's
overrides."""

from __future__ import annotations

from typing import Iterable

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.core.policies.builtin import TimelyPolicy
from timelyllm_ros.core.policies.registry import DEFAULT_POLICY, get_policy, policy_names
from timelyllm_ros.core.sched.interface import Policy


# In a policy list: the planner's default policy (`core.policies.registry.DEFAULT_POLICY`), so
# that scripts need not track which policy that is.
DEFAULT_ALIAS = "default"


class PolicyListError(ValueError):
    """A list of policy names that names no policy, an unknown one, or one twice."""


def parse_policy_list(text: str) -> list[str]:
    """The names of a comma-separated list, each a registered policy, none twice; `default`
    stands for the planner's default policy and is replaced by its name."""
    given = [p.strip() for p in text.split(",") if p.strip()]
    if not given:
        raise PolicyListError("no policy given")
    names = [DEFAULT_POLICY if n == DEFAULT_ALIAS else n for n in given]
    known = policy_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise PolicyListError(f"unknown policy {unknown[0]!r}; known policies: "
                              f"{', '.join(known)} (and {DEFAULT_ALIAS!r} = {DEFAULT_POLICY})")
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        also = f" ({DEFAULT_ALIAS!r} is {DEFAULT_POLICY})" if DEFAULT_ALIAS in given else ""
        raise PolicyListError(f"policy {twice!r} is listed twice{also}")
    return names


def make_policy(name: str, config: BenchConfig) -> Policy:
    """The named policy with the run's overrides (KeyError names the known policies).

    `config.gen_time_s` is TimelyLLM's g, a field of `TimelyPolicy`: it applies to that policy
    and every policy derived from it, unless the policy's own parameters set it."""
    params = dict(config.policy_params.get(name, {}))
    policy = get_policy(name, **params)
    if config.gen_time_s is not None and isinstance(policy, TimelyPolicy) \
            and "gen_time_s" not in params:
        policy = get_policy(name, gen_time_s=config.gen_time_s, **params)
    return policy


def split_by_pausing(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(policies that suspend generations at segment boundaries, those that never pause one).
    A workload whose requests wait for a tool's answer mid-generation needs the first kind."""
    pausing, never_pausing = [], []
    for name in names:
        (pausing if get_policy(name).dispatch == "segment" else never_pausing).append(name)
    return pausing, never_pausing
