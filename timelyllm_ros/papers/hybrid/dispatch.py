"""The online request level of seed 003: the paper's Algorithm 1 - each slot serves its own list
longest first and, once empty, steals the longest request of the slot with the most work left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np


@dataclass(frozen=True)
class Dispatch:
    rid: Hashable
    size: float
    donor: int | None   # slot it was stolen from, None when it came from the slot's own list


class SlotDispatcher:
    """The paper's Algorithm 1 (sorting and online preemptive dispatch).

    lists[j]: (rid, size) pairs assigned to slot j, size = N_p + estimated N_d. With `sort`, a
    slot serves its list longest first, so each list ends with short requests that even out the
    finishing times; with `steal`, a slot whose list is empty takes the head (longest request) of
    the slot with the most undispatched tokens, which is charged to that donor. Sizes count when
    dispatched, not when finished.
    """

    def __init__(self, lists: Sequence[Sequence[tuple[Hashable, float]]], *, sort: bool = True,
                 steal: bool = True):
        self._lists: list[list[tuple[Hashable, float]]] = []
        for lst in lists:
            items = [(rid, float(size)) for rid, size in lst]
            if sort:
                items.sort(key=lambda it: -it[1])   # stable: equal sizes keep their given order
            items.reverse()                         # pop() from the end is O(1)
            self._lists.append(items)
        self.steal = steal
        self.remaining = np.array([sum(sz for _, sz in lst) for lst in self._lists], dtype=float)

    def __len__(self) -> int:
        return sum(len(lst) for lst in self._lists)

    def queue(self, slot: int) -> list[tuple[Hashable, float]]:
        """Slot's undispatched requests, next first."""
        return list(reversed(self._lists[slot]))

    def next_for(self, slot: int) -> Dispatch | None:
        own = self._lists[slot]
        if own:
            rid, size = own.pop()
            self.remaining[slot] -= size
            return Dispatch(rid, size, None)
        if not self.steal or not len(self):
            return None
        donor = int(np.argmax(self.remaining))
        if not self._lists[donor]:
            # Only zero-size leftovers can make argmax pick an empty list; fall back to any.
            donor = next(j for j, lst in enumerate(self._lists) if lst)
        rid, size = self._lists[donor].pop()
        self.remaining[donor] -= size
        return Dispatch(rid, size, donor)
