"""Simulated engine driven by a calibrated cost model, in virtual time.

`SimulatedEngine` stands in for vLLM in large replays: it does no inference. Each request carries
the text it should "generate" (`EngineRequest.scripted_text`), and every engine step emits one
token of it per running request while a virtual clock advances by the step cost predicted by an
`EngineProfile` (see cost_model.py), calibrated to a real model and GPU.

What it models from vLLM (V1 scheduler with automatic prefix caching), because scheduling results
depend on it:
- continuous batching: new requests are prefilled in the same step in which running ones decode;
- paged KV cache of `kv_block_size`-token blocks, `kv_total_blocks` in all, with automatic prefix
  caching: a new request reuses the longest run of cached blocks of its prompt and only pays
  prefill for the rest (`num_cached_tokens`); freed blocks stay cached until evicted (blocks.py);
- preemption by recompute: when a running request needs a new block and none is free, the newest
  running request loses its blocks and goes back to the head of the waiting queue with everything
  it generated appended to its prompt; it is prefilled again later (mostly from the prefix cache
  if its blocks were not evicted meanwhile). Waiting requests are admitted in FCFS order only
  when all running requests got their blocks, and only while blocks are free;
- `scheduling_policy="priority"` (vLLM's option of that name): waiting requests are admitted,
  and preemption victims chosen, by (priority, arrival) instead, the priority coming from the
  request's service class (`engine_priority`: best-effort work last). This is how a policy that
  separates real-time from best-effort work (BROS) orders the real engine from outside it.

Pause handling (LAMPS / INFERCEPT: preserve, discard or swap a suspended request's KV) is in
pauses.py, the request records and queues in requests.py, the tokenizer in tokenizer.py; this
module is the step that ties them together.

Token budget and chunked prefill (vLLM V1): a step computes at most
`profile.max_num_batched_tokens` tokens. Running requests are scheduled first (a decode takes one
token, a prompt still being prefilled its next chunk), then waiting requests while budget is
left; a prompt longer than what is left is prefilled in chunks over several steps and emits its
first token on the step that completes it. Without the budget one step could prefill a whole
burst of prompts (tens of thousands of tokens, seconds of virtual time) and stall every decode
and every arrival behind it, which vLLM never does. Simplification: a request's KV blocks for
its whole prompt are allocated when it is admitted (vLLM allocates them chunk by chunk), so a
long prompt reserves its memory one or two steps early.

What it does not model: sampling, structured outputs (`output_regex` only costs the profile's
`constrained_seq_s` per sampling sequence and step, and the wait for the request's grammar,
`grammar_init_s`, before its admission: requests.py; the script is assumed valid), and an extra
EOS step (a request finishes on the step that emits the last token of its script).
"""

from __future__ import annotations

from typing import Sequence

from timelyllm_ros.core.engine.base import (ENGINE_SCHEDULING, EngineCapabilities, EngineOutput,
                                            ReplicaRoom, StepTiming, engine_priority)
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.blocks import PrefixCachedKv
from timelyllm_ros.core.engine.sim.pauses import PauseHandling
from timelyllm_ros.core.engine.sim.requests import RequestQueues, _Sequence
from timelyllm_ros.core.engine.sim.tokenizer import PieceTokenizer


