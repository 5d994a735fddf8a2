"""The seed papers' scheduling policies on the segment scheduler (docs/policies.md).

Each policy is a `Policy` that drives the same `SegmentScheduler` code path as TimelyLLM, on the
simulated and the real engine, through the scheduler's extension points (queue size columns,
`make_admission`, `make_gate`, `pause_handling`, `on_admitted` / `on_step` / `on_task_end`). The
algorithms themselves are the ones in `core.seeds` (the papers' reproductions); this module only
maps the robot-fleet queue onto them.

- `mcsf` (001): shortest first by the output bound of the next run (`bound_tokens`, the segment's
  max_tokens), ties by arrival; admission by MC-SF's look-ahead KV check at every completion time
  of the batch (`seeds.mcsf.McsfAdmission`, whole blocks). `mcsf-utility`: our weighted variant,
  order by U0 * k / o (Smith's rule with the TUF's initial utility times slope as the weight).
- `bros` (002): urgent segments and segments with little slack are real-time (RT), the rest
  best-effort (BE) (`seeds.bros.classify_robot_work`); RT by slack ascending, BE behind in arrival
  order; each admission pass runs BROS's selection (`seeds.bros.BrosScheduler`: Tres check,
  BE packing, TCP-like adaptive batch size) over the running batch and the queue and admits the
  queued generations it selects.
- `hybrid` (003): Algorithm 1's order (longest N_p + N_d first) and the Lagrangian
  prefill/decode gate (`seeds.hybrid.PrefillDecodeGate`) in front of every admission pass;
  `hybrid-nogate` is the order alone.
- `lamps` (004): memory-over-time ranking (`seeds.lamps.memory_time_score`, refreshed every k
  passes) with starvation promotion (`seeds.lamps.LampsQueue`, threshold 100), and per-pause
  preserve / discard / swap by least waste (`seeds.lamps.handling_for_pause`). Running segments
  are never preempted for rank (the `lamps-np` reading, see docs/seeds-002-004.md).
- Combinations with TimelyLLM's priorities: `timelyllm-mcsf` (plus MC-SF's look-ahead, next to
  the latency-guided admission) and `timelyllm-lamps` (plus LAMPS's pause handling).

`seeds.bros` and `seeds.hybrid` import SciPy; they are imported when such a policy builds its
controllers, so importing the policy registry stays light.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from timelyllm_ros.core.admission import LatencyGuidedAdmission
from timelyllm_ros.core.seeds.lamps import (LampsQueue, choose_handling, engine_time_fns,
                                            handling_for_pause, memory_time_score)
from timelyllm_ros.core.seeds.mcsf import McsfAdmission

from .base import PauseInfo, Policy, SchedulerContext, StepInfo, TimelyPolicy
from .queue_view import QueueView


def _profile(ctx: SchedulerContext, override: Any = None):
    """The engine cost model a policy prices work with: `override` (an EngineProfile or a YAML
    path), else the engine's own (simulated engine), else the default profile."""
    from timelyllm_ros.core.engine.cost_model import EngineProfile
    if isinstance(override, EngineProfile):
        return override
    if isinstance(override, (str, Path)):
        return EngineProfile.from_yaml(override)
    if ctx.profile is not None:
        return ctx.profile
    return EngineProfile()


def _kv_blocks_ok(candidate, free_kv_blocks: int) -> tuple[bool, str]:
    if candidate.blocks_needed > free_kv_blocks:
        return False, f"kv blocks: need {candidate.blocks_needed}, free {free_kv_blocks}"
    return True, ""


# ============================================================================ 001: MC-SF

