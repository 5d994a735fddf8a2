"""What a scheduling policy is: how plans are dispatched, and how the queue is ordered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .priority import SlackScaling, check_gen_time, get_slack_scaling, pud_core
from .queue_view import QueueView

# whole:   generate the whole plan, then dispatch it (plain vLLM).
# stream:  dispatch each statement as soon as it is complete, but never pause the generation.
# segment: suspend the generation at each segment boundary until the scheduler resumes it.
DISPATCH_MODES = ("whole", "stream", "segment")

# Profiled mean time to generate one robot-control segment (paper §4.3 / §7).
DEFAULT_GEN_TIME_S = 0.09


@dataclass
class Policy:
    """Base policy. Subclasses implement `priorities`; higher values are served first."""

    name: str = "policy"
    dispatch: str = "segment"
    latency_guided_admission: bool = False

    def __post_init__(self) -> None:
        if self.dispatch not in DISPATCH_MODES:
            raise ValueError(f"policy {self.name!r}: dispatch must be one of {DISPATCH_MODES},"
                             f" got {self.dispatch!r}")

    @property
    def segmented(self) -> bool:
        return self.dispatch == "segment"

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        raise NotImplementedError

    def select(self, view: QueueView, now: float) -> int | None:
        """Row index of the generation to serve next, or None for an empty queue.
        Ties go to the lowest row index (argmax semantics)."""
        if len(view) == 0:
            return None
        return int(np.argmax(self.priorities(view, now)))


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
