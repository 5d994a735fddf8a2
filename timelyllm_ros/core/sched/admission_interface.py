"""The admission controllers' side of the scheduler's contract (core/sched/interface.py
re-exports all of it): the records an admission pass hands them (`RunningGen`, `Candidate`,
`AdmissionPass`, frozen) and what the scheduler calls (`AdmissionController`,
`CandidateAdmission`, `Gate`). Kept apart from the policy hooks and listeners, which do not
see a pass."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Collection, Protocol, Sequence

import numpy as np

from timelyllm_ros.core.engine.base import ReplicaRoom
from timelyllm_ros.core.sched.preserved_blocks import PreservedBlocks
from timelyllm_ros.core.sched.queue_view import QueueView


@dataclass(frozen=True, slots=True)
class RunningGen:
    """A generation in the running batch, as candidate-aware admission controllers see it."""

    key: str
    context_tokens: int    # prompt + everything generated so far (its KV now)
    tokens_this_run: int
    bound_tokens: int      # most tokens this run may generate (the segment bound at admission)
    deadline_s: float      # when its current segment is due (TUF ERT / robot done estimate)
    is_urgent: bool
    # Leading full blocks of its prompt shared with its skill set's fixed prompt (the part the
    # prefix cache stores once for all generations of `skill_set`).
    skill_set: str = ""
    shared_tokens: int = 0
    # Index of the segment it is generating: 0 = the task's first (its response), else a resume.
    segment_index: int = 0
    # Its task's TUF: the segment finishing at t is worth U0 - k * max(0, t - deadline_s)
    # (a resume's deadline is when the robot finishes the previous segment: TUF.for_suspended).
    initial_utility: float = 0.0
    slope: float = 0.0
    # The replica of a fleet it runs on (`EngineAdapter.replica_for`); None on one engine.
    replica: int | None = None

    @property
    def remaining_tokens(self) -> int:
        return max(0, self.bound_tokens - self.tokens_this_run)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A queued generation offered to a candidate-aware admission controller."""

    key: str
    task_seq: int
    context_tokens: int
    bound_tokens: int
    prefill_tokens: int
    blocks_needed: int
    deadline_s: float
    is_urgent: bool
    segment_index: int
    skill_set: str = ""
    shared_tokens: int = 0
    # Its task's TUF, as for RunningGen.
    initial_utility: float = 0.0
    slope: float = 0.0
    # The replica of a fleet it would run on if admitted now (a resume: its task's replica; a
    # new plan: the router's placement); None on one engine.
    replica: int | None = None


@dataclass(frozen=True)
class AdmissionPass:
    """One admission pass: the queue in walk order, before anything is admitted."""

    now: float
    view: QueueView
    rows: np.ndarray           # view rows in walk order (eligible ones only)
    keys: list                 # task ids of those rows
    running: list[RunningGen]
    free_kv_blocks: int
    block_size: int
    rate: float | None = None  # measured decode speed of one generation (tokens/s)
    # KV blocks that queued generations' preserved pauses still hold in the engine (their
    # admission needs that many fewer), by key and by position (`PreservedBlocks.held_at`);
    # filled only for a controller that declares `reads_preserved_blocks`.
    preserved_blocks: PreservedBlocks = field(default_factory=PreservedBlocks.empty)
    # On a fleet whose replicas step on their own (`EngineAdapter.replica_rooms`), for a
    # controller that declares `reads_replicas`: each replica's free KV blocks and slots, and
    # per candidate (parallel to `keys`) the replica that would run it if it started now
    # (`EngineAdapter.replica_for`: its task's, or for a new plan the router's pick), -1 where
    # no replica can. None otherwise.
    replica_rooms: Sequence[ReplicaRoom] | None = None
    candidate_replicas: np.ndarray | None = None


