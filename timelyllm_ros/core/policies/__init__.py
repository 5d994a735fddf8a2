"""Scheduling policies: queue columns, priority functions and the named policies."""

from .base import DISPATCH_MODES, EdfPolicy, FcfsPolicy, Policy, TimelyPolicy
from .priority import (SlackScaling, get_slack_scaling, pud_priority, register_slack_scaling,
                       slack_scaling_names)
from .queue_view import QueueArrays, QueueView, initial_row, suspended_row
from .registry import get_policy, policy_names, register_policy

__all__ = [
    "DISPATCH_MODES", "EdfPolicy", "FcfsPolicy", "Policy", "TimelyPolicy", "SlackScaling",
    "get_slack_scaling", "pud_priority", "register_slack_scaling", "slack_scaling_names",
    "QueueArrays", "QueueView", "initial_row", "suspended_row", "get_policy", "policy_names",
    "register_policy",
]
