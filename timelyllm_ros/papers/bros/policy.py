"""002 (BROS): RT/BE classification, per-iteration selection and adaptive batch size."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from timelyllm_ros.core.engine.base import EngineNeeds
from timelyllm_ros.core.policies.builtin import TimelyPolicy
from timelyllm_ros.core.policies.registry import PolicyDefinition
from timelyllm_ros.core.sched.interface import (AdmissionPass, CandidateAdmission, GenerationInfo,
                                                Policy, SchedulerContext, StepInfo)
from timelyllm_ros.core.sched.queue_view import QueueView
from timelyllm_ros.papers.common import engine_profile, kv_blocks_ok

if TYPE_CHECKING:
    from timelyllm_ros.papers.bros.column_selection import ColumnSelection, RequestColumns
    from timelyllm_ros.papers.bros.selection import Selection


def _service_class(*, urgent: bool, deadline_s: float, now: float, tokens_left: int,
                   t_avg_s: float, be_slack_s: float) -> str:
    """RT or BE for one generation, as BROS's admission and the engine both see it: its segment
    is one token group of k = tokens_left tokens, slack = deadline - now - (k - 1) * T_avg."""
    from timelyllm_ros.papers.bros.requests import classify_robot_work
    slack = deadline_s - now - (max(1, tokens_left) - 1) * t_avg_s
    return classify_robot_work(urgent=urgent, slack_s=slack, be_slack_s=be_slack_s)


class BrosAdmission(CandidateAdmission):
    """Runs BROS's per-iteration selection once per admission pass and admits the queued
    generations it selects (in the scheduler's walk order; refusals are skipped, since the
    selection is a set, not a prefix of the order).

    The running batch enters the selection as decode requests (k_i = tokens left in the
    segment), queued generations as prefills (Ln = estimated uncached prompt tokens).

    FindPreemptBlock, the room an RT generation may count on besides free blocks:
    - on the simulated engine with bidirectional KV blocks the policy built for itself, the BE
      slots it would overwrite (the engine's `rt_room_blocks`); the engine does the overwrite;
    - on a paged KV (the real engine, `bros-recompute`) with `displace_be`, the blocks running BE
      generations hold privately: when a selected RT generation lacks KV, `displacement_for`
      names BE generations to preempt by recompute (newest first, as vLLM picks its victims),
      and the scheduler aborts them and queues them again - the paper's "no bi-cache" baseline
      ("recomputation for requests failing to acquire cache blocks"), done from outside vLLM.
    Otherwise running generations keep their tokens until their segment ends: an RT request the
    selection would leave out still decodes, since vLLM owns the iteration. The adaptive batch
    limit (`AdaptiveBatchSize`) bounds running + admitted.
    """

    skip_refused = True

    def __init__(self, policy: "BrosPolicy", ctx: SchedulerContext):
        from timelyllm_ros.papers.bros.cost_model import BrosCostModel
        from timelyllm_ros.papers.bros.selection import AdaptiveBatchSize, BrosScheduler
        profile = engine_profile(ctx, policy.profile)
        cost = BrosCostModel.from_engine_profile(
            profile, kv_bytes_per_token=int(ctx.kv_bytes_per_token),
            host_link_bytes_per_s=ctx.host_link_bytes_per_s)
        cap = max(policy.b_base, policy.b_max or ctx.max_num_seqs or (1 << 14))
        self.scheduler = BrosScheduler(cost, batch=AdaptiveBatchSize(policy.b_base, cap),
                                       t_avg_init_s=policy.t_avg_init_s,
                                       t_avg_alpha=policy.t_avg_alpha)
        self.policy = policy
        self.block_size = ctx.kv_block_size
        from timelyllm_ros.papers.bros.engine import BidirectionalKvEngine
        # RT generations may overwrite BE slots only on the bidirectional engine this policy
        # asked for (`engine_needs`); elsewhere BE work yields its blocks by preemption.
        engine = ctx.engine if policy.engine_needs().simulated_engine is not None else None
        self.rt_room = engine.rt_room_blocks if isinstance(engine, BidirectionalKvEngine) \
            else None
        self.displaces = policy.displace_be and self.rt_room is None
        # The queued generations this pass selected, and those of them that are RT.
        self.allowed: set = set()
        self.selected_rt: set = set()
        # Room only RT generations have: overwritable BE slots, or BE blocks to preempt.
        self.rt_extra_blocks = 0
        self.be_victims: list[tuple[str, int]] = []  # (key, private blocks), newest first
        self._selection: ColumnSelection | None = None

    def begin_pass(self, p: AdmissionPass) -> None:
        t_avg = self.scheduler.t_avg_s
        be_slack = self.policy.be_slack_s
        running = p.running
        self.be_victims = []
        per_skill_set = Counter(g.skill_set for g in running)
        running_rt = []
        for g in running:
            k = max(1, g.remaining_tokens)
            is_rt = _service_class(urgent=g.is_urgent, deadline_s=g.deadline_s, now=p.now,
                                   tokens_left=k, t_avg_s=t_avg, be_slack_s=be_slack) == "rt"
            running_rt.append(is_rt)
            if not is_rt and self.displaces:
                self.be_victims.append((g.key, self._private_blocks(g, per_skill_set)))
        self.be_victims.reverse()  # p.running is in admission order
        requests = _pass_requests(p, running_rt, t_avg, be_slack)
        self.rt_extra_blocks = 0
        if self.rt_room is not None:
            self.rt_extra_blocks = max(0, self.rt_room() - p.free_kv_blocks)
        elif self.displaces:
            self.rt_extra_blocks = sum(blocks for _, blocks in self.be_victims)
        oracle = _FreeSlots(p.free_kv_blocks * self.block_size,
                            (p.free_kv_blocks + self.rt_extra_blocks) * self.block_size)
        sel = self.scheduler.select_columns(requests, blocks=oracle)
        self._selection = sel
        # Rows from len(running) on are the queued generations (the rest are already running).
        queued_from = len(running)
        ids = requests.req_ids
        self.allowed = {ids[i] for i in sel.batch if i >= queued_from}
        self.selected_rt = {ids[i] for i in sel.rt if i >= queued_from}

    @property
    def last_selection(self) -> "Selection | None":
        """The last pass's selection, with a `BrosRequest` per request (built on demand: the
        pass itself selects on columns)."""
        return None if self._selection is None else self._selection.to_selection()

    def shortlist(self):
        """The generations this iteration's selection chose (the walk skips the rest)."""
        return self.allowed

    def may_admit(self, running, rate, free_kv_blocks, blocks_needed):
        if blocks_needed > free_kv_blocks:
            return False, f"kv blocks: need {blocks_needed}, free {free_kv_blocks}"
        return True, "kv blocks suffice (BROS selects in begin_pass)"

    def may_admit_candidate(self, batch, candidate, free_kv_blocks):
        if candidate.key not in self.allowed:
            return False, "not selected by BROS this iteration"
        if candidate.key in self.selected_rt and self.rt_room is not None:
            # FindPreemptBlock: overwritable BE slots count (the engine checks the real need).
            free_kv_blocks = (self._with_shared_prompt(batch, candidate, free_kv_blocks)
                              + self.rt_extra_blocks)
        return kv_blocks_ok(candidate, free_kv_blocks)

    def displacement_for(self, batch, candidate, free_kv_blocks) -> list[str]:
        """BE generations to preempt by recompute so that a selected RT candidate fits (newest
        first, only as many as it needs); none if even all of them would not make room."""
        if not self.displaces or candidate.key not in self.selected_rt:
            return []
        room = self._with_shared_prompt(batch, candidate, free_kv_blocks)
        live = {g.key for g in batch}
        victims = []
        for key, blocks in self.be_victims:
            if room >= candidate.blocks_needed:
                break
            if key in live:
                victims.append(key)
                room += blocks
        return victims if room >= candidate.blocks_needed else []

    def _with_shared_prompt(self, batch, candidate, free_kv_blocks: int) -> int:
        # A system prompt that a running generation holds is shared, not allocated again.
        if any(g.skill_set == candidate.skill_set for g in batch):
            shared = min(candidate.shared_tokens, max(0, candidate.context_tokens - 1))
            free_kv_blocks += shared // self.block_size
        return free_kv_blocks

    def _private_blocks(self, gen, per_skill_set: Counter) -> int:
        """Blocks preempting `gen` would free: all of its context but a skill-set prompt that
        another running generation still holds (`per_skill_set`: running generations per skill
        set, counted once per pass)."""
        blocks = -(-gen.context_tokens // self.block_size)
        if per_skill_set[gen.skill_set] > 1:
            blocks -= gen.shared_tokens // self.block_size
        return max(0, blocks)

    def note_admission(self) -> None:
        pass

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None:
        pass


def _pass_requests(p: AdmissionPass, running_rt: list[bool], t_avg_s: float,
                   be_slack_s: float) -> "RequestColumns":
    """The pass's requests as BROS sees them, as columns (what `segment_request` gives per
    request, computed with the same operations): the running batch first, as decode requests
    (k = tokens left in its segment; `running_rt` holds their classes), then the queued
    generations in walk order, as prefills (Ln = estimated uncached prompt tokens). Slack counts
    from now: t_since = now - now = 0 and T_SLO = deadline - now."""
    from timelyllm_ros.papers.bros.column_selection import RequestColumns
    view, rows, now, running = p.view, p.rows, p.now, p.running
    deadline = view.reference_s[rows] + view.ert_s[rows]
    bound = np.maximum(view.bound_tokens[rows], 1)
    # `_service_class` for every queued row at once (the same arithmetic, in the same order).
    slack = deadline - now - (bound - 1) * t_avg_s
    queued_rt = view.is_urgent[rows] | ~(slack > be_slack_s)  # (NaN slack: RT)
    n_running, n = len(running), len(running) + len(rows)
    prefill = np.zeros(n, dtype=bool)
    prefill[n_running:] = True
    return RequestColumns(
        req_ids=[("run", g.key) for g in running] + list(p.keys),
        is_rt=np.concatenate([np.array(running_rt, dtype=bool), queued_rt]),
        prefill=prefill,
        new_tokens=np.concatenate([np.ones(n_running, dtype=np.int64),
                                   np.maximum(view.prefill_tokens[rows], 1)]),
        context_tokens=np.concatenate([
            np.array([g.context_tokens for g in running], dtype=np.int64),
            view.context_tokens[rows]]),
        t_since_token_s=np.zeros(n),
        tokens_left=np.concatenate([
            np.array([max(1, g.remaining_tokens) for g in running], dtype=np.int64), bound]),
        slo_s=np.concatenate([np.array([g.deadline_s for g in running], dtype=np.float64) - now,
                              deadline - now]),
        host_slots=np.zeros(n, dtype=np.int64))


class _FreeSlots:
    """BROS's FindBlock from the admission's point of view: free slots for anyone, and for RT
    requests also the BE slots they may overwrite (`rt_slots`; none on a plain paged KV)."""

    def __init__(self, slots: int, rt_slots: int | None = None):
        self.slots = int(slots)
        self.rt_slots = self.slots if rt_slots is None else int(rt_slots)

    def rt_capacity(self, req_id) -> int:
        return self.rt_slots

    def be_capacity(self, req_id) -> int:
        return self.slots


@dataclass
class _BrosAdmissionParams:
    """BROS's admission controller and its parameters, shared by `bros` and `timelyllm-bros`.
    `be_slack_s`: a normal segment is BE while its slack exceeds this; `b_base`: the adaptive
    batch size's base (the paper's 128 never binds at our batch sizes, see docs/policies.md);
    `b_max`: its cap (default: the engine's max_num_seqs); `displace_be`: on a paged KV, let an
    RT generation short of KV preempt running BE generations by recompute (see BrosAdmission)."""

    be_slack_s: float = 5.0
    b_base: int = 16
    b_max: int | None = None
    t_avg_init_s: float = 0.025
    t_avg_alpha: float = 0.2
    displace_be: bool = True
    # RT before BE in the engine too: admission order and preemption victims (vLLM priority
    # scheduling on the real engine; BidirectionalKvEngine orders by class itself).
    engine_scheduling: str = "priority"
    profile: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.be_slack_s >= 0:
            raise ValueError(f"be_slack_s must be >= 0, got {self.be_slack_s}")
        if self.b_base < 1:
            raise ValueError(f"b_base must be >= 1, got {self.b_base}")
        self._admission: BrosAdmission | None = None

    def make_admission(self, ctx: SchedulerContext):
        self._admission = BrosAdmission(self, ctx)
        return self._admission

    def on_step(self, step: StepInfo) -> None:
        if self._admission is not None and step.duration_s > 0:
            self._admission.scheduler.observe(step.duration_s)

    @property
    def t_avg_s(self) -> float:
        return self._admission.scheduler.t_avg_s if self._admission else self.t_avg_init_s

    def service_class(self, gen: GenerationInfo, now: float) -> str:
        """The class BROS's selection gives the generation, for the engine: a priority engine
        serves BE after RT, the bidirectional-KV engine places them at opposite ends."""
        return _service_class(urgent=gen.is_urgent, deadline_s=gen.deadline_s, now=now,
                              tokens_left=gen.bound_tokens, t_avg_s=self.t_avg_s,
                              be_slack_s=self.be_slack_s)

    @property
    def stats(self) -> dict[str, Any]:
        if self._admission is None:
            return {}
        s = self._admission.scheduler
        return {"iterations": s.iterations, "hits": s.hits, "batch_limit": s.batch.current,
                "t_avg_s": s.t_avg_s}


@dataclass
class BrosPolicy(_BrosAdmissionParams, Policy):
    """BROS (002) for a robot fleet: urgent or tight segments are RT (served by slack), the rest
    BE (in arrival order), admitted by BROS's per-iteration selection.

    `bidirectional_kv`: evaluate it in simulation on `BidirectionalKvEngine` (BROS's shared
    RT/BE blocks with lazy checkpointing); False (`bros-recompute`) = the standard paged engine,
    where room for RT work comes only from preemption by recompute, as on the real engine."""

    name: str = "bros"
    dispatch: str = "segment"
    bidirectional_kv: bool = True

    def engine_needs(self) -> EngineNeeds:
        if not self.bidirectional_kv:
            return super().engine_needs()
        from timelyllm_ros.papers.bros.engine import BidirectionalKvEngine
        return replace(super().engine_needs(), simulated_engine=BidirectionalKvEngine)

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        from timelyllm_ros.papers.bros.requests import split_queue
        k = np.maximum(view.bound_tokens, 1)
        t_avg = self.t_avg_s
        rt_rows, be_rows = split_queue(view, now, k - 1, t_avg_s=t_avg, be_slack_s=self.be_slack_s)
        slack = np.add(view.reference_s, view.ert_s)
        slack -= now + (k - 1) * t_avg
        out = np.empty(len(view))
        out[rt_rows] = 1e7 - slack[rt_rows]          # RT first, least slack first
        out[be_rows] = -1e7 - view.arrival_s[be_rows]  # then BE in arrival order
        return out


@dataclass
class TimelyBrosPolicy(_BrosAdmissionParams, TimelyPolicy):
    """TimelyLLM's priorities (PUD scaled by slack) with BROS's per-iteration selection as the
    admission controller instead of the latency-guided one (Tres check, BE packing, adaptive
    batch size)."""

    name: str = "timelyllm-bros"


# The policies this paper adds, by name (entry points in setup.py, group timelyllm_ros.policies).
BROS = PolicyDefinition(BrosPolicy, name="bros")
BROS_RECOMPUTE = PolicyDefinition(BrosPolicy, name="bros-recompute", bidirectional_kv=False)
TIMELYLLM_BROS = PolicyDefinition(TimelyBrosPolicy, name="timelyllm-bros", slack_scaling="max_slack_g")
