"""Contracts shared by every skill language: parsed calls, segments, and the segmenter protocol."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


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
    # How many times the segment is expected to run this call (loops, conditionals; see
    # core/skills/flow.py). The execution-time estimate multiplies by it; it is not part of
    # the call's identity (equality, wire form).
    weight: float = field(default=1.0, compare=False)

    def to_wire(self) -> str:
        """Compact `name(arg1,arg2)` form carried in SkillSegment.calls."""
        return f"{self.name}({','.join(self.args)})"


@dataclass(frozen=True)
class ParsedSegment:
    text: str
    calls: tuple[SkillCall, ...]
    # The language's syntax tree of the segment, for languages that have one (MiniSpec:
    # a minispec_ast.Program); robots interpret it, flat `calls` lose control flow.
    program: Any = field(default=None, compare=False)
    # Variables the segment stores skill results in (MiniSpec `_1=iv,cup;`): the robot reports
    # their values, which a skill set with `observations` feeds back into the plan.
    binds: tuple[str, ...] = ()


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


# after_close(text, closing_index, next_visible_index) -> statement end, or None to wait for more
# text before deciding (what follows the outermost group decides where the statement ends).
AfterClose = Callable[[str, int, int], "int | None"]


# closes_quote(text, index) -> whether the quote character at `index`, inside a string opened
# by the same character, ends that string (default: always).
ClosesQuote = Callable[[str, int], bool]


def scan_top_level(text: str, start: int, *, opener: str, closer: str, after_close: AfterClose,
                   separator: str | None = None, closes_quote: ClosesQuote | None = None
                   ) -> tuple[int | None, int, str | None, bool]:
    """Walk from `start` to the end of the first complete top-level statement.

    Shared by the languages whose statements nest in one kind of bracket: quoted text is skipped
    (so `l,'a;b'` stays one statement), and a statement ends either at `separator` outside any
    group or where `after_close` says once its outermost group closes. Returns
    (boundary or None, final depth, open quote char, whether any statement text was seen).
    """
    depth = 0
    quote: str | None = None
    content = False
    n = len(text)
    i = start
    while i < n:
        c = text[i]
        if quote is not None:
            if c == quote and (closes_quote is None or closes_quote(text, i)):
                quote = None
        elif c in "'\"":
            quote = c
            content = True
        elif c == opener:
            depth += 1
            content = True
        elif c == closer:
            depth -= 1
            if depth <= 0:
                j = i + 1
                while j < n and text[j].isspace():
                    j += 1
                return after_close(text, i, j), depth, None, True
        elif separator is not None and c == separator and depth == 0:
            if content:
                return i + 1, depth, None, True
            # A stray leading separator is an empty statement; it rides along with the next one.
        elif not c.isspace():
            content = True
        i += 1
    return None, depth, quote, content


class BracketedLanguage:
    """Boundary finding for languages scanned with `scan_top_level`; subclasses define `scan`."""

    def scan(self, text: str, start: int) -> tuple[int | None, int, str | None, bool]:
        raise NotImplementedError

    def next_boundary(self, text: str, start: int) -> int | None:
        return self.scan(text, start)[0]

    def final_segment_end(self, text: str, start: int) -> int | None:
        boundary, depth, quote, content = self.scan(text, start)
        if boundary is not None:
            return boundary
        if not content or quote is not None or depth > 0:
            return None
        # Structurally complete; whether it is valid is for parse() to report.
        return len(text)
