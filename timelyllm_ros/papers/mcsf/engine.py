"""Simulated engine for MC-SF's vLLM-like baselines (seed 001): overflow clears requests.

The paper's alpha-protection baselines admit prompts below a memory threshold and let running
requests grow; when the batch then needs more KV than there is, they do not preempt one request
by recompute (as vLLM and `SimulatedEngine` do) but clear requests back to the queue, losing their
progress: with `beta=None` every running request ("alpha-protection greedy"), otherwise each one
independently with probability `beta` ("alpha-protection beta-clearing"). The clearing draw is
`papers.mcsf.round_policies.AlphaProtection.on_overflow`, the rule of the round-based reproduction, fed by a
seeded numpy Generator so runs are deterministic.

What "losing progress" means here:
- a cleared request goes back to the head of the waiting queue (cleared requests keep their
  running order, i.e. their admission order) with only its prompt; when it is admitted again it
  prefills the prompt and regenerates, one decode step each, every token it had produced in this
  engine request. Those tokens were already delivered, so they are not emitted again: the engine
  returns no output for them and resumes emitting with the first new token;
- the KV blocks a cleared request computed itself (every block it did not get from the prefix
  cache at its admission) are wiped from the prefix cache once no surviving request uses them,
  so the lost work cannot come back for free. Blocks it was served from the cache (a skill set's
  shared prompt, an earlier run of the same plan) stay cached, as they would for any request
  that leaves the engine;
- no waiting request is admitted in a step that cleared (as in the base engine's preemption).

Progress when a beta draw clears too little (or nobody): the paper's rule is that the round is
lost and clearing is retried in the next round ("to clear enough memory with extremely small
beta requires a significant time"). Here a lost round advances the clock by one decode step of the
surviving batch, produces nothing, and draws again; every draw clears each survivor with
probability beta > 0, so the overflow is resolved after a geometric number of lost rounds.
Clear-all always resolves it in one draw. Nothing else can make progress meanwhile, as in the
paper: a step is a round.

`clear_stats` counts overflow events (steps that overflowed), requests cleared, tokens
regenerated (decode work redone), lost rounds and the virtual seconds they cost.
"""

from __future__ import annotations

import weakref

import numpy as np

from timelyllm_ros.core.engine.base import EngineOutput
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.papers.mcsf.round_policies import AlphaProtection


