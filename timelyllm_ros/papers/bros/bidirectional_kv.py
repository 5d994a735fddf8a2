"""BROS's bidirectional KV blocks: a slot-exact model of the shared block layout.

RT grows from the left of a block, BE from the right, and only the BE slots actually overwritten
are checkpointed to host (lazy checkpoint). The simulated engine variant (`bros.engine`) and the
reproduction (`bros.reproduction`) both place their KV with it.
"""

from __future__ import annotations

from typing import Hashable

import numpy as np

from timelyllm_ros.papers.bros.requests import BE, RT

# Tokens per KV block (vLLM's default block size).
BLOCK_SLOTS = 16


class KVFull(RuntimeError):
    """An append or swap-in that cannot be placed; the KV state is left unchanged."""


class BidirectionalKV:
    """Slot-exact model of BROS's shared blocks.

    In block j, RT slots are `[0, rt_fill[j])` and BE slots are `[size - be_fill[j], size)`; one
    RT and one BE request may share a block. Placement rules:

    * RT: empty slots of its own blocks (newest first), then the RT-free block with the most
      empty slots; only when no reachable slot is empty, overwrite BE slots (in its own blocks,
      newest first, else in a BE-only block) - the overwritten BE slots are checkpointed to
      host, one for one (lazy checkpoint). RT slots are never taken by anyone.
    * BE: empty slots of its own blocks (newest first), then the BE-free block with the most
      empty slots. BE never overwrites.
    * Swap-in: a BE request's checkpointed slots come back as BE slots wherever BE placement puts
      them, so first into the holes the overwrite left in its own blocks once the RT request
      has gone (a real block table maps each token's slot, so their position is free to
      change).

    A request's own blocks are all within its reach, not only its last one: the fronts of a
    block move as RT and BE requests come and go, and a hole left in an earlier block would
    otherwise be reachable by nobody but a newcomer of the other side. The capacity queries
    (`rt_capacity`, `be_capacity`, `reachable_empty_rt`) count exactly what placement can use,
    so an append within capacity never fails.

    `usable` marks the blocks placement may use (all by default). An engine that lends blocks of
    a larger paged pool to the shared region switches them on and off with `set_usable`; an
    unusable block holds nothing and counts for no capacity.
    """

    def __init__(self, num_blocks: int, block_size: int = BLOCK_SLOTS):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = int(num_blocks)
        self.size = int(block_size)
        self.rt_owner = np.full(self.num_blocks, -1, dtype=np.int64)
        self.be_owner = np.full(self.num_blocks, -1, dtype=np.int64)
        self.rt_fill = np.zeros(self.num_blocks, dtype=np.int64)
        self.be_fill = np.zeros(self.num_blocks, dtype=np.int64)
        self._ids: dict[Hashable, int] = {}
        self._next_key = 0
        self._names: dict[int, Hashable] = {}
        self._kind: dict[Hashable, str] = {}
        self._blocks: dict[Hashable, list[int]] = {}
        self._host: dict[Hashable, int] = {}
        self._preempted = np.zeros(self.num_blocks, dtype=bool)
        self.usable = np.ones(self.num_blocks, dtype=bool)
        # Counters (slots, cumulative).
        self.checkpointed_slots = 0   # device -> host copies forced by RT overwrites
        self.swapped_in_slots = 0     # host -> device copies when a BE request runs again
        self.preemption_events = 0    # times a block entered preemption status

    # -- bookkeeping --

    def _key(self, req_id: Hashable, kind: str) -> int:
        known = self._kind.get(req_id)
        if known is not None and known != kind:
            raise ValueError(f"request {req_id!r} is {known}, used as {kind}")
        if req_id not in self._ids:
            k = self._next_key  # never reused, so a stale key can never alias a new request
            self._next_key += 1
            self._ids[req_id] = k
            self._names[k] = req_id
            self._kind[req_id] = kind
            self._blocks[req_id] = []
            self._host[req_id] = 0
        return self._ids[req_id]

    def _empties(self) -> np.ndarray:
        return self.size - self.rt_fill - self.be_fill

    def _room_in_last(self, blocks: list[int]) -> int:
        # Appends that fit here need no capacity scan (the scan is O(blocks), this is O(1)).
        if not blocks:
            return 0
        j = blocks[-1]
        return self.size - int(self.rt_fill[j]) - int(self.be_fill[j])

    def _reachable_empty(self, req_id: Hashable, kind: str) -> int:
        """Empty slots a `kind` append by `req_id` can use without overwriting: those of blocks
        no request of that side owns, and those of its own blocks."""
        emp = self._empties()
        owner = self.rt_owner if kind == RT else self.be_owner
        reach = int(emp[(owner == -1) & self.usable].sum())
        if self._kind.get(req_id) == kind and self._blocks[req_id]:
            reach += int(emp[self._blocks[req_id]].sum())
        return reach

    def set_usable(self, j: int, usable: bool) -> None:
        if not usable and (self.rt_fill[j] or self.be_fill[j]):
            raise ValueError(f"block {j} still holds slots")
        self.usable[j] = usable

    # -- dry runs (SlotOracle) --

    def last_block_room(self, req_id: Hashable) -> int:
        """Empty slots of the request's last block: what it can append without any search."""
        return self._room_in_last(self._blocks.get(req_id, []))

    def rt_capacity(self, req_id: Hashable) -> int:
        """Slots an RT append can get, overwriting BE slots where it must: every slot of an
        RT-free block, plus whatever is not RT in its own blocks."""
        cap = int(np.count_nonzero((self.rt_owner == -1) & self.usable)) * self.size
        if self._kind.get(req_id) == RT:
            blocks = self._blocks[req_id]
            cap += len(blocks) * self.size - int(self.rt_fill[blocks].sum())
        return cap

    def be_capacity(self, req_id: Hashable) -> int:
        """Empty slots a BE append can get (BE never overwrites)."""
        return self._reachable_empty(req_id, BE)

    def reachable_empty_rt(self, req_id: Hashable) -> int:
        """Empty slots an RT append would use before it has to overwrite BE slots."""
        return self._reachable_empty(req_id, RT)

    # -- mutations --

    def append_rt(self, req_id: Hashable, n: int = 1) -> int:
        """Place n RT slots; returns how many BE slots were checkpointed to make room."""
        if n < 0:
            raise ValueError("n must be >= 0")
        key = self._key(req_id, RT)
        if n > self._room_in_last(self._blocks[req_id]) and n > self.rt_capacity(req_id):
            raise KVFull(f"RT {req_id!r}: {n} slots requested, {self.rt_capacity(req_id)} reachable")
        blocks = self._blocks[req_id]
        ckpt = 0
        while True:
            n = self._fill_empty(blocks, n, self.rt_fill, self.rt_owner, key)
            if n == 0:
                return ckpt
            # Every reachable slot is taken: now, and only now, overwrite BE slots.
            j = self._overwrite_target(req_id, key)
            take = min(n, int(self.be_fill[j]))
            self._checkpoint(j, take)
            self.rt_fill[j] += take
            n -= take
            ckpt += take

    def _overwrite_target(self, req_id: Hashable, key: int) -> int:
        """The block whose BE slots an RT append overwrites next: one the request already
        shares with a BE request (newest first: the fronts meet there first), else a claimed
        RT-free block. Every BE slot `rt_capacity` counts is reachable this way; _fill_empty may
        have claimed several part-BE blocks before any overwrite, so the last block alone is
        not enough."""
        blocks = self._blocks[req_id]
        for j in reversed(blocks):
            if self.be_fill[j] > 0:
                return j
        cand = np.flatnonzero((self.rt_owner == -1) & self.usable)
        if not cand.size:  # unreachable: capacity was checked by append_rt
            raise KVFull(f"RT {req_id!r}: no block left")
        j = int(cand[0])
        self.rt_owner[j] = key
        blocks.append(j)
        return j

    def _fill_empty(self, blocks: list[int], n: int, fill: np.ndarray, owner: np.ndarray,
                    key: int) -> int:
        """Place up to n slots in empty space only: the request's own blocks (newest first),
        then the emptiest block not yet owned on this side. Returns how many are left over."""
        if n > 0 and blocks:
            room = self._room_in_last(blocks)
            if room >= n:  # the common case: one more token in the block it is writing
                fill[blocks[-1]] += n
                return 0
            own = np.asarray(blocks)
            own_room = self._empties()[own]
            for i in np.flatnonzero(own_room)[::-1]:
                take = min(n, int(own_room[i]))
                fill[own[i]] += take
                n -= take
                if n == 0:
                    return 0
        while n > 0:
            emp = self._empties()
            cand = np.flatnonzero((owner == -1) & (emp > 0) & self.usable)
            if not cand.size:
                return n
            j = int(cand[np.argmax(emp[cand])])
            owner[j] = key
            blocks.append(j)
            take = min(n, int(emp[j]))
            fill[j] += take
            n -= take
        return 0

    def _checkpoint(self, j: int, take: int) -> None:
        victim = self._names[int(self.be_owner[j])]
        self.be_fill[j] -= take
        self._host[victim] += take
        self.checkpointed_slots += take
        if not self._preempted[j]:
            self._preempted[j] = True
            self.preemption_events += 1
        if self.be_fill[j] == 0:
            self.be_owner[j] = -1
            self._blocks[victim].remove(j)

    def append_be(self, req_id: Hashable, n: int = 1) -> None:
        if n < 0:
            raise ValueError("n must be >= 0")
        self._key(req_id, BE)
        if n > self._room_in_last(self._blocks[req_id]) and n > self.be_capacity(req_id):
            raise KVFull(f"BE {req_id!r}: {n} slots requested, {self.be_capacity(req_id)} free")
        self._place_be(req_id, n)

    def _place_be(self, req_id: Hashable, n: int) -> None:
        left = self._fill_empty(self._blocks[req_id], n, self.be_fill, self.be_owner,
                                self._ids[req_id])
        if left:  # unreachable: capacity was checked by the caller
            raise KVFull(f"BE {req_id!r}: no block left")

    def swap_in(self, req_id: Hashable) -> int:
        """Bring a BE request's checkpointed slots back; returns how many were copied."""
        if self._kind.get(req_id) != BE:
            return 0
        h = self._host[req_id]
        if h == 0:
            return 0
        if h > self.be_capacity(req_id):
            raise KVFull(f"BE {req_id!r}: {h} slots to swap in, {self.be_capacity(req_id)} free")
        self._place_be(req_id, h)
        self._host[req_id] = 0
        self.swapped_in_slots += h
        return h

    def rename(self, old_id: Hashable, new_id: Hashable) -> None:
        """Hand everything `old_id` holds (device slots, host checkpoint, side) to `new_id`, e.g.
        when a paused generation continues as a new request that keeps its KV."""
        if old_id not in self._kind:
            return
        if new_id in self._kind:
            raise ValueError(f"request {new_id!r} already holds slots")
        key = self._ids.pop(old_id)
        self._ids[new_id] = key
        self._names[key] = new_id
        self._kind[new_id] = self._kind.pop(old_id)
        self._blocks[new_id] = self._blocks.pop(old_id)
        self._host[new_id] = self._host.pop(old_id)

    def release(self, req_id: Hashable) -> None:
        """Free a finished (or dropped) request's device slots and its host checkpoint."""
        kind = self._kind.get(req_id)
        if kind is None:
            return
        for j in self._blocks[req_id]:
            if kind == RT:
                self.rt_owner[j] = -1
                self.rt_fill[j] = 0
            else:
                self.be_owner[j] = -1
                self.be_fill[j] = 0
            if self.rt_fill[j] == 0 or self.be_fill[j] == 0:
                self._preempted[j] = False
        del self._names[self._ids[req_id]]
        del self._ids[req_id]
        del self._kind[req_id]
        del self._blocks[req_id]
        del self._host[req_id]

    # -- views --

    def gpu_slots(self, req_id: Hashable) -> int:
        kind = self._kind.get(req_id)
        if kind is None:
            return 0
        fill = self.rt_fill if kind == RT else self.be_fill
        return int(sum(int(fill[j]) for j in self._blocks[req_id]))

    def host_slots(self, req_id: Hashable) -> int:
        return self._host.get(req_id, 0)

    def blocks_of(self, req_id: Hashable) -> list[int]:
        return list(self._blocks.get(req_id, ()))

    def kind_of(self, req_id: Hashable) -> str | None:
        return self._kind.get(req_id)

    def empty_slots(self) -> int:
        return int(self._empties()[self.usable].sum())

    def slot_owners(self) -> np.ndarray:
        """(num_blocks, size) array of owner keys (-1 empty); raises if RT and BE would overlap."""
        out = np.full((self.num_blocks, self.size), -1, dtype=np.int64)
        for j in range(self.num_blocks):
            r, b = int(self.rt_fill[j]), int(self.be_fill[j])
            if r + b > self.size:
                raise AssertionError(f"block {j}: RT {r} + BE {b} slots exceed {self.size}")
            out[j, :r] = self.rt_owner[j]
            if b:
                out[j, self.size - b:] = self.be_owner[j]
        return out

    def counters(self) -> dict[str, int]:
        return {"checkpointed_slots": self.checkpointed_slots,
                "swapped_in_slots": self.swapped_in_slots,
                "preemption_events": self.preemption_events,
                "host_slots_now": sum(self._host.values())}
