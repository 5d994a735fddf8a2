"""Scheduling policies: queue columns, priority functions and the named policies."""

from timelyllm_ros.core.sched.interface import DISPATCH_MODES, Policy
from timelyllm_ros.core.policies.builtin import (EdfPolicy, FcfsPolicy, PriorityClassPolicy,
                                                  TimelyPolicy)
from timelyllm_ros.core.policies.priority import (SlackScaling, get_slack_scaling, pud_priority, register_slack_scaling,
                       slack_scaling_names)
from timelyllm_ros.core.sched.queue_view import QueueArrays, QueueView, initial_row, suspended_row
from timelyllm_ros.core.policies.registry import (DEFAULT_POLICY, get_policy, policy_names,
                                                   register_policy)

__all__ = [
    "DEFAULT_POLICY", "DISPATCH_MODES", "EdfPolicy", "FcfsPolicy", "Policy",
    "PriorityClassPolicy", "TimelyPolicy", "SlackScaling",
    "get_slack_scaling", "pud_priority", "register_slack_scaling", "slack_scaling_names",
    "QueueArrays", "QueueView", "initial_row", "suspended_row", "get_policy", "policy_names",
    "register_policy",
]
