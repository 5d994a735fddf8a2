"""The core's own policies: FCFS, EDF and TimelyLLM's PUD-with-slack (Eq. 4). The base class
and its hooks are `core.sched.interface.Policy`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from timelyllm_ros.core.policies.priority import SlackScaling, check_gen_time, get_slack_scaling, pud_core
from timelyllm_ros.core.sched.interface import Policy
from timelyllm_ros.core.sched.queue_view import QueueView

# Profiled mean time to generate one robot-control segment (paper §4.3 / §7).
DEFAULT_GEN_TIME_S = 0.09


@dataclass
class FcfsPolicy(Policy):
    """First come, first served by *task arrival*: a suspended generation keeps the place its
    task had when it arrived (fcfs-seg), and whole/stream dispatch never re-queues at all."""

    name: str = "fcfs"

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        return np.negative(view.arrival_s)


@dataclass
class EdfPolicy(Policy):
    """Earliest deadline first, deadline = task arrival + task ERT for every segment, i.e.
    suspended generations keep their initial priority."""

    name: str = "edf"

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        out = np.add(view.arrival_s, view.task_ert_s)
        return np.negative(out, out=out)


@dataclass
class TimelyPolicy(Policy):
    """TimelyLLM: PUD scaled by slack (Eq. 4), recomputed at every fetch."""

    name: str = "timelyllm"
    dispatch: str = "segment"
    latency_guided_admission: bool = True
    gen_time_s: float = DEFAULT_GEN_TIME_S
    slack_scaling: str = "max_slack_g"
    scaling_params: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_gen_time(self.gen_time_s)
        self._scaling: SlackScaling = get_slack_scaling(self.slack_scaling)
        self._params = self._scaling.params(self.scaling_params)

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        # gen_time_s may be re-profiled at run time, so it is read on every call.
        g = self.gen_time_s
        if not g > 0:
            g = check_gen_time(g)
        return pud_core(view, now, g, self._scaling, self._params)