class AdmissionController(ABC):
    """Asked before each admission with the running batch's budgets (see core.sched.admission):
    `running` holds (tokens so far, remaining time budget, segment bound) per running generation,
    `rate` the measured decode speed of one generation (tokens/s, None until measured)."""

    # False: `may_admit` never looks at `running`, so the scheduler passes an empty batch rather
    # than build the budgets of a running batch that may hold thousands of generations.
    reads_running: bool = True

    @abstractmethod
    def may_admit(self, running: Sequence[tuple[int, float, int]], rate: float | None,
                  free_kv_blocks: int, blocks_needed: int) -> tuple[bool, str]:
        """(admit?, why not)."""

    def note_admission(self) -> None:
        """A generation was admitted."""

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None:
        """An engine step ran."""

    def note_replica_step(self, replica: int, duration_s: float, batch_size: int) -> None:
        """The step `note_step` just reported ran on one replica of a fleet, with `batch_size`
        sequences of its own (`StepTiming.replica`); a controller that sees the fleet as one
        engine ignores it."""


class CandidateAdmission(AdmissionController):
    """An admission controller that sees the running batch and each queued candidate (the seed
    policies: MC-SF's look-ahead, BROS's selection, the alpha-protection baselines)."""

    # True: a refused candidate is skipped and the walk goes on; False: the walk stops there.
    skip_refused: bool = False
    # True: `begin_pass` reads `AdmissionPass.preserved_blocks` (the scheduler fills it).
    reads_preserved_blocks: bool = False
    # True: `begin_pass` reads `AdmissionPass.replica_rooms` and `candidate_replicas` (the
    # scheduler fills them on a fleet whose replicas step on their own).
    reads_replicas: bool = False

    def begin_pass(self, admission_pass: AdmissionPass) -> None:
        """Once per admission pass, before the first candidate."""

    def shortlist(self) -> Collection | None:
        """After `begin_pass`: the keys this pass may admit, or None (default) for any. A
        controller that chooses a set up front (BROS's per-iteration selection) names it here,
        and the walk then treats every other candidate as refused with no displacement, without
        building it: in overload the queue holds thousands of generations and only a handful
        are chosen. `may_admit_candidate` must refuse, and `displacement_for` name nothing for,
        a key outside the shortlist."""
        return None

    def shortlist_positions(self) -> Sequence[int] | None:
        """After `begin_pass`, for a controller that skips refused candidates: the positions
        in this pass's `AdmissionPass.keys` of the shortlist's keys, ascending, or None
        (default) for the scheduler to find them. A controller that decided by position (a
        walk over the pass's candidates) knows them; finding them is a test of every queued
        key against the shortlist, at every pass."""
        return None

    @abstractmethod
    def may_admit_candidate(self, batch: Sequence[RunningGen], candidate: Candidate,
                            free_kv_blocks: int) -> tuple[bool, str]:
        """(admit `candidate` next to `batch`?, why not)."""

    def displacement_for(self, batch: Sequence[RunningGen], candidate: Candidate,
                         free_kv_blocks: int) -> list[str]:
        """Keys of running generations to preempt so that a refused `candidate` fits (BROS's
        "yield blocks from best-effort work"); each is aborted and queued again."""
        return []

    def yield_below(self, running: Sequence[RunningGen], now: float,
                    rate: float | None) -> float | None:
        """After each admission pass, given the running batch: a priority such that running
        generations ranking below it (were they queued now) should be suspended at their next
        segment boundary, because the batch is too large for the work above it; None (default)
        for no such request. Called only for policies with `suspend_when == "contended"`."""
        return None

    def yield_keys(self, running: Sequence[RunningGen], now: float) -> Collection[str]:
        """After each admission pass, given the running batch: keys of running generations to
        suspend at their next segment boundary, whatever their priority (a controller that
        decides yields per generation rather than by a priority bar); none by default. Called
        only for policies with `suspend_when == "contended"`."""
        return ()

    def may_admit(self, running, rate, free_kv_blocks, blocks_needed):
        raise TypeError(f"{type(self).__name__} admits candidates: the scheduler calls "
                        "may_admit_candidate")


class Gate(Protocol):
    """Holds admissions (prefills) back for a while (003's Lagrangian prefill/decode gate)."""

    def decide(self, waiting_prompt_tokens: Sequence[float], decoding: int) -> str:
        """"prefill" to run the admission pass, anything else to hold it."""

    def note_decode_round(self, decoding: int) -> None: ...

    def note_prefill(self) -> None: ...
