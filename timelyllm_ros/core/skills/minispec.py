"""MiniSpec, the drone skill language (TypeFly style): parser, segmenter and output regex.

A program is a list of statements ended by `;`:
    mf,120;            skill call (abbreviation, comma-separated arguments)
    _1=iv,bottle;      assignment of a call result (or of a plain value)
    ->_1;              return
    8{tc,45;d,200}     loop
    ?_1==True&_2>0.5{l,'seen'}   conditional; comparators > < == !=, joined by & or |
A block may be followed directly by the next statement; the `;` after `}` is optional.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from timelyllm_ros.core.skills.base import (
    BracketedLanguage,
    ParsedSegment,
    SkillCall,
    SkillSyntaxError,
    Token,
    scan_top_level,
    tokenize,
)


@dataclass(frozen=True)
class SkillSpec:
    abbrev: str
    name: str
    # One entry per argument: "int" (integer literal or variable), "obj" (object name), "text".
    args: tuple[str, ...] = ()


SKILLS: dict[str, SkillSpec] = {
    s.abbrev: s
    for s in (
        SkillSpec("mf", "move_forward", ("int",)),
        SkillSpec("mb", "move_backward", ("int",)),
        SkillSpec("ml", "move_left", ("int",)),
        SkillSpec("mr", "move_right", ("int",)),
        SkillSpec("mu", "move_up", ("int",)),
        SkillSpec("md", "move_down", ("int",)),
        SkillSpec("tc", "turn_cw", ("int",)),
        SkillSpec("tu", "turn_ccw", ("int",)),
        SkillSpec("d", "delay", ("int",)),
        SkillSpec("iv", "is_visible", ("obj",)),
        SkillSpec("ox", "object_x", ("obj",)),
        SkillSpec("oy", "object_y", ("obj",)),
        SkillSpec("ow", "object_width", ("obj",)),
        SkillSpec("oh", "object_height", ("obj",)),
        SkillSpec("l", "log", ("text",)),
        SkillSpec("p", "picture"),
        SkillSpec("q", "query", ("text",)),
        SkillSpec("s", "sweeping", ("obj",)),
        SkillSpec("sa", "sweeping_abstract", ("text",)),
        SkillSpec("a", "approach"),
        SkillSpec("o", "orienting", ("obj",)),
        SkillSpec("tk", "takeoff"),
        SkillSpec("ld", "land"),
    )
}

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
    | (?P<str>'[^']*'|"[^"]*")
    | (?P<op>->|==|!=|[;,{}=<>?&|])
    | (?P<num>-?\d+(?:\.\d+)?)
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    """,
    re.VERBOSE,
)
_VAR_RE = re.compile(r"_\d+")
_BOOLS = ("True", "False")
_COMPARATORS = ("==", "!=", "<", ">")


def _is_var(tok: Token) -> bool:
    return tok.kind == "name" and _VAR_RE.fullmatch(tok.text) is not None


def _is_word(tok: Token) -> bool:
    """A bare name that is neither a variable nor a boolean literal."""
    return tok.kind == "name" and not _is_var(tok) and tok.text not in _BOOLS


