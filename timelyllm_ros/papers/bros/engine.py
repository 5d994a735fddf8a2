"""Simulated engine with BROS's bidirectional KV blocks (seed paper 002, arXiv 2504.09590).

BROS lets a real-time (RT) and a best-effort (BE) request share a KV block: RT slots grow from
the block's left end, BE slots from its right end. When an RT request needs room and no empty
slot is within its reach, it overwrites BE slots; only the slots about to be overwritten are
copied to host memory (lazy checkpoint) and they are copied back when that BE request runs again.
`BidirectionalKvEngine` adds this to `SimulatedEngine` so that the scheduler's `bros` policy is
evaluated on the mechanism it was designed for, and `bros-recompute` (the standard engine, where
an RT request short of room can only get it by vLLM's preempt-the-newest-by-recompute) measures
the paper's ablation. Everything else (cost model, virtual clock, pauses) is the base engine's.

Design (why):
- Two kinds of KV live in one physical cache of `kv_total_blocks` blocks. Prefix-cache hits
  (e.g. a skill set's system prompt, or what a resumed generation computed before) stay ordinary
  paged blocks of the base `_BlockPool`: they are shared read-only by many requests, so no single
  RT request may overwrite them. Everything a request computes itself (its private tail:
  uncached prompt and generated tokens) is placed slot by slot in a shared region modelled by
  `papers.bros.bidirectional_kv.BidirectionalKV`, which already implements left/right fill, the lazy checkpoint,
  swap-in and the placement rules; it is reused, not re-implemented.
- The region has no fixed size: it borrows blocks from the paged pool when its empty slots do
  not suffice and returns a block as soon as it is completely empty. A fixed split would waste
  capacity on one side and make `bros` and `bros-recompute` run on different cache sizes.
  Borrowing evicts the least recently freed cached block, exactly as a new paged block would.
- Order inside a step: RT requests reserve their next slot first (they may overwrite), then BE
  requests (they never overwrite). Waiting requests are admitted in the same class order (RT,
  then BE; FCFS within a class), as BROS's selection takes Qrt before Qbe: a BE request that
  cannot be placed never holds back an RT request.
- What counts as free (`kv_usage`) is what a newcomer of either class can use without
  overwriting: a hole in a BE request's block is reachable only by that request or an RT
  request, and counting it would make the scheduler submit BE work the engine cannot place.
- A BE request with checkpointed slots copies them back before it computes (into the holes in
  its own blocks first); if they do not fit it waits in the running set, keeping its other
  slots, like a swapped-out request in vLLM waits for room. An RT request short of room first
  takes reachable BE slots; only when none are reachable does it fall back to preemption by
  recompute (newest BE first: an RT request is preempted only if no BE request is left to
  preempt). A BE request short of a slot for its next token is handled as vLLM would (preempt
  the newest BE by recompute), so BE requests among themselves behave as on the standard
  engine.
- Prefix caching of private tokens: while a request runs, its tail is private (an RT write may
  overwrite it, so it cannot be shared). When it releases its slots (finish, abort, discard or
  swap pause, preemption) its full, device-resident blocks are published to the prefix cache as
  free cached blocks, as vLLM's freed blocks stay cached. That keeps a resumed generation
  (prompt = old prompt + generated tokens) cheap, which the scheduler's suspend/resume relies
  on, and it keeps `bros` comparable with `bros-recompute`.
- Swap copies are synchronous and added to the step, with the base engine's link model
  (`slots * kv_bytes_per_token / host_link_bytes_per_s`), like its pause swaps. BROS overlaps
  them with compute (iteration = max(exec, swap)); adding them is the conservative choice and
  keeps every copy in this engine priced the same way.

Simplifications (and why they are acceptable):
- Which token sits in which slot is not tracked, only how many slots each request has on the
  device and on the host: the attention cost depends on counts, and a real block table maps any
  token to any slot. Consequently a request publishes to the prefix cache only as many leading
  full blocks as its device slots cover, and published blocks are not tied to the physical
  blocks that held the slots (free cached blocks are interchangeable in the pool).
- An RT request admitted in a step may overwrite slots a BE request prefilled in the same step;
  the copy is counted as if the RT write came after the BE's (it is rare: a BE is admitted only
  when there was room). A BE whose slots were overwritten before its decode in a step is held
  back for that step instead.
- A preserved pause keeps the request's slots (the region may still overwrite a BE's slots
  meanwhile, lazily, as for a running one); the resumed request keeps the side it had. If the
  resumed request keeps fewer tokens than were computed, the slots cannot be cut token by token
  and are released (published to the cache) and the request is admitted afresh.
- Requests with `service_class` None are served as BE (nothing marks them urgent).
"""

