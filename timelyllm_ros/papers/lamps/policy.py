"""004 (LAMPS): memory-over-time ranking, starvation promotion and least-waste pause handling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from timelyllm_ros.core.policies.registry import PolicyDefinition
from timelyllm_ros.papers.lamps.ranking import LampsQueue, memory_time_score
from timelyllm_ros.papers.lamps.waste import choose_handling, engine_time_fns, handling_for_pause

from timelyllm_ros.core.policies.builtin import FcfsPolicy, TimelyPolicy
from timelyllm_ros.core.sched.interface import PauseInfo, Policy, SchedulerContext, StepInfo
from timelyllm_ros.core.sched.queue_view import QueueView
from timelyllm_ros.papers.common import engine_profile


def lamps_handling(pause: PauseInfo, profile_override: Any = None) -> str:
    """INFERCEPT's least-waste handling for one suspension: C_i = the generation's context,
    C_other = the rest of the running batch, T_INT = the execution-time model's estimate,
    T_fwd = a cold prefill of C_i on the engine profile, T_swap = C_i's KV over the host link."""
    ctx = pause.context
    t_fwd, t_swap = engine_time_fns(engine_profile(ctx, profile_override),
                                    kv_bytes_per_token=ctx.kv_bytes_per_token,
                                    host_link_bytes_per_s=ctx.host_link_bytes_per_s)
    return handling_for_pause(pause.context_tokens, pause.other_tokens, pause.batch_tokens,
                              pause.pause_s, t_fwd, t_swap, ctx.kv_bytes_per_token)


@dataclass
class LampsPolicy(Policy):
    """LAMPS (004) for robot pauses.

    Order: `LampsQueue` over the queued generations (keyed by `task_seq`), scored by
    `memory_time_score` with P = the generation's context, a = its bound (the segment about to be
    generated), T_INT = `pause_s` (the skill set's mean segment time, the historical-mean
    predictor of the paper), the handling predicted for that pause, and τ = the measured step
    time; scores are refreshed every `refresh_every` passes, and a generation left waiting
    `starvation_threshold` passes is promoted ahead of all others until its task ends.
    Pauses: `lamps_handling` at every suspension. Admission: KV blocks only (vLLM's)."""

    name: str = "lamps"
    dispatch: str = "segment"
    refresh_every: int = 10
    starvation_threshold: int = 100
    profile: Any = None
    # Fixed handling for every pause instead of the least-waste choice (ablations).
    fixed_handling: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fixed_handling not in (None, "preserve", "discard", "swap"):
            raise ValueError(f"fixed_handling must be preserve, discard or swap, got "
                             f"{self.fixed_handling!r}")
        self.queue = LampsQueue(self._score, refresh_every=self.refresh_every,
                                starvation_threshold=self.starvation_threshold)
        self._view: QueueView | None = None
        self._row_of: dict[int, int] | None = None
        self._ctx: SchedulerContext | None = None
        self._time_fns = None
        self._tau: float | None = None
        self._batch_ctx = 0
        self.handling_counts = {"preserve": 0, "discard": 0, "swap": 0}

    # -- ranking --
    def _fns(self):
        if self._time_fns is None:
            ctx = self._ctx
            if ctx is None:
                from timelyllm_ros.core.engine.cost_model import EngineProfile
                self._time_fns = engine_time_fns(self.profile or EngineProfile())
            else:
                self._time_fns = engine_time_fns(
                    engine_profile(ctx, self.profile), kv_bytes_per_token=ctx.kv_bytes_per_token,
                    host_link_bytes_per_s=ctx.host_link_bytes_per_s)
        return self._time_fns

    def _score(self, task_seq: int) -> float:
        if self._row_of is None:
            self._row_of = {int(t): i for i, t in enumerate(self._view.task_seq.tolist())}
        i = self._row_of[task_seq]
        v = self._view
        c = float(v.context_tokens[i])
        a = float(max(1, v.bound_tokens[i]))
        t_int = float(v.pause_s[i])
        t_fwd, t_swap = self._fns()
        tau = self._tau if self._tau is not None else 0.025
        handling = self.fixed_handling or choose_handling(
            t_int=t_int, c_i=c + a, c_other=float(self._batch_ctx),
            c_batch=float(self._batch_ctx) + c + a, t_fwd=t_fwd, t_swap=t_swap)
        return memory_time_score(prompt_tokens=c, pre_tokens=a, post_tokens=0.0, iter_s=tau,
                                 handling=handling, t_int=t_int, t_fwd=t_fwd, t_swap=t_swap)

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        self._view = view
        self._row_of = None
        ids = view.task_seq.tolist()
        q = self.queue
        for t in ids:
            if t not in q:
                if q.is_paused(t):
                    q.resume(t)
                else:
                    q.add(t)
        rank = {t: r for r, t in enumerate(q.begin_iteration())}
        return np.fromiter((-rank[t] for t in ids), dtype=np.float64, count=len(ids))

    def on_admitted(self, task_seqs: Sequence[int], now: float) -> None:
        q = self.queue
        q.end_iteration(task_seqs)
        for t in task_seqs:
            q.pause(t)
        self._view = None
        self._row_of = None

    def on_task_end(self, task_seq: int) -> None:
        self.queue.finish(task_seq)

    def on_step(self, step: StepInfo) -> None:
        if step.duration_s > 0:
            self._tau = step.duration_s if self._tau is None else \
                0.8 * self._tau + 0.2 * step.duration_s
        self._batch_ctx = step.context_tokens

    # -- pauses --
    def make_admission(self, ctx: SchedulerContext):
        self._ctx = ctx  # the engine's profile and link prices the scores and the handling
        self._time_fns = None
        return None  # the scheduler's default: KV blocks only

    def pause_handling(self, pause: PauseInfo) -> str:
        h = self.fixed_handling or lamps_handling(pause, self.profile)
        self.handling_counts[h] += 1
        return h


@dataclass
class TimelyLampsPolicy(TimelyPolicy):
    """TimelyLLM's priorities and admission, plus LAMPS's least-waste pause handling."""

    name: str = "timelyllm-lamps"

    def pause_handling(self, pause: PauseInfo) -> str:
        return lamps_handling(pause)


@dataclass
class InferceptPolicy(FcfsPolicy):
    """INFERCEPT, LAMPS's baseline: first come, first served, with the same least-waste
    preserve / discard / swap choice at every pause (`lamps` minus its ranking)."""

    name: str = "infercept"

    def pause_handling(self, pause: PauseInfo) -> str:
        return lamps_handling(pause)


# The policies this paper adds, by name (entry points in setup.py, group timelyllm_ros.policies).
LAMPS = PolicyDefinition(LampsPolicy, name="lamps")
INFERCEPT = PolicyDefinition(InferceptPolicy, name="infercept", dispatch="segment")
TIMELYLLM_LAMPS = PolicyDefinition(TimelyLampsPolicy, name="timelyllm-lamps", slack_scaling="max_slack_g")
