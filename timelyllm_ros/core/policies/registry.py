"""Policies by name, as used in configs, the CLI and benchmark sweeps."""

from __future__ import annotations

from typing import Any, Callable

from .base import EdfPolicy, FcfsPolicy, Policy, TimelyPolicy
from .priority import slack_scaling_names

_FACTORIES: dict[str, Callable[..., Policy]] = {}


def register_policy(name: str, factory: Callable[..., Policy]) -> None:
    """Register `factory(**params) -> Policy` under `name` (e.g. policies from other papers)."""
    if name in _FACTORIES:
        raise ValueError(f"policy {name!r} is already registered")
    _FACTORIES[name] = factory


def policy_names() -> list[str]:
    return sorted(_FACTORIES)


def get_policy(name: str, **params: Any) -> Policy:
    """A fresh policy instance; `params` are passed to its constructor (TypeError if unknown)."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known policies: {', '.join(policy_names())}") from None
    return factory(**params)


def _fixed(cls, **fixed: Any) -> Callable[..., Policy]:
    # The identity of a named policy (name, dispatch mode, scaling) cannot be overridden by
    # params; tuning knobs such as gen_time_s can.
    def make(**params: Any) -> Policy:
        clash = set(params) & set(fixed)
        if clash:
            raise TypeError(f"policy {fixed.get('name')!r}: {sorted(clash)} cannot be overridden")
        return cls(**fixed, **params)
    return make


register_policy("vllm", _fixed(FcfsPolicy, name="vllm", dispatch="whole"))
register_policy("vllm-stream", _fixed(FcfsPolicy, name="vllm-stream", dispatch="stream"))
register_policy("fcfs-seg", _fixed(FcfsPolicy, name="fcfs-seg", dispatch="segment"))
register_policy("edf-seg", _fixed(EdfPolicy, name="edf-seg", dispatch="segment"))
register_policy("timelyllm", _fixed(TimelyPolicy, name="timelyllm", slack_scaling="max_slack_g"))
for _scaling in slack_scaling_names():
    register_policy(f"timelyllm-{_scaling}",
                    _fixed(TimelyPolicy, name=f"timelyllm-{_scaling}", slack_scaling=_scaling))

# The seed papers' policies (001-004) and their combinations with TimelyLLM (docs/policies.md).
from .seed_policies import register_seed_policies  # noqa: E402 - needs register_policy above

register_seed_policies(register_policy, _fixed)
