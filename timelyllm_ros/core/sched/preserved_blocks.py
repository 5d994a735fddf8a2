"""The KV blocks that queued generations' preserved pauses still hold, for one admission pass.

A candidate whose pause was preserved needs that many fewer blocks to be admitted. Building the
whole map for every pass cost one engine query per paused generation (thousands in overload),
and the walk then computed the same blocks again for each candidate it reached. This map
computes a generation's blocks when first read, and the walk reuses it until the pass changes
the engine (an admission, an eviction or a preemption can revoke another pause's blocks); from
then on the walk asks again, as it always did, and the map is sealed: it keeps the values it
gave as of the pass's start, and refuses to compute new ones that would no longer be so.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping


class PreservedBlocks(Mapping[str, int]):
    """Task id -> blocks its preserved pause holds (only those holding some), as of the start
    of one admission pass (`AdmissionPass.preserved_blocks`), computed on first read."""

    def __init__(self, paused: Mapping[str, object], blocks_of: Callable[[str], int],
                 position_of: Callable[[str], int | None] | None = None,
                 all_blocks: Callable[[], Mapping[str, int]] | None = None):
        """`paused`: the paused generations by key; `blocks_of(key)`: what its pause holds
        now; `position_of(key)`: where the key is among the pass's candidates
        (`AdmissionPass.keys`), None where it is not one (for `held_at`); `all_blocks()`: the
        same as `blocks_of` for every paused key at once, keys holding none left out (for
        `held_at`, which reads them all: one loop instead of a call per pause)."""
        self._paused = paused
        self._blocks_of = blocks_of
        self._position_of = position_of
        self._all_blocks = all_blocks
        self._known: dict[str, int] = {}
        self._sealed = False

    @classmethod
    def empty(cls) -> "PreservedBlocks":
        return cls({}, lambda key: 0, lambda key: None)

    def _value(self, key: str) -> int:
        value = self._known.get(key)
        if value is None:
            if key not in self._paused:
                return 0
            if self._sealed:
                raise RuntimeError(
                    f"preserved_blocks[{key!r}]: read AdmissionPass.preserved_blocks in "
                    "begin_pass; the pass has since changed the engine's paused generations")
            value = self._known[key] = self._blocks_of(key)
        return value

    def __getitem__(self, key: str) -> int:
        value = self._value(key)
        if not value:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._value(key) > 0

    def __iter__(self) -> Iterator[str]:
        return iter([key for key in self._paused if self._value(key)])

    def __len__(self) -> int:
        return sum(1 for key in self._paused if self._value(key))

    def __bool__(self) -> bool:
        return any(self._value(key) for key in self._paused)

    def held_at(self) -> list[tuple[int, int]]:
        """(position among the pass's candidates, blocks) for each candidate whose preserved
        pause holds some, by position. Reads the paused generations, not the candidates: in
        overload thousands are queued, a few dozen paused. Only before the pass changes the
        engine (positions and values are the pass's start)."""
        if self._position_of is None:
            raise RuntimeError("held_at: this map was built without the candidates' positions")
        if self._sealed:
            raise RuntimeError("held_at: read it in begin_pass; the pass has since changed "
                               "the engine's paused generations")
        out = []
        if self._all_blocks is not None and not self._known:
            holding = self._all_blocks()
            self._known = {key: holding.get(key, 0) for key in self._paused}
        for key in self._paused:
            value = self._value(key)  # (most pauses hold none: asked first)
            if value:
                position = self._position_of(key)
                if position is not None:
                    out.append((position, value))
        out.sort()
        return out

    def seal(self) -> None:
        """The pass changed the engine: values not read so far would not be the pass's."""
        self._sealed = True

    def current(self, key: str) -> int:
        """Blocks `key`'s preserved pause holds now (0 if none): the value read before the pass
        changed the engine, else asked again."""
        if not self._sealed:
            return self._value(key)
        return self._blocks_of(key) if key in self._paused else 0

