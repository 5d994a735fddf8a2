"""Contracts shared by every skill language: parsed calls, segments, and the segmenter protocol."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol


class SkillSyntaxError(ValueError):
    """Text that is not a valid program of the skill language; `position` is a character offset."""

    def __init__(self, message: str, position: int | None = None):
        super().__init__(message if position is None else f"{message} (at character {position})")
        self.position = position


@dataclass(frozen=True)
class SkillCall:
    """One executable skill invocation, e.g. `mf,50` -> SkillCall("move_forward", ("50",), "mf")."""

    name: str
    args: tuple[str, ...] = ()
    # The call as written in the plan (abbreviation for MiniSpec), useful for logs and robots.
    source: str = ""

    def to_wire(self) -> str:
        """Compact `name(arg1,arg2)` form carried in SkillSegment.calls."""
        return f"{self.name}({','.join(self.args)})"


@dataclass(frozen=True)
class ParsedSegment:
    text: str
    calls: tuple[SkillCall, ...]


class SkillLanguage(Protocol):
    """A robot skill language: how to cut generated text into executable segments.

    Implementations are pure functions of the text, so the scheduler can call them after every
    engine step on the whole text generated so far.
    """

    name: str

    def next_boundary(self, text: str, start: int) -> int | None:
        """End offset (exclusive) of the first complete top-level statement beginning at or after
        `start`, including its terminator; None while no statement after `start` is complete."""

    def final_segment_end(self, text: str, start: int) -> int | None:
        """At end of generation: end offset of a trailing statement without terminator that is
        nevertheless complete (e.g. `mf,50` at the very end); None if nothing executable is left."""

    def parse(self, segment_text: str) -> ParsedSegment:
        """Parse one segment (one or more complete statements). Raises SkillSyntaxError."""

    def output_regex(self, max_statements: int) -> str | None:
        """Regex for vLLM structured outputs that admits programs of at most `max_statements`
        top-level statements; None if the language is not constrained (chat)."""


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    pos: int

    @property
    def end(self) -> int:
        return self.pos + len(self.text)


def tokenize(text: str, token_re: re.Pattern[str]) -> list[Token]:
    """Split `text` with a pattern of named alternatives; the group `ws` is dropped.

    Each language supplies its own pattern; sharing the loop keeps error positions uniform.
    """
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        m = token_re.match(text, pos)
        if m is None or m.end() == pos:
            ch = text[pos]
            if ch in "'\"":
                raise SkillSyntaxError("unterminated string", pos)
            raise SkillSyntaxError(f"unexpected character {ch!r}", pos)
        if m.lastgroup != "ws":
            tokens.append(Token(m.lastgroup or "", m.group(), pos))
        pos = m.end()
    return tokens
