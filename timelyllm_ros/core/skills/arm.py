"""Arm skill language in the style of LLM^3: calls such as `pick(cyan_box)` joined by `->`.

    pick(red_block)->place(red_block, blue_block)->check(red_block)->move(10, -5, 20)

The `->` after a call belongs to that call's segment. Calls on separate lines without an arrow
are accepted too, since small models often write plans that way.
"""

from __future__ import annotations

import functools
import re

from timelyllm_ros.core.skills.base import (
    BracketedLanguage,
    ParsedSegment,
    SkillCall,
    SkillSyntaxError,
    Token,
    scan_top_level,
    tokenize,
)

# name -> argument kinds: "obj" (a name or quoted string) or "num" (a number).
ARM_SKILLS: dict[str, tuple[str, ...]] = {
    "pick": ("obj",),
    "place": ("obj", "obj"),
    "move": ("num", "num", "num"),
    "check": ("obj",),
}

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
    | (?P<str>'[^']*'|"[^"]*")
    | (?P<op>->|[(),])
    | (?P<num>-?\d+(?:\.\d+)?)
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    """,
    re.VERBOSE,
)


def _unquote(arg: str) -> str:
    a = arg.strip()
    return a[1:-1] if len(a) >= 2 and a[0] == a[-1] and a[0] in "'\"" else a


def _after_call(text: str, close: int, nxt: int) -> int | None:
    # Wait for the arrow (or its absence) to show before cutting, so the boundary does not
    # depend on how the text was split into tokens.
    if nxt == len(text) or (text[nxt] == "-" and nxt + 1 == len(text)):
        return None
    return nxt + 2 if text.startswith("->", nxt) else close + 1


def _scan(text: str, start: int) -> tuple[int | None, int, str | None, bool]:
    """(boundary or None, paren depth, open quote, whether any text was seen) from `start`."""
    return scan_top_level(text, start, opener="(", closer=")", after_close=_after_call)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text, _TOKEN_RE)
        self.i = 0

    def peek(self) -> Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def at(self, text: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "op" and tok.text == text

    def fail(self, expected: str) -> SkillSyntaxError:
        tok = self.peek()
        if tok is None:
            return SkillSyntaxError(f"expected {expected}, got end of plan", len(self.text))
        return SkillSyntaxError(f"expected {expected}, got {tok.text!r}", tok.pos)

    def take(self) -> Token:
        tok = self.peek()
        assert tok is not None
        self.i += 1
        return tok

    def expect(self, text: str, what: str) -> Token:
        if not self.at(text):
            raise self.fail(f"{text!r} {what}")
        return self.take()

    def plan(self) -> list[SkillCall]:
        calls = [self.call()]
        while (tok := self.peek()) is not None:
            if self.at("->"):
                self.take()
                if self.peek() is None:
                    break  # the arrow that ends a segment
            else:
                gap = self.text[self.tokens[self.i - 1].end : tok.pos]
                if tok.kind != "name" or not gap.isspace():
                    raise self.fail("'->' between calls")
            calls.append(self.call())
        return calls

    def call(self) -> SkillCall:
        head = self.peek()
        if head is None or head.kind != "name":
            raise self.fail("a skill name")
        self.take()
        kinds = ARM_SKILLS.get(head.text)
        if kinds is None:
            known = ", ".join(ARM_SKILLS)
            raise SkillSyntaxError(f"unknown arm skill {head.text!r} (known: {known})", head.pos)
        self.expect("(", f"after {head.text!r}")
        args: list[Token] = []
        if not self.at(")"):
            while True:
                tok = self.peek()
                if tok is None or tok.kind not in ("name", "num", "str"):
                    raise self.fail(f"an argument of {head.text!r}")
                args.append(self.take())
                if not self.at(","):
                    break
                self.take()
        close = self.expect(")", f"to close {head.text!r}")
        if len(args) != len(kinds):
            raise SkillSyntaxError(
                f"{head.text!r} takes {len(kinds)} argument(s), got {len(args)}", head.pos
            )
        for tok, kind in zip(args, kinds):
            ok = tok.kind == "num" if kind == "num" else tok.kind in ("name", "str")
            if not ok:
                raise SkillSyntaxError(
                    f"argument {tok.text!r} of {head.text!r} must be {kind}", tok.pos
                )
        return SkillCall(head.text, tuple(t.text for t in args), self.text[head.pos : close.end])


class ArmLanguage(BracketedLanguage):
    name = "arm"

    def scan(self, text: str, start: int) -> tuple[int | None, int, str | None, bool]:
        return _scan(text, start)

    def parse(self, segment_text: str) -> ParsedSegment:
        return ParsedSegment(segment_text, tuple(_Parser(segment_text).plan()))

    @staticmethod
    def call_text(call) -> str:
        """A tree's call written the arm's way, `place(cup,bin)`, for messages."""
        from timelyllm_ros.core.skills.minispec_ast import arg_text

        return f"{call.name}({','.join(arg_text(a) for a in call.args)})"

    def program(self, segment_text: str):
        """The segment as a MiniSpec-style tree of call statements, for the interpreter
        (core/skills/interpreter.py): object names become text, coordinates numbers."""
        from timelyllm_ros.core.skills.minispec_ast import Call, CallStmt, Literal

        statements = []
        for call in _Parser(segment_text).plan():
            kinds = ARM_SKILLS[call.name]
            args = tuple(Literal(float(a)) if k == "num" else Literal(_unquote(a))
                         for a, k in zip(call.args, kinds))
            statements.append(CallStmt(Call(call.name, args, 0, 0)))
        return tuple(statements)

    def output_regex(self, max_statements: int) -> str | None:
        return arm_regex(max_statements)


@functools.lru_cache(maxsize=16)
def arm_regex(max_statements: int) -> str:
    """Regex admitting 1..max_statements calls joined by `->`; names and numbers are bounded."""
    if max_statements < 1:
        raise ValueError(f"max_statements must be >= 1, got {max_statements}")
    obj = "[a-z][a-z_]{0,23}"
    num = "-?(0|[1-9][0-9]{0,2})(\\.[0-9]{1,2})?"
    sep = ", ?"
    call = (
        f"(pick\\({obj}\\)|place\\({obj}{sep}{obj}\\)"
        f"|move\\({num}{sep}{num}{sep}{num}\\)|check\\({obj}\\))"
    )
    return f"{call}(->{call}){{0,{max_statements - 1}}}"


ARM = ArmLanguage()
