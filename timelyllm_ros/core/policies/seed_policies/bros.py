"""002 (BROS): RT/BE classification, per-iteration selection and adaptive batch size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base import Policy, SchedulerContext, StepInfo, TimelyPolicy
from ..queue_view import QueueView
from .common import engine_profile, kv_blocks_ok


class BrosAdmission:
    """Runs BROS's per-iteration selection once per admission pass and admits the queued
    generations it selects (in the scheduler's walk order; refusals are skipped, since the
    selection is a set, not a prefix of the order).

    The running batch enters the selection as decode requests (k_i = tokens left in the
    segment), queued generations as prefills (Ln = estimated uncached prompt tokens). Running
    generations are never preempted: vLLM owns the iteration, and a segment is tens of tokens, so
    an RT/BE request the selection would leave out (or displace) still gets its tokens until its
    segment ends. The adaptive batch limit (`AdaptiveBatchSize`) bounds running + admitted.
    """

    skip_refused = True

    def __init__(self, policy: "BrosPolicy", ctx: SchedulerContext):
        from timelyllm_ros.core.seeds.bros import AdaptiveBatchSize, BrosCostModel, BrosScheduler
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
        self.allowed: set = set()
        self.last_selection = None

    def begin_pass(self, p) -> None:
        from timelyllm_ros.core.seeds.bros import classify_robot_work, segment_request
        t_avg = self.scheduler.t_avg_s
        be_slack = self.policy.be_slack_s
        rt, be = [], []
        for g in p.running:
            k = max(1, g.remaining_tokens)
            slack = g.deadline_s - p.now - (k - 1) * t_avg
            kind = classify_robot_work(urgent=g.is_urgent, slack_s=slack, be_slack_s=be_slack)
            r = segment_request(("run", g.key), now_s=p.now, reference_s=p.now,
                                deadline_s=g.deadline_s, tokens_left=k, prefill=False,
                                new_tokens=1, context_tokens=g.context_tokens, kind=kind)
            (rt if kind == "rt" else be).append(r)
        view, rows = p.view, p.rows
        deadline = (view.reference_s[rows] + view.ert_s[rows]).tolist()
        bound = np.maximum(view.bound_tokens[rows], 1).tolist()
        ctx_tokens = view.context_tokens[rows].tolist()
        prefill = np.maximum(view.prefill_tokens[rows], 1).tolist()
        urgent = view.is_urgent[rows].tolist()
        for j, key in enumerate(p.keys):
            slack = deadline[j] - p.now - (bound[j] - 1) * t_avg
            kind = classify_robot_work(urgent=urgent[j], slack_s=slack, be_slack_s=be_slack)
            r = segment_request(key, now_s=p.now, reference_s=p.now, deadline_s=deadline[j],
                                tokens_left=bound[j], prefill=True, new_tokens=prefill[j],
                                context_tokens=ctx_tokens[j], kind=kind)
            (rt if kind == "rt" else be).append(r)
        oracle = _FreeSlots(p.free_kv_blocks * self.block_size)
        sel = self.scheduler.select(rt, be, blocks=oracle)
        self.last_selection = sel
        self.allowed = {r.req_id for r in sel.batch if not isinstance(r.req_id, tuple)}

    def may_admit(self, running, rate, free_kv_blocks, blocks_needed):
        if blocks_needed > free_kv_blocks:
            return False, f"kv blocks: need {blocks_needed}, free {free_kv_blocks}"
        return True, "kv blocks suffice (BROS selects in begin_pass)"

    def may_admit_candidate(self, batch, candidate, free_kv_blocks):
        if candidate.key not in self.allowed:
            return False, "not selected by BROS this iteration"
        return kv_blocks_ok(candidate, free_kv_blocks)

    def note_admission(self) -> None:
        pass

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None:
        pass


class _FreeSlots:
    """BROS's FindBlock over a plain paged KV (no bidirectional blocks): free slots for anyone."""

    def __init__(self, slots: int):
        self.slots = int(slots)

    def rt_capacity(self, req_id) -> int:
        return self.slots

    def be_capacity(self, req_id) -> int:
        return self.slots


@dataclass
class _BrosAdmissionParams:
    """BROS's admission controller and its parameters, shared by `bros` and `timelyllm-bros`.
    `be_slack_s`: a normal segment is BE while its slack exceeds this; `b_base`: the adaptive
    batch size's base (the paper's 128 never binds at our batch sizes, see docs/policies.md);
    `b_max`: its cap (default: the engine's max_num_seqs)."""

    be_slack_s: float = 5.0
    b_base: int = 16
    b_max: int | None = None
    t_avg_init_s: float = 0.025
    t_avg_alpha: float = 0.2
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
    def stats(self) -> dict[str, Any]:
        if self._admission is None:
            return {}
        s = self._admission.scheduler
        return {"iterations": s.iterations, "hits": s.hits, "batch_limit": s.batch.current,
                "t_avg_s": s.t_avg_s}


@dataclass
class BrosPolicy(_BrosAdmissionParams, Policy):
    """BROS (002) for a robot fleet: urgent or tight segments are RT (served by slack), the rest
    BE (in arrival order), admitted by BROS's per-iteration selection."""

    name: str = "bros"
    dispatch: str = "segment"

    @property
    def t_avg_s(self) -> float:
        return self._admission.scheduler.t_avg_s if self._admission else self.t_avg_init_s

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        from timelyllm_ros.core.seeds.bros import split_queue
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


def register(register, fixed) -> None:
    register("bros", fixed(BrosPolicy, name="bros"))
    register("timelyllm-bros", fixed(TimelyBrosPolicy, name="timelyllm-bros",
                                     slack_scaling="max_slack_g"))
