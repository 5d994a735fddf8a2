"""The core's own policies: FCFS, EDF, vLLM's priority scheduling and TimelyLLM's PUD-with-slack
(Eq. 4). The base class and its hooks are `core.sched.interface.Policy`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from timelyllm_ros.core.policies.priority import SlackScaling, check_gen_time, get_slack_scaling, pud_core
from timelyllm_ros.core.sched.interface import GenerationInfo, Policy
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


# Service classes of `EngineRequest.service_class`: an engine with priority scheduling serves "be"
# after everything else (`core.engine.base.engine_priority`: priority 1 vs 0).
REAL_TIME, BEST_EFFORT = "rt", "be"
# Added to an urgent row's FCFS priority (-arrival) so that every urgent row ranks above every
# normal one; far above any replay's arrival times (seconds), far below float64's precision limit.
_CLASS_OFFSET = 1e9


@dataclass
class PriorityClassPolicy(FcfsPolicy):
    """vLLM's own priority scheduling (`--scheduling-policy priority`), each task's urgency class
    as the request priority: what a vLLM user gets without TimelyLLM. Streamed dispatch (each
    statement goes out when complete), no segmentation, no admission of its own.

    The engine request of an urgent task is "rt" (vLLM priority 0), of any other "be" (priority
    1), and the engine runs with `scheduling_policy="priority"`: it admits waiting requests, and
    picks preemption victims, by (priority, arrival). The scheduler's own queue (where requests
    wait while the KV cache is full, before they reach the engine) is ordered the same way,
    urgent first and FCFS within a class, because vLLM's waiting queue is that queue: a user
    submits every request to vLLM at once."""

    name: str = "vllm-priority"
    dispatch: str = "stream"
    engine_scheduling: str = "priority"

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        out = np.negative(view.arrival_s)
        out[view.is_urgent] += _CLASS_OFFSET
        return out

    def service_class(self, gen: GenerationInfo, now: float) -> str:
        return REAL_TIME if gen.is_urgent else BEST_EFFORT


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