from __future__ import annotations

import math

from timelyllm_ros.core.engine.base import PRESERVE, EngineOutput, EngineRequest, KvUsage
from timelyllm_ros.core.engine.sim.blocks import _ROOT_HASH
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.engine.sim.pauses import common_prefix
from timelyllm_ros.core.engine.sim.requests import _Sequence
from timelyllm_ros.papers.bros.bidirectional_kv import BidirectionalKV
from timelyllm_ros.papers.bros.requests import BE, RT


class BidirectionalKvEngine(SimulatedEngine):
    """`SimulatedEngine` whose private KV sits in BROS's bidirectional blocks (module docstring)."""

    name = "sim-bidirectional-kv"

    def __init__(self, profile=None, **kwargs) -> None:
        super().__init__(profile, **kwargs)
        self.bidirectional_kv = BidirectionalKV(self._pool.num_blocks, self._block_size)
        self.bidirectional_kv.usable[:] = False  # every block starts in the paged pool
        # Requests holding a slot for a token they have not computed yet (reserved in a step in
        # which they were then held back).
        self._slot_reserved: set[str] = set()
        self._computing: set[str] = set()  # requests whose decode slot is in place this step
        self._step_bidir: dict[str, float] = {}
        self.bidir_stats: dict[str, float] = {
            "rt_overwrites": 0,          # RT placements that overwrote BE slots
            "checkpointed_slots": 0,     # BE slots copied to the host by those overwrites
            "swapped_in_slots": 0,       # checkpointed slots copied back before a BE ran again
            "swap_out_s": 0.0,
            "swap_in_s": 0.0,
            "stalled_steps": 0,          # BE request-steps held back with slots on the host
            "recompute_preemptions": 0,  # fallback when no BE slot was within an RT's reach
            "published_blocks": 0,       # private full blocks handed to the prefix cache
        }

    # ---- views ----

    def kv_usage(self) -> KvUsage:
        """Free blocks as any newcomer sees them: the paged pool's, plus the region's empty
        slots in blocks no BE request owns. Empty slots in a BE request's blocks are left out:
        only that request or an RT request can reach them, and a scheduler that counted them
        would hand the engine BE work it cannot place (`rt_room_blocks` is the RT view)."""
        usage = super().kv_usage()
        free = usage.free_blocks + self.bidirectional_kv.be_capacity(None) // self._block_size
        return KvUsage(free, usage.total_blocks, usage.block_size)

    def rt_room_blocks(self) -> int:
        """Blocks a new RT request could get now: free ones plus the BE slots it may overwrite
        (BROS's FindPreemptBlock, for an admission controller that plans with it)."""
        reachable = self._pool.num_free() * self._block_size + self.bidirectional_kv.rt_capacity(None)
        return reachable // self._block_size

    def region_blocks(self) -> int:
        """Blocks the bidirectional region currently borrows from the paged pool."""
        return int(self.bidirectional_kv.usable.sum())

    def pinned_blocks(self) -> int:
        held = sum(self.bidirectional_kv.gpu_slots(p.seq.request.request_id)
                   for p in self._paused.values())
        return super().pinned_blocks() + math.ceil(held / self._block_size)

    # ---- one iteration ----

    def step(self) -> list[EngineOutput]:
        self._step_bidir = {"checkpointed_slots": 0, "swapped_in_slots": 0,
                            "bidir_swap_out_s": 0.0, "bidir_swap_in_s": 0.0, "stalled": 0}
        outputs = super().step()
        self._last_timing.extra.update(self._step_bidir)
        return outputs

    def _side(self, seq: _Sequence) -> str:
        held = self.bidirectional_kv.kind_of(seq.request.request_id)
        if held is not None:
            return held
        return RT if seq.request.service_class == RT else BE

    def _reserve_decode_blocks(self) -> list[str]:
        """Give each running request a slot for its next token: RT first (they may overwrite BE
        slots), then BE (swapping their checkpointed slots back in, or waiting for room)."""
        kv = self.bidirectional_kv
        preempted: list[str] = []
        self._computing = set()
        for side in (RT, BE):
            for seq in list(self._running):
                rid = seq.request.request_id
                if rid in preempted or self._side(seq) != side:
                    continue
                # A prompt still being prefilled got slots for all of it when it was admitted.
                new = 0 if rid in self._slot_reserved or seq.prefill_pending else 1
                host = kv.host_slots(rid)
                if self._fits(rid, side, host + new):
                    if host:
                        self._swap_in(rid)
                    self._append(rid, side, new)
                    self._slot_reserved.add(rid)
                    self._computing.add(rid)
                elif host:
                    self._step_bidir["stalled"] += 1
                    self.bidir_stats["stalled_steps"] += 1
                else:
                    preempted += self._preempt_for(seq, side)
        if self._running and not self._computing and not preempted:
            # Every running request waits for its checkpoint and nothing would free room: give
            # up the newest one's KV (recompute) so the others can swap in.
            victim = self._running[-1]
            self._running.remove(victim)
            self._preempt(victim)
            self.bidir_stats["recompute_preemptions"] += 1
            preempted.append(victim.request.request_id)
        return preempted

    def _preempt_for(self, seq: _Sequence, side: str) -> list[str]:
        """Preempt by recompute until `seq`'s next slot fits (vLLM's fallback). An RT request
        gets here only when no BE slot is within its reach; RT requests are never preempted for
        a BE request's sake."""
        rid = seq.request.request_id
        preempted = []
        while True:
            if self._revoke_preserved():
                if self._fits(rid, side, 1):
                    break
                continue
            victim = next((s for s in reversed(self._running) if self._side(s) == BE), None)
            if victim is None and side == RT:
                victim = self._running[-1]
            if victim is None:  # unreachable: seq itself is a running BE
                break
            self._running.remove(victim)
            self._preempt(victim)
            self.bidir_stats["recompute_preemptions"] += 1
            preempted.append(victim.request.request_id)
            if victim is seq:
                return preempted
            if self._fits(rid, side, 1):
                break
        self._append(rid, side, 1)
        self._slot_reserved.add(rid)
        self._computing.add(rid)
        return preempted

    def _decodes_computed(self, decoding: list[_Sequence]) -> list[_Sequence]:
        kv = self.bidirectional_kv
        out = []
        for seq in decoding:
            rid = seq.request.request_id
            if rid not in self._computing:
                continue
            if kv.host_slots(rid):  # overwritten by an RT admitted in this step
                self._step_bidir["stalled"] += 1
                self.bidir_stats["stalled_steps"] += 1
                continue
            self._slot_reserved.discard(rid)
            out.append(seq)
        return out

    def _admission_groups(self) -> list[list[_Sequence]]:
        """BROS's class order: waiting RT requests first (they may take BE slots to get in),
        then BE; FCFS within a class, and each class stops at its first request that does not
        fit, as BROS's selection loops do. A BE request that cannot be placed therefore never
        holds back an RT request behind it, which a single FCFS queue would do."""
        return [[s for s in self._waiting if self._side(s) == side] for side in (RT, BE)]

    def _placement(self, seq: _Sequence):
        """(side, prefix-cache hits, slots to append, slots it needs in all) if the waiting
        `seq` can be placed now, else None; its private tail goes into the region."""
        kv = self.bidirectional_kv
        rid = seq.request.request_id
        side = self._side(seq)
        if kv.kind_of(rid) is not None:  # resumed after a preserved pause: keeps its slots
            hits = []
            reserved = 1 if rid in self._slot_reserved else 0
            new_slots = len(seq.tokens) - seq.num_computed - reserved
            need = new_slots + kv.host_slots(rid)
            reclaimed = 0
        else:
            hits = self._prefix_hits(seq)
            new_slots = need = len(seq.tokens) - len(hits) * self._block_size
            reclaimed = sum(1 for b, _ in hits if self._pool.ref[b] == 0)
        reach = kv.rt_capacity(rid) if side == RT else kv.be_capacity(rid)
        if need > (self._pool.num_free() - reclaimed) * self._block_size + reach:
            return None
        return side, hits, new_slots, need

    def _place(self, seq: _Sequence, plan) -> tuple[int, float]:
        kv = self.bidirectional_kv
        side, hits, new_slots, need = plan
        rid = seq.request.request_id
        cost = 0.0
        if kv.kind_of(rid) is not None:
            computed = seq.num_computed
            self._fits(rid, side, need)
            if kv.host_slots(rid):
                self._swap_in(rid)
            self._slot_reserved.discard(rid)
        else:
            computed, cost = self._attach_prefix_hits(seq, hits)
            self._fits(rid, side, new_slots)
        self._append(rid, side, new_slots)
        return computed, cost

    def _commit_full_blocks(self, seq: _Sequence) -> None:
        # Private slots are not shareable while their request runs (see module docstring);
        # their full blocks are published when the request releases them.
        pass

    # ---- slot placement ----

    def _fits(self, rid: str, side: str, n: int) -> bool:
        """Borrow pool blocks as far as needed for `n` more slots of `side` without overwriting;
        True if they fit (for RT: counting the BE slots it may overwrite)."""
        kv = self.bidirectional_kv
        if n <= 0 or kv.last_block_room(rid) >= n:
            return True
        reach = kv.reachable_empty_rt(rid) if side == RT else kv.be_capacity(rid)
        short = n - reach
        if short <= 0:
            return True
        if self._borrow_blocks(math.ceil(short / self._block_size)) * self._block_size >= short:
            return True
        return side == RT and n <= kv.rt_capacity(rid)

    def _borrow_blocks(self, count: int) -> int:
        count = min(count, self._pool.num_free())
        for _ in range(count):
            self.bidirectional_kv.set_usable(self._pool.allocate(), True)
        return count

    def _append(self, rid: str, side: str, n: int) -> None:
        if n <= 0:
            return
        kv = self.bidirectional_kv
        if side == BE:
            kv.append_be(rid, n)
            return
        taken = kv.append_rt(rid, n)
        if taken:
            cost = self._swap_s(taken)
            self._pending_swap_s += cost
            self.bidir_stats["rt_overwrites"] += 1
            self.bidir_stats["checkpointed_slots"] += taken
            self.bidir_stats["swap_out_s"] += cost
            self._step_bidir["checkpointed_slots"] += taken
            self._step_bidir["bidir_swap_out_s"] += cost

    def _swap_in(self, rid: str) -> None:
        slots = self.bidirectional_kv.swap_in(rid)
        cost = self._swap_s(slots)
        self._pending_swap_s += cost
        self.bidir_stats["swapped_in_slots"] += slots
        self.bidir_stats["swap_in_s"] += cost
        self._step_bidir["swapped_in_slots"] += slots
        self._step_bidir["bidir_swap_in_s"] += cost

    # ---- release ----

    def _free_blocks(self, seq: _Sequence) -> None:
        kv = self.bidirectional_kv
        rid = seq.request.request_id
        self._slot_reserved.discard(rid)
        if kv.kind_of(rid) is not None:
            on_device = kv.gpu_slots(rid)
            held = kv.blocks_of(rid)
            kv.release(rid)
            for block in held:  # completely empty blocks go back to the paged pool
                if kv.rt_fill[block] == 0 and kv.be_fill[block] == 0:
                    kv.set_usable(block, False)
                    self._pool.release(block)
            private = seq.num_computed - len(seq.blocks) * self._block_size
            self._publish(seq, min(on_device, private))
        super()._free_blocks(seq)

    def _publish(self, seq: _Sequence, private_tokens: int) -> None:
        """Hand the request's full private blocks to the prefix cache as free cached blocks."""
        bs = self._block_size
        first = len(seq.block_hashes)
        last = (first * bs + max(0, private_tokens)) // bs
        hashes = []
        parent = seq.block_hashes[-1] if seq.block_hashes else _ROOT_HASH
        for i in range(first, last):
            parent = hash((parent, tuple(seq.tokens[i * bs:(i + 1) * bs])))
            hashes.append(parent)
        # Tail first into the LRU free queue, so the prefix is evicted last (as in vLLM).
        for block_hash in reversed(hashes):
            if self._pool.lookup(block_hash) is not None or not self._pool.num_free():
                continue
            block = self._pool.allocate()
            self._pool.commit(block, block_hash)
            self._pool.release(block)
            self.bidir_stats["published_blocks"] += 1

    # ---- pauses ----

    def _swap_out_tokens(self, seq: _Sequence) -> int:
        # Private slots are held alone; those already checkpointed are on the host already.
        return (super()._swap_out_tokens(seq)
                + self.bidirectional_kv.gpu_slots(seq.request.request_id))

    def resume_request(self, request_id: str, request: EngineRequest) -> None:
        paused = self._paused.get(request_id)
        if paused is None or paused.handling != PRESERVE:
            super().resume_request(request_id, request)
            return
        seq = self._new_sequence(request)  # validates before anything is released
        del self._paused[request_id]
        old = paused.seq
        self.pause_stats["preserved_block_s"] += len(old.blocks) * (self._clock - paused.since)
        common = common_prefix(old.tokens, seq.tokens)
        if min(common, len(seq.tokens) - 1) >= old.num_computed:
            # All it computed is still the new request's prefix: it keeps blocks and slots.
            new_id = request.request_id
            self.bidirectional_kv.rename(request_id, new_id)
            if request_id in self._slot_reserved:
                self._slot_reserved.discard(request_id)
                self._slot_reserved.add(new_id)
            seq.blocks, seq.block_hashes = old.blocks, old.block_hashes
            seq.num_computed = old.num_computed
            old.blocks, old.block_hashes, old.num_computed = [], [], 0
        else:
            self._free_blocks(old)  # see the module docstring: admitted afresh
        self._waiting.insert(0, seq)