class SimulatedEngine(PauseHandling, PrefixCachedKv, RequestQueues):
    """EngineAdapter over a calibrated cost model, in virtual time (see module docstring).

    The step and admission live here; the request queues, the prefix-cached KV blocks and the
    pause handling are mixins from their own modules, sharing this engine's state. Engine
    variants (BROS's bidirectional KV, MC-SF's clearing) override their protected methods."""

    name = "sim"

    def __init__(
        self,
        profile: EngineProfile | None = None,
        *,
        start_time: float = 0.0,
        max_num_seqs: int = 256,
        tokenizer: PieceTokenizer | None = None,
        kv_bytes_per_token: float = 131072.0,
        host_link_bytes_per_s: float = 25e9,
        scheduling_policy: str = "fcfs",
    ) -> None:
        self.profile = profile if profile is not None else EngineProfile()
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if scheduling_policy not in ENGINE_SCHEDULING:
            raise ValueError(f"scheduling_policy must be one of {ENGINE_SCHEDULING}, got "
                             f"{scheduling_policy!r}")
        self.scheduling_policy = scheduling_policy
        self.max_num_seqs = max_num_seqs
        self._step_tokens = self.profile.max_num_batched_tokens
        if self._step_tokens < max_num_seqs:
            # vLLM refuses this too: a full batch of decodes would not fit one step.
            raise ValueError(f"max_num_batched_tokens ({self._step_tokens}) must be >= "
                             f"max_num_seqs ({max_num_seqs})")
        self._budget = self._step_tokens  # tokens left in the step being scheduled
        self._constrained_cost = self.profile.charges_constraints
        self.tokenizer = tokenizer if tokenizer is not None else PieceTokenizer()
        self._clock = float(start_time)
        self._init_kv(self.profile.kv_total_blocks, self.profile.kv_block_size)
        self._init_queues()
        self._last_timing = StepTiming()
        self._init_pauses(kv_bytes_per_token, host_link_bytes_per_s)

    # ---- clock ----

    def now(self) -> float:
        return self._clock

    def advance_idle(self, until: float) -> None:
        if until > self._clock:
            self._clock = float(until)

    # ---- tokenizer and limits ----

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.tokenize(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        # No chat template: the messages' contents, one per line.
        return self.tokenize("\n".join(m["content"] for m in messages) + "\n")

    def max_model_len(self) -> int:
        return self.profile.max_model_len

    def max_num_batched_tokens(self) -> int:
        return self._step_tokens

    def capabilities(self) -> EngineCapabilities:
        return EngineCapabilities(pause_handling=True, max_num_seqs=self.max_num_seqs,
                                  profile=self.profile, kv_bytes_per_token=self.kv_bytes_per_token,
                                  host_link_bytes_per_s=self.host_link_bytes_per_s)

    def last_step_timing(self) -> StepTiming:
        return self._last_timing

    def replica_for(self, request_id: str) -> int | None:
        return None  # one engine, not a fleet

    def replica_rooms(self) -> list[ReplicaRoom] | None:
        return None  # one engine, not a fleet

    def shutdown(self) -> None:
        for rid in list(self._by_id) + list(self._paused):
            self.abort_request(rid)

    # ---- one iteration ----

    def step(self) -> list[EngineOutput]:
        """One iteration, scheduled as vLLM V1 does: the running requests first (a decode takes
        one token of the step's budget, a prompt still being prefilled its next chunk), then
        waiting requests while budget and KV last. A request whose prompt is not all computed at
        the end of the step emits nothing yet."""
        self._budget = self._step_tokens
        preempted = self._reserve_decode_blocks()
        running = list(self._running)
        for seq in running:
            self._schedule_tokens(seq)
        admitted, swap_in_s = ([], 0.0) if preempted else self._admit_waiting()
        # A request the budget left out this step (behind an older chunked prefill) computes
        # nothing and keeps whatever it reserved for its next token.
        computing = self._decodes_computed([s for s in running if s.chunk])

        prefill_tokens = 0
        for seq in computing + admitted:
            if seq.prefill_pending:
                prefill_tokens += seq.chunk
            seq.num_computed += seq.chunk
            seq.prefill_pending = seq.num_computed < len(seq.tokens)
        batch = computing + admitted
        context = sum(seq.num_computed for seq in batch)
        duration = self.profile.step_s(prefill_tokens, len(batch), context)
        if self._constrained_cost:  # grammar work of the sequences that sample
            duration += sum(self.profile.constrained_seq_s(seq.request.output_regex)
                            for seq in batch if not seq.prefill_pending)
        swap_s = 0.0
        if batch:
            swap_s = self._pending_swap_s + swap_in_s
            self._pending_swap_s = 0.0
            duration += swap_s
        self._clock += duration
        self._last_timing = StepTiming(
            duration_s=duration,
            batch_size=len(batch),
            prefill_tokens=prefill_tokens,
            extra={
                "context_tokens": context,
                "admitted": [s.request.request_id for s in admitted],
                "preempted": preempted,
                "cached_tokens": sum(s.cached_at_admission for s in admitted),
                "swap_s": swap_s,
                "scheduled_tokens": self._step_tokens - self._budget,
                "partial_prefills": sum(1 for seq in batch if seq.prefill_pending),
            },
        )

        outputs = []
        for seq in batch:
            self._commit_full_blocks(seq)
            if not seq.prefill_pending:
                outputs.append(self._emit(seq, seq.cached_at_admission))
        return outputs

    def _schedule_tokens(self, seq: _Sequence) -> None:
        """Give `seq` its tokens of this step's budget: one for a decode, else the next chunk of
        its prompt (as much as is left of the budget)."""
        seq.chunk = min(len(seq.tokens) - seq.num_computed, self._budget)
        self._budget -= seq.chunk

    def _decodes_computed(self, decoding: list[_Sequence]) -> list[_Sequence]:
        """The running sequences (given after reservation and admission) that compute a token in
        this step: all of them here; a subclass may hold some back (KV partly off the device)."""
        return decoding

    # ---- preemption ----

    def _reserve_decode_blocks(self) -> list[str]:
        """Give each running sequence room for one more token, preempting if needed: the newest
        (FCFS), or the lowest-priority then newest (priority scheduling), as vLLM does."""
        preempted: list[str] = []
        i = 0
        while i < len(self._running):
            seq = self._running[i]
            need = self._blocks_for(seq.num_computed + 1) - len(seq.blocks)
            while need > self._pool.num_free():
                if self._revoke_preserved():
                    continue
                victim = self._preemption_victim()
                at = self._running.index(victim)
                del self._running[at]
                if at < i:
                    i -= 1  # it had its block already; the ones after it move up
                self._preempt(victim)
                preempted.append(victim.request.request_id)
                if victim is seq:
                    break
            else:
                for _ in range(need):
                    seq.blocks.append(self._pool.allocate())
                i += 1
        return preempted

    def _rank(self, seq: _Sequence) -> tuple[int, float]:
        """Sort key of priority scheduling: service class first, then arrival."""
        return engine_priority(seq.request.service_class), seq.arrival_s

    def _preemption_victim(self) -> _Sequence:
        if self.scheduling_policy == "priority":
            return max(self._running, key=self._rank)
        return self._running[-1]

    def _preempt(self, seq: _Sequence) -> None:
        # Recompute later: the sampled tokens become part of the prompt to prefill again.
        self._free_blocks(seq)
        self._waiting.insert(0, seq)

    # ---- admission ----

    def _admission_groups(self) -> list[list[_Sequence]]:
        """Waiting requests in the order admission tries them, in groups: the first request of
        a group that does not fit ends that group. One group here (preempted requests are at
        the head of the FCFS queue, as in vLLM); a subclass may serve classes separately."""
        if self.scheduling_policy == "priority":
            return [sorted(self._waiting, key=self._rank)]
        return [list(self._waiting)]

    def _admit_waiting(self) -> tuple[list[_Sequence], float]:
        """Admit waiting requests in `_admission_groups` order while slots, token budget and KV
        last. Returns the admitted sequences and the swap-in time their admission costs."""
        admitted: list[_Sequence] = []
        swap_in_s = 0.0
        if not self._running and self._waiting:
            soonest = min(seq.ready_s for seq in self._waiting)
            if soonest > self._clock:
                # Nothing runs and no grammar is ready: vLLM spins empty steps until one is.
                self._clock = soonest
        for group in self._admission_groups():
            for seq in group:
                if len(self._running) >= self.max_num_seqs or self._budget <= 0:
                    return admitted, swap_in_s
                if seq.ready_s > self._clock:
                    continue  # its grammar is not ready: vLLM schedules the others
                plan = self._placement(seq)
                while plan is None and not self._running and not admitted \
                        and self._revoke_preserved():
                    plan = self._placement(seq)  # nothing else would ever free room for it
                if plan is None:
                    break
                self._waiting.remove(seq)
                computed, cost = self._place(seq, plan)
                swap_in_s += cost
                self._admitted(seq, computed)
                admitted.append(seq)
        return admitted, swap_in_s

    def _placement(self, seq: _Sequence):
        """What admitting waiting `seq` takes, if it fits now (else None): its prefix-cache
        hits and the blocks to allocate."""
        if seq.blocks:  # resumed after a preserved pause: it still holds its blocks
            hits: list[tuple[int, int]] = []
            need_new = self._blocks_for(len(seq.tokens)) - len(seq.blocks)
            reclaimed = 0
        else:
            hits = self._prefix_hits(seq)
            need_new = self._blocks_for(len(seq.tokens)) - len(hits)
            ref = self._pool.ref
            reclaimed = sum(1 for b, _ in hits if ref[b] == 0)
        if need_new > self._pool.num_free() - reclaimed:
            return None
        return hits, need_new

    def _place(self, seq: _Sequence, plan) -> tuple[int, float]:
        """Give `seq` the KV its `_placement` found. Returns (tokens already computed, swap-in
        seconds)."""
        hits, need_new = plan
        if seq.blocks:
            computed, cost = seq.num_computed, 0.0
        else:
            computed, cost = self._attach_prefix_hits(seq, hits)
        for _ in range(need_new):
            seq.blocks.append(self._pool.allocate())
        return computed, cost

    def _admitted(self, seq: _Sequence, computed: int) -> None:
        """Book-keeping shared by every admission loop: `seq` starts with `computed` tokens
        already in the KV (prefix cache, kept blocks or host copy) and prefills the rest, chunk
        by chunk from this step on."""
        seq.num_computed = computed
        seq.cached_at_admission = computed
        seq.prefill_pending = True
        self._running.append(seq)
        self._schedule_tokens(seq)

    # ---- output ----

    def _emit(self, seq: _Sequence, cached_tokens: int | None) -> EngineOutput:
        rid = seq.request.request_id
        new_ids: list[int] = []
        if seq.generated < len(seq.script):
            new_ids = [seq.script[seq.generated]]
            seq.tokens.extend(new_ids)
        reason = None
        if seq.generated >= len(seq.script):
            reason = "stop"
        elif (seq.generated >= seq.request.max_tokens
              or len(seq.tokens) >= self.profile.max_model_len):
            reason = "length"
        report_cache = None
        if not seq.reported_cache:
            seq.reported_cache = True
            report_cache = cached_tokens if cached_tokens is not None else 0
        if reason is not None:
            self._running.remove(seq)
            del self._by_id[rid]
            self._free_blocks(seq)
        return EngineOutput(
            request_id=rid,
            new_token_ids=new_ids,
            new_text=self.tokenizer.decode(new_ids),
            finished=reason is not None,
            finish_reason=reason,
            num_cached_tokens=report_cache,
        )


class NoPrefixCacheEngine(SimulatedEngine):
    """SimulatedEngine with automatic prefix caching off: no request reuses blocks computed for
    another, so every prompt is prefilled in full (vLLM V0's default, enable_prefix_caching=False).
    Overrides the engine's one prefix-cache lookup, `_prefix_hits`."""

    name = "sim-no-prefix-cache"

    def _prefix_hits(self, seq):
        return []