def _fits_kind(tok: Token, kind: str) -> bool:
    if _is_var(tok):
        return True
    if kind == "int":
        return tok.kind == "num" and "." not in tok.text
    if kind == "obj":
        return _is_word(tok) or tok.kind == "str"
    return True


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text, _TOKEN_RE)
        self.i = 0
        self.calls: list[SkillCall] = []

    # -- token access -------------------------------------------------------------------------

    def peek(self) -> Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def at(self, text: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "op" and tok.text == text

    def take(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise SkillSyntaxError("unexpected end of program", len(self.text))
        self.i += 1
        return tok

    def expect(self, text: str, what: str) -> Token:
        tok = self.peek()
        if not self.at(text):
            got = "end of program" if tok is None else repr(tok.text)
            raise SkillSyntaxError(f"expected {text!r} {what}, got {got}", self._pos(tok))
        return self.take()

    def _pos(self, tok: Token | None) -> int:
        return len(self.text) if tok is None else tok.pos

    # -- grammar ------------------------------------------------------------------------------

    def program(self, in_block: bool) -> int:
        """Statements up to end of text (or the `}` closing the block); returns how many."""
        count = 0
        while True:
            while self.at(";"):
                self.take()
            tok = self.peek()
            if tok is None:
                if in_block:
                    raise SkillSyntaxError("unclosed '{'", len(self.text))
                return count
            if self.at("}"):
                if in_block:
                    return count
                raise SkillSyntaxError("unmatched '}'", tok.pos)
            was_block = self.statement()
            count += 1
            if self.peek() is None or self.at(";") or self.at("}") or was_block:
                continue
            nxt = self.peek()
            raise SkillSyntaxError(f"expected ';' after statement, got {nxt.text!r}", nxt.pos)

    def statement(self) -> bool:
        """Parse one statement; True if it was a block (which needs no `;`)."""
        tok = self.peek()
        assert tok is not None
        if self.at("?"):
            self.take()
            self.condition()
            self.block("conditional")
            return True
        if tok.kind == "num":
            self.take()
            if "." in tok.text or tok.text.startswith("-") or int(tok.text) == 0:
                raise SkillSyntaxError(
                    f"loop count must be a positive integer, got {tok.text!r}", tok.pos
                )
            self.block("loop")
            return True
        if self.at("->"):
            self.take()
            self.value("return value")
            return False
        if _is_var(tok):
            self.take()
            self.expect("=", f"after variable {tok.text!r}")
            rhs = self.peek()
            if rhs is not None and _is_word(rhs):
                self.call()
            else:
                self.value("assigned value")
            return False
        if _is_word(tok):
            self.call()
            return False
        raise SkillSyntaxError(f"unexpected {tok.text!r} at start of statement", tok.pos)

    def block(self, kind: str) -> None:
        opening = self.expect("{", f"to open the {kind} body")
        if self.program(in_block=True) == 0:
            raise SkillSyntaxError(f"empty {kind} body", opening.pos)
        self.expect("}", f"to close the {kind} body")

    def condition(self) -> None:
        while True:
            self.value("operand")
            op = self.peek()
            if op is None or op.kind != "op" or op.text not in _COMPARATORS:
                got = "end of program" if op is None else repr(op.text)
                raise SkillSyntaxError(
                    f"expected a comparator (> < == !=), got {got}", self._pos(op)
                )
            self.take()
            self.value("operand")
            if not (self.at("&") or self.at("|")):
                return
            self.take()

    def value(self, what: str) -> Token:
        tok = self.peek()
        if tok is None or tok.kind not in ("num", "str", "name"):
            got = "end of program" if tok is None else repr(tok.text)
            raise SkillSyntaxError(f"expected {what}, got {got}", self._pos(tok))
        return self.take()

    def call(self) -> None:
        head = self.take()
        spec = SKILLS.get(head.text)
        if spec is None:
            raise SkillSyntaxError(f"unknown skill abbreviation {head.text!r}", head.pos)
        args: list[Token] = []
        while self.at(","):
            self.take()
            args.append(self.value(f"argument of {head.text!r}"))
        if len(args) != len(spec.args):
            raise SkillSyntaxError(
                f"{head.text!r} ({spec.name}) takes {len(spec.args)} argument(s), got {len(args)}",
                head.pos,
            )
        for tok, kind in zip(args, spec.args):
            if not _fits_kind(tok, kind):
                raise SkillSyntaxError(
                    f"argument {tok.text!r} of {head.text!r} ({spec.name}) must be {kind}", tok.pos
                )
        end = args[-1].end if args else head.end
        self.calls.append(
            SkillCall(spec.name, tuple(t.text for t in args), self.text[head.pos : end])
        )


def _after_block(text: str, close: int, nxt: int) -> int | None:
    # A `;` right after the block belongs to it; until the next visible character arrives we
    # cannot know, and cutting early would make segments depend on how the text was chunked
    # into tokens.
    if nxt == len(text):
        return None
    return nxt + 1 if text[nxt] == ";" else close + 1


def _scan(text: str, start: int) -> tuple[int | None, int, str | None, bool]:
    """Walk from `start` to the first top-level boundary: (boundary or None, final brace depth,
    open quote char, whether any statement text was seen)."""
    return scan_top_level(text, start, opener="{", closer="}", after_close=_after_block,
                          separator=";")


class MiniSpecLanguage(BracketedLanguage):
    name = "minispec"

    def scan(self, text: str, start: int) -> tuple[int | None, int, str | None, bool]:
        return _scan(text, start)

    def parse(self, segment_text: str) -> ParsedSegment:
        parser = _Parser(segment_text)
        parser.program(in_block=False)
        return ParsedSegment(segment_text, tuple(parser.calls))

    def output_regex(self, max_statements: int) -> str | None:
        return minispec_regex(max_statements)


@functools.lru_cache(maxsize=16)
def minispec_regex(max_statements: int) -> str:
    """Regex admitting 1..max_statements top-level statements, blocks holding simple statements.

    Plain groups, classes and bounded repeats only, so that Python `re` and vLLM's structured
    output backends read it the same way. Bounds on numbers and names keep a small model from
    rambling inside one statement. Bodies are capped at `max_statements` simple statements too.
    """
    if max_statements < 1:
        raise ValueError(f"max_statements must be >= 1, got {max_statements}")
    more = max_statements - 1
    integer = "[1-9][0-9]{0,2}"
    var = "_[1-9]"
    obj = "[a-z][a-z_]{0,15}"
    text = "'[A-Za-z0-9 ,.?]{1,32}'"
    number = "(0|[1-9][0-9]{0,2})(\\.[0-9]{1,2})?"

    def group(abbrevs: list[str]) -> str:
        return "(" + "|".join(sorted(abbrevs, key=lambda a: (-len(a), a))) + ")"

    by_kind: dict[tuple[str, ...], list[str]] = {}
    for spec in SKILLS.values():
        by_kind.setdefault(spec.args, []).append(spec.abbrev)
    arg_re = {"int": f"({integer}|{var})", "obj": f"({obj}|{var})", "text": f"({text}|{var})"}
    alternatives = []
    for kinds, abbrevs in sorted(by_kind.items()):
        alternatives.append(group(abbrevs) + "".join("," + arg_re[k] for k in kinds))
    call = "(" + "|".join(alternatives) + ")"

    simple = f"({call}|{var}={call}|->({var}|True|False|{integer}))"
    comparison = f"{var}(==|!=|<|>)({var}|True|False|{number})"
    condition = f"{comparison}([&|]{comparison}){{0,2}}"
    body = f"\\{{{simple}(;{simple}){{0,{more}}};?\\}}"
    # A loop of one iteration is never meant; small models otherwise open every plan with `1{`.
    statement = f"({simple}|([2-9]|[1-9][0-9]){body}|\\?{condition}{body})"
    return f"{statement}(;{statement}){{0,{more}}};?"


MINISPEC = MiniSpecLanguage()
