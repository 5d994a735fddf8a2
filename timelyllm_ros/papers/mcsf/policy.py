"""001 (MC-SF): shortest first with the look-ahead KV check, and its combination with TimelyLLM."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from timelyllm_ros.core.policies.registry import PolicyDefinition
from timelyllm_ros.core.sched.admission import LatencyGuidedAdmission
from timelyllm_ros.papers.mcsf.admission import McsfAdmission

from timelyllm_ros.core.sched.interface import (CandidateAdmission, Policy, RunningGen,
                                                SchedulerContext)
from timelyllm_ros.core.policies.builtin import TimelyPolicy
from timelyllm_ros.core.sched.queue_view import QueueView
from timelyllm_ros.papers.common import kv_blocks_ok


class McsfLookaheadAdmission(CandidateAdmission):
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
        ok, why = kv_blocks_ok(candidate, free_kv_blocks)
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
            # A running generation has part of its bound left; a candidate all of it.
            rem = g.remaining_tokens if isinstance(g, RunningGen) else g.bound_tokens
            pairs.append((g.context_tokens - s, rem))
        prefix_blocks = sum(s // la.block_size for s in shared.values())
        peak, at = la.peak_blocks(pairs)
        if peak + prefix_blocks > la.capacity_blocks:
            return False, (f"look-ahead: {at} tokens ahead the batch would hold {peak} + "
                           f"{prefix_blocks} shared blocks > capacity {la.capacity_blocks}")
        return True, f"look-ahead peak {peak} + {prefix_blocks} shared blocks"


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
            # papers.mcsf.unit_model.utility_key: (-weight / o, arrival); weight = utility lost per second.
            w = np.multiply(view.initial_utility, view.slope)
            return np.divide(w, o, out=o)
        # papers.mcsf.unit_model.sf_key: (o, arrival, id); ties are served in submission (arrival) order.
        return np.negative(o, out=o)

    def make_admission(self, ctx: SchedulerContext):
        return McsfLookaheadAdmission(ctx.kv_capacity_tokens, ctx.kv_block_size,
                                      self.share_prefix)


class AllOfAdmission(CandidateAdmission):
    """Admit only if every controller agrees (candidate-aware; generic ones get the budgets)."""

    skip_refused = False

    def __init__(self, *controllers):
        self.controllers = controllers
        self._now = 0.0
        self._rate = None

    def begin_pass(self, admission_pass) -> None:
        self._now = admission_pass.now
        self._rate = admission_pass.rate
        for c in self.controllers:
            if isinstance(c, CandidateAdmission):
                c.begin_pass(admission_pass)

    def may_admit(self, running, rate, free_kv_blocks, blocks_needed):
        for c in self.controllers:
            ok, why = c.may_admit(running, rate, free_kv_blocks, blocks_needed)
            if not ok:
                return ok, why
        return True, "all controllers agree"

    def may_admit_candidate(self, batch, candidate, free_kv_blocks):
        budgets = None
        for c in self.controllers:
            if isinstance(c, CandidateAdmission):
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


# The policies this paper adds, by name (entry points in setup.py, group timelyllm_ros.policies).
MCSF = PolicyDefinition(McsfPolicy, name="mcsf", utility_weighted=False)
MCSF_UTILITY = PolicyDefinition(McsfPolicy, name="mcsf-utility", utility_weighted=True)
MCSF_SHARED = PolicyDefinition(McsfPolicy, name="mcsf-shared", utility_weighted=False, share_prefix=True)
TIMELYLLM_MCSF = PolicyDefinition(TimelyMcsfPolicy, name="timelyllm-mcsf", slack_scaling="max_slack_g")