class ClearingSimulatedEngine(SimulatedEngine):
    """`SimulatedEngine` whose KV overflow clears running requests (see module docstring)."""

    name = "sim-clearing"

    def __init__(self, profile: EngineProfile | None = None, *, beta: float | None = None,
                 seed: int = 0, **engine_kwargs) -> None:
        super().__init__(profile, **engine_kwargs)
        if beta is not None and (isinstance(beta, bool) or not 0.0 < float(beta) <= 1.0):
            raise ValueError(f"beta must be in (0, 1] or None (clear all), got {beta!r}")
        self.beta = None if beta is None else float(beta)
        self.seed = int(seed)
        # alpha only drives admission, which the scheduler's policy does; the engine needs the
        # rule's overflow draw alone.
        self._clearing = AlphaProtection(alpha=0.0, beta=1.0 if beta is None else self.beta)
        self._rng = np.random.default_rng(self.seed)
        # Request id -> tokens of this engine request already emitted before it was cleared:
        # regenerating up to there emits nothing.
        self._emitted_before_clear: dict[str, int] = {}
        self._silent_now: set[str] = set()
        self._cleared_now: list[str] = []
        # Leading blocks a sequence was served from the prefix cache at its last admission; the
        # rest it computed itself. Weak keys: the entry goes with the sequence.
        self._cache_hit_blocks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.clear_stats: dict[str, float] = {
            "overflow_events": 0, "requests_cleared": 0, "tokens_regenerated": 0,
            "lost_rounds": 0, "lost_s": 0.0,
        }

    # ---- requests leaving early drop their regeneration debt ----

    def abort_request(self, request_id: str) -> None:
        self._emitted_before_clear.pop(request_id, None)
        super().abort_request(request_id)

    def suspend_request(self, request_id: str, handling: str) -> None:
        self._emitted_before_clear.pop(request_id, None)
        super().suspend_request(request_id, handling)

    # ---- one iteration ----

    def step(self) -> list[EngineOutput]:
        self._silent_now.clear()
        self._cleared_now = []
        outputs = super().step()
        self._last_timing.extra["cleared"] = list(self._cleared_now)
        self._last_timing.extra["regenerated"] = sorted(self._silent_now)
        # Regenerated tokens were delivered before the clear; the scheduler must not see them
        # twice (a regeneration step never finishes a request, see `_emit`).
        return [o for o in outputs if o.request_id not in self._silent_now]

    def _reserve_decode_blocks(self) -> list[str]:
        """Room for one more token per running request; on overflow, clear by the rule.

        Returned ids go to the base step's `preempted` slot, which keeps admission out of a
        step that cleared."""
        cleared: list[str] = []
        overflowed = False
        while True:
            needs = [self._blocks_for(s.num_computed + 1) - len(s.blocks) for s in self._running]
            if sum(needs) <= self._pool.num_free():
                break
            if self._revoke_preserved():
                continue
            if not overflowed:
                overflowed = True
                self.clear_stats["overflow_events"] += 1
            held = np.array([[s.num_computed, 0] for s in self._running], dtype=np.int64)
            mask = np.asarray(self._clearing.on_overflow(
                held, self._pool.num_blocks * self._block_size, self._rng), dtype=bool)
            victims = [s for s, hit in zip(self._running, mask) if hit]
            self._clear(victims)
            cleared.extend(s.request.request_id for s in victims)
            survivors_need = sum(self._blocks_for(s.num_computed + 1) - len(s.blocks)
                                 for s in self._running)
            if survivors_need > self._pool.num_free():
                # The paper's lost round: nothing is processed, clearing is retried next round.
                lost = self.profile.decode_step_s(
                    len(self._running), sum(s.num_computed for s in self._running))
                self._clock += lost
                self.clear_stats["lost_rounds"] += 1
                self.clear_stats["lost_s"] += lost
        self._cleared_now = cleared
        for seq in self._running:
            for _ in range(self._blocks_for(seq.num_computed + 1) - len(seq.blocks)):
                seq.blocks.append(self._pool.allocate())
        return cleared

    def _clear(self, victims: list) -> None:
        if not victims:
            return
        computed_here: list[int] = []
        for seq in victims:
            self._running.remove(seq)
            rid = seq.request.request_id
            # A request cleared again while regenerating still owes what it emitted originally.
            self._emitted_before_clear[rid] = max(self._emitted_before_clear.get(rid, 0),
                                                  seq.generated)
            computed_here.extend(seq.blocks[self._cache_hit_blocks.get(seq, 0):])
            self._free_blocks(seq)
            del seq.tokens[seq.prompt_len:]
            seq.swap_tokens = 0
        # Wiped only once no survivor holds them: a block still in use is still in the KV.
        pool = self._pool
        for block in computed_here:
            if pool.ref[block] == 0 and pool.hash_of[block] is not None:
                if pool.cached.get(pool.hash_of[block]) == block:
                    del pool.cached[pool.hash_of[block]]
                pool.hash_of[block] = None
                pool.free.move_to_end(block, last=False)  # nothing left worth keeping
        self._waiting[:0] = victims
        self.clear_stats["requests_cleared"] += len(victims)

    def _prefix_hits(self, seq):
        hits = super()._prefix_hits(seq)
        # Called for the head of the queue on each admission attempt: the last call before the
        # sequence is admitted is the one that counts.
        self._cache_hit_blocks[seq] = len(hits)
        return hits

    def _emit(self, seq, cached_tokens: int | None) -> EngineOutput:
        rid = seq.request.request_id
        owed = self._emitted_before_clear.get(rid)
        if owed is None or seq.generated >= owed:
            return super()._emit(seq, cached_tokens)
        # Regenerating a token emitted before the clear: it is before the end of the script and
        # of max_tokens (it did not finish the request then), so it cannot finish it now.
        seq.tokens.append(seq.script[seq.generated])
        self.clear_stats["tokens_regenerated"] += 1
        if seq.generated >= owed:
            del self._emitted_before_clear[rid]
        self._silent_now.add(rid)
        return EngineOutput(request_id=rid, new_token_ids=[], new_text="")
