"""What a scheduling policy is: how plans are dispatched, and how the queue is ordered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from .priority import SlackScaling, check_gen_time, get_slack_scaling, pud_core
from .queue_view import QueueView

# whole:   generate the whole plan, then dispatch it (plain vLLM).
# stream:  dispatch each statement as soon as it is complete, but never pause the generation.
# segment: suspend the generation at each segment boundary until the scheduler resumes it.
DISPATCH_MODES = ("whole", "stream", "segment")

# Profiled mean time to generate one robot-control segment (paper §4.3 / §7).
DEFAULT_GEN_TIME_S = 0.09


# What to do with a suspended generation's KV cache while its robot executes a segment (LAMPS).
PRESERVE = "preserve"   # keep the blocks allocated (pinned) until the generation resumes
DISCARD = "discard"     # free them (evictable prefix cache); recompute what is evicted on resume
SWAP = "swap"           # copy them to host memory and back on resume
PAUSE_HANDLINGS = (PRESERVE, DISCARD, SWAP)


@dataclass(frozen=True)
class SchedulerContext:
    """What a policy may know about the engine when the scheduler builds its controllers.

    profile: the engine's cost model (EngineProfile) when it has one (simulated engine), else
        None (real engine: policies fall back to the default profile or a `profile` parameter).
    supports_pause_handling: the engine implements `suspend_request` / `resume_request`
        (preserve and swap); without it every suspension is a discard (abort + resubmit).
    kv_bytes_per_token, host_link_bytes_per_s: KV size and host-link bandwidth used to price a
        swap (the simulated engine's own values when it has them).
    """

    engine_name: str
    kv_block_size: int
    kv_total_blocks: int
    max_segment_tokens: int
    max_num_seqs: int | None = None
    profile: Any = None
    supports_pause_handling: bool = False
    kv_bytes_per_token: float = 131072.0
    host_link_bytes_per_s: float = 25e9

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_block_size * self.kv_total_blocks

    def t_swap(self, tokens: float) -> float:
        """Seconds to copy `tokens` tokens of KV one way over the host link."""
        return float(tokens) * self.kv_bytes_per_token / self.host_link_bytes_per_s


@dataclass(frozen=True)
class PauseInfo:
    """One suspension, as `Policy.pause_handling` sees it (token counts are KV tokens).

    context_tokens: C_i, the generation's prompt + everything it generated so far.
    other_tokens: C_other, the context of the other generations in the running batch.
    pause_s: the execution-time model's (minimum) estimate of how long the robot needs before
        it wants the next segment: the pause the KV must survive if nothing resumes it earlier.
    eligible_in_s: how long until the scheduler may resume it (0 without a resume lead).
    """

    task_id: str
    context_tokens: int
    other_tokens: int
    pause_s: float
    eligible_in_s: float
    segment_index: int
    is_urgent: bool
    context: SchedulerContext

    @property
    def batch_tokens(self) -> int:
        return self.context_tokens + self.other_tokens


@dataclass(frozen=True)
class GenerationInfo:
    """A generation about to be (re)started in the engine, as `Policy.service_class` sees it."""

    task_id: str
    is_urgent: bool
    deadline_s: float  # when the robot needs this run's segment (reference + ERT)
    bound_tokens: int  # most tokens this run may generate before its segment ends
    context_tokens: int
    skill_set: str


@dataclass(frozen=True)
class StepInfo:
    """One engine step, reported to `Policy.on_step`."""

    step: int
    duration_s: float
    batch_size: int
    prefill_tokens: int
    context_tokens: int  # sum of the running generations' contexts after the step


class AdmissionController(Protocol):
    """What the scheduler asks before each admission (see core.admission for the generic form).

    Generic: `may_admit(running_budgets, rate, free_kv_blocks, blocks_needed) -> (ok, why)`.
    Candidate-aware (seed policies) additionally define
    `may_admit_candidate(batch, candidate, free_kv_blocks) -> (ok, why)` and optionally
    `begin_pass(admission_pass)`, and the attribute `skip_refused` (True: a refusal skips the
    candidate and the walk goes on; False/absent: the walk stops at the first refusal).
    """

    def may_admit(self, running, rate, free_kv_blocks: int,
                  blocks_needed: int) -> tuple[bool, str]: ...

    def note_admission(self) -> None: ...

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None: ...


class Gate(Protocol):
    """Holds admissions (prefills) back for a while (003's Lagrangian prefill/decode gate).
    `seeds.hybrid.PrefillDecodeGate` implements it."""

    def decide(self, waiting_prompt_tokens: Sequence[float], decoding: int) -> str: ...

    def note_decode_round(self, decoding: int) -> None: ...

    def note_prefill(self) -> None: ...


@dataclass
class Policy:
    """Base policy. Subclasses implement `priorities`; higher values are served first.

    Optional extension points (the seed policies use them; the defaults keep the scheduler's
    original behaviour, and the scheduler skips hooks a policy does not override):

    - `make_admission(ctx)`: the policy's own admission controller, or None for the scheduler's
      default (latency-guided when `latency_guided_admission`, else KV blocks only);
    - `make_gate(ctx)`: a `Gate` consulted before each admission pass, or None;
    - `pause_handling(pause)`: preserve / discard / swap for each suspension (default discard:
      abort and resubmit with the token ids, served mostly from the prefix cache);
    - `on_admitted(view, rows, now)`: after each admission pass, the view rows admitted;
    - `on_step(step)`: after each engine step;
    - `on_task_end(task_seq)`: a task left the scheduler for good (forget its state);
    - `service_class(gen, now)`: "rt" / "be" for the engine request of a generation being
      started (BROS's bidirectional KV blocks serve the two classes from opposite ends);
    - `make_simulated_engine(profile)`: the simulated engine this policy must be evaluated on
      (None = the standard `SimulatedEngine`); with `requires_engine` set, the scheduler refuses
      any engine whose `name` differs (a baseline that only exists in simulation);
    - `engine_scheduling`: the engine's own scheduling policy this policy expects (vLLM's
      `scheduling_policy`; "priority" serves best-effort requests, by their `service_class`,
      after the rest and preempts them first). The bench and the planner build the engine with
      it unless told otherwise.
    """

    name: str = "policy"
    dispatch: str = "segment"
    latency_guided_admission: bool = False
    # Engine `name` this policy needs (None = any engine); checked when the scheduler is built.
    requires_engine: str | None = None
    engine_scheduling: str = "fcfs"

    def __post_init__(self) -> None:
        from timelyllm_ros.core.engine.base import ENGINE_SCHEDULING
        if self.dispatch not in DISPATCH_MODES:
            raise ValueError(f"policy {self.name!r}: dispatch must be one of {DISPATCH_MODES},"
                             f" got {self.dispatch!r}")
        if self.engine_scheduling not in ENGINE_SCHEDULING:
            raise ValueError(f"policy {self.name!r}: engine_scheduling must be one of "
                             f"{ENGINE_SCHEDULING}, got {self.engine_scheduling!r}")

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

    # ---- extension points (see the class docstring) ----
    def make_admission(self, ctx: SchedulerContext) -> AdmissionController | None:
        return None

    def make_gate(self, ctx: SchedulerContext) -> Gate | None:
        return None

    def pause_handling(self, pause: PauseInfo) -> str:
        return DISCARD

    def on_admitted(self, view: QueueView, rows: Sequence[int], now: float) -> None:
        pass

    def on_step(self, step: StepInfo) -> None:
        pass

    def on_task_end(self, task_seq: int) -> None:
        pass

    def service_class(self, gen: GenerationInfo, now: float) -> str | None:
        return None

    def make_simulated_engine(self, profile: Any, **engine_kwargs: Any) -> Any:
        return None


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