class McsfLookaheadAdmission:
    """MC-SF's look-ahead in the scheduler's candidate-aware admission protocol.

    Running generations enter the check as (context now, tokens they may still generate in this
    run), the candidate as (its context, its bound); admission stops at the first refusal (MC-SF
    adds in order while the projected peak fits). The free-block check is kept as well: the
    look-ahead budget is the whole KV, and blocks the engine holds for other reasons (a warm-up
    request, a preserved pause) are not in the batch.

    `share_prefix`: count each skill set's shared prompt prefix once (the prefix cache stores it
    once for all its generations) instead of once per generation, which is what the literal
    check does; each generation then contributes its own tokens beyond that prefix, rounded up
    to whole blocks. Still an upper bound as long as the shared blocks are cached (two requests
    admitted in the same step with an uncached prefix may each compute it once).
    """

    skip_refused = False

    def __init__(self, kv_capacity_tokens: int, block_size: int, share_prefix: bool = False):
        self.lookahead = McsfAdmission(kv_capacity_tokens, block_size)
        self.share_prefix = bool(share_prefix)
        self.refusals = 0

    def may_admit(self, running, rate, free_kv_blocks, blocks_needed):
        return self.lookahead.may_admit(running, rate, free_kv_blocks, blocks_needed)

    def may_admit_candidate(self, batch, candidate, free_kv_blocks):
        ok, why = _kv_blocks_ok(candidate, free_kv_blocks)
        if ok and not self.share_prefix:
            ok, why = self.lookahead.may_admit_lookahead(
                [(g.context_tokens, g.remaining_tokens) for g in batch],
                (candidate.context_tokens, candidate.bound_tokens))
        elif ok:
            ok, why = self._shared_check(batch, candidate)
        self.refusals += not ok
        return ok, why

    def _shared_check(self, batch, candidate) -> tuple[bool, str]:
        la = self.lookahead
        shared: dict[str, int] = {}
        pairs = []
        for g in list(batch) + [candidate]:
            s = min(g.shared_tokens, max(0, g.context_tokens - 1))
            shared[g.skill_set] = max(shared.get(g.skill_set, 0), s)
            rem = g.remaining_tokens if hasattr(g, "remaining_tokens") else g.bound_tokens
            pairs.append((g.context_tokens - s, rem))
        prefix_blocks = sum(s // la.block_size for s in shared.values())
        peak, at = la.peak_blocks(pairs)
        if peak + prefix_blocks > la.capacity_blocks:
            return False, (f"look-ahead: {at} tokens ahead the batch would hold {peak} + "
                           f"{prefix_blocks} shared blocks > capacity {la.capacity_blocks}")
        return True, f"look-ahead peak {peak} + {prefix_blocks} shared blocks"

    def note_admission(self) -> None:
        pass

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None:
        pass


@dataclass
class McsfPolicy(Policy):
    """Memory-constrained shortest first (001). `utility_weighted`: order by U0 * k / o instead of
    o (our extension, `mcsf-utility`); equal weights give MC-SF's order."""

    name: str = "mcsf"
    dispatch: str = "segment"
    utility_weighted: bool = False
    share_prefix: bool = False

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        o = np.maximum(view.bound_tokens, 1).astype(np.float64)
        if self.utility_weighted:
            # seeds.mcsf.utility_key: (-weight / o, arrival); weight = utility lost per second.
            w = np.multiply(view.initial_utility, view.slope)
            return np.divide(w, o, out=o)
        # seeds.mcsf.sf_key: (o, arrival, id); ties are served in submission (arrival) order.
        return np.negative(o, out=o)

    def make_admission(self, ctx: SchedulerContext):
        return McsfLookaheadAdmission(ctx.kv_capacity_tokens, ctx.kv_block_size,
                                      self.share_prefix)


class AllOfAdmission:
    """Admit only if every controller agrees (candidate-aware; generic ones get the budgets)."""

    skip_refused = False

    def __init__(self, *controllers):
        self.controllers = controllers
        self._now = 0.0
        self._rate = None

    def begin_pass(self, admission_pass) -> None:
        self._now = admission_pass.now
        self._rate = getattr(admission_pass, "rate", None)
        for c in self.controllers:
            begin = getattr(c, "begin_pass", None)
            if begin is not None:
                begin(admission_pass)

    def may_admit(self, running, rate, free_kv_blocks, blocks_needed):
        for c in self.controllers:
            ok, why = c.may_admit(running, rate, free_kv_blocks, blocks_needed)
            if not ok:
                return ok, why
        return True, "all controllers agree"

    def may_admit_candidate(self, batch, candidate, free_kv_blocks):
        budgets = None
        for c in self.controllers:
            if hasattr(c, "may_admit_candidate"):
                ok, why = c.may_admit_candidate(batch, candidate, free_kv_blocks)
            else:
                if budgets is None:
                    budgets = [(g.tokens_this_run, g.deadline_s - self._now) for g in batch]
                ok, why = c.may_admit(budgets, self._rate, free_kv_blocks,
                                      candidate.blocks_needed)
            if not ok:
                return ok, why
        return True, "all controllers agree"

    def note_admission(self) -> None:
        for c in self.controllers:
            c.note_admission()

    def note_step(self, duration_s: float | None = None, batch_size: int | None = None) -> None:
        for c in self.controllers:
            c.note_step(duration_s, batch_size)


@dataclass
class TimelyMcsfPolicy(TimelyPolicy):
    """TimelyLLM's priorities and latency-guided admission, plus MC-SF's look-ahead KV check."""

    name: str = "timelyllm-mcsf"

    def make_admission(self, ctx: SchedulerContext):
        return AllOfAdmission(
            LatencyGuidedAdmission(max_segment_tokens=ctx.max_segment_tokens),
            McsfLookaheadAdmission(ctx.kv_capacity_tokens, ctx.kv_block_size))


# ============================================================================ 002: BROS

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
        profile = _profile(ctx, policy.profile)
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
        return _kv_blocks_ok(candidate, free_kv_blocks)

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


# ============================================================================ 003: hybrid

def time_model_of(profile):
    """seeds.hybrid.TimeModel (ms) from an EngineProfile: the paper's stage model on our engine
    (its per-context decode term is left out, as the paper's model has none)."""
    from timelyllm_ros.core.seeds.hybrid import TimeModel
    return TimeModel(prefill_fixed_ms=profile.prefill_fixed_s * 1e3,
                     prefill_per_token_ms=profile.prefill_per_token_s * 1e3,
                     decode_fixed_ms=profile.decode_fixed_s * 1e3,
                     decode_per_seq_ms=profile.decode_per_seq_s * 1e3)


@dataclass
class HybridPolicy(Policy):
    """003's online part: Algorithm 1's order (N_p + estimated N_d, longest first; N_p = the
    generation's context, N_d = its bound) and, with `gate`, the Lagrangian prefill/decode gate
    in front of every admission pass (prefill = admitting; C_d charged per decode round at the
    paper's marginal per-sequence cost). The offline packing needs the whole request set in
    advance and has no counterpart for arrivals over time; slot stealing is what a shared queue
    with continuous batching does anyway."""

    name: str = "hybrid"
    dispatch: str = "segment"
    gate: bool = True
    profile: Any = None

    def priorities(self, view: QueueView, now: float) -> np.ndarray:
        return np.add(view.context_tokens, view.bound_tokens).astype(np.float64)

    def make_gate(self, ctx: SchedulerContext):
        if not self.gate:
            return None
        from timelyllm_ros.core.seeds.hybrid import PrefillDecodeGate
        self._gate = PrefillDecodeGate(time_model_of(_profile(ctx, self.profile)))
        return self._gate


# ============================================================================ 004: LAMPS

def lamps_handling(pause: PauseInfo, profile_override: Any = None) -> str:
    """INFERCEPT's least-waste handling for one suspension: C_i = the generation's context,
    C_other = the rest of the running batch, T_INT = the execution-time model's estimate,
    T_fwd = a cold prefill of C_i on the engine profile, T_swap = C_i's KV over the host link."""
    ctx = pause.context
    t_fwd, t_swap = engine_time_fns(_profile(ctx, profile_override),
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
                    _profile(ctx, self.profile), kv_bytes_per_token=ctx.kv_bytes_per_token,
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


# ============================================================================ registration

def register_seed_policies(register, fixed) -> None:
    register("mcsf", fixed(McsfPolicy, name="mcsf", utility_weighted=False))
    register("mcsf-utility", fixed(McsfPolicy, name="mcsf-utility", utility_weighted=True))
    register("mcsf-shared", fixed(McsfPolicy, name="mcsf-shared", utility_weighted=False,
                                  share_prefix=True))
    register("bros", fixed(BrosPolicy, name="bros"))
    register("hybrid", fixed(HybridPolicy, name="hybrid", gate=True))
    register("hybrid-nogate", fixed(HybridPolicy, name="hybrid-nogate", gate=False))
    register("lamps", fixed(LampsPolicy, name="lamps"))
    register("timelyllm-mcsf", fixed(TimelyMcsfPolicy, name="timelyllm-mcsf",
                                      slack_scaling="max_slack_g"))
    register("timelyllm-lamps", fixed(TimelyLampsPolicy, name="timelyllm-lamps",
                                      slack_scaling="max_slack_g"))
    register("timelyllm-bros", fixed(TimelyBrosPolicy, name="timelyllm-bros",
                                     slack_scaling="max_slack_g"))
