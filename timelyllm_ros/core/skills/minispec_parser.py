"""MiniSpec text -> tree (minispec_ast.py), written from the grammar TypeFly publishes
(typefly/TypeFly, controller/assets/minispec_syntax.txt):

    program      ::= { block [';'] | statement ';' }      (the last `;` may be left out)
    statement    ::= assign | call | return
    block        ::= loop | conditional
    loop         ::= int '{' program '}'
    conditional  ::= '?' condition '{' program '}'
    condition    ::= operand cmp operand { ('&' | '|') operand cmp operand }
    cmp          ::= '>' | '<' | '==' | '!='
    assign       ::= var '=' operand
    return       ::= '->' operand                           (`->l,'Yes'`: a call is a value)
    call         ::= name { ',' arg }  |  name '(' [arg { ',' arg }] ')'
    operand      ::= literal | var | call
    arg          ::= literal | var | word | '$' int         (`$1`: only in skill definitions)
    literal      ::= int | float | string | True | False
    var          ::= '_' int

Choices where the published grammar is silent, each matching TypeFly's own plans:
- a bare word as an argument is text (`s,bottle` = `s,'bottle'`); as an operand it is a call;
- a quote ends a string only where the next visible character is one of `; , { } ( ) = ! < > & |`
  or the text ends, so `'what's the edible target?'` is one string;
- `&` binds tighter than `|` (TypeFly evaluates left to right; its plans never mix the two).

The parser knows no skill names: `check_skills` validates a tree against a skill table.
"""

from __future__ import annotations

import re

from timelyllm_ros.core.skills.base import SkillSyntaxError, Token
from timelyllm_ros.core.skills.base import tokenize as tokenize_with
from timelyllm_ros.core.skills.minispec_ast import (
    BOOL_WORDS,
    COMPARATORS,
    VAR_RE,
    Assign,
    BoolOp,
    Call,
    CallStmt,
    Comparison,
    Condition,
    If,
    Literal,
    Loop,
    Operand,
    Param,
    Program,
    Return,
    Statement,
    Var,
)

_DELIM = r"(?=\s*(?:[;,{}()=!<>&|]|\Z))"
_NOT_DELIM = r"(?!\s*(?:[;,{}()=!<>&|]|\Z))"
_TOKEN_RE = re.compile(
    rf"""
    (?P<ws>\s+)
    | (?P<str>'(?:[^']|'{_NOT_DELIM})*'{_DELIM} | "(?:[^"]|"{_NOT_DELIM})*"{_DELIM})
    | (?P<op>->|==|!=|[;,{{}}()=<>?&|])
    | (?P<num>-?\d+(?:\.\d+)?)
    | (?P<param>\$\d+)
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    """,
    re.VERBOSE,
)


def tokenize(text: str) -> list[Token]:
    """MiniSpec's tokens (the shared loop of core.skills.base with MiniSpec's pattern)."""
    return tokenize_with(text, _TOKEN_RE)


def _number(text: str) -> int | float:
    return float(text) if "." in text else int(text)


class _Parser:
    def __init__(self, text: str, params: bool):
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.params = params

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

    def got(self, tok: Token | None) -> str:
        return "end of program" if tok is None else repr(tok.text)

    def pos(self, tok: Token | None) -> int:
        return len(self.text) if tok is None else tok.pos

    def expect(self, text: str, what: str) -> Token:
        tok = self.peek()
        if not self.at(text):
            raise SkillSyntaxError(f"expected {text!r} {what}, got {self.got(tok)}", self.pos(tok))
        return self.take()

    # -- grammar ------------------------------------------------------------------------------

    def program(self, in_block: bool) -> Program:
        out: list[Statement] = []
        while True:
            while self.at(";"):
                self.take()
            tok = self.peek()
            if tok is None:
                if in_block:
                    raise SkillSyntaxError("unclosed '{'", len(self.text))
                return tuple(out)
            if self.at("}"):
                if in_block:
                    return tuple(out)
                raise SkillSyntaxError("unmatched '}'", tok.pos)
            stmt = self.statement()
            out.append(stmt)
            if self.peek() is None or self.at(";") or self.at("}") or isinstance(stmt, (Loop, If)):
                continue
            nxt = self.peek()
            raise SkillSyntaxError(f"expected ';' after statement, got {nxt.text!r}", nxt.pos)

    def statement(self) -> Statement:
        tok = self.peek()
        assert tok is not None
        if self.at("?"):
            self.take()
            cond = self.condition()
            return If(cond, self.block("conditional"), tok.pos)
        if tok.kind == "num":
            self.take()
            if "." in tok.text or tok.text.startswith("-") or int(tok.text) == 0:
                raise SkillSyntaxError(
                    f"loop count must be a positive integer, got {tok.text!r}", tok.pos)
            return Loop(int(tok.text), self.block("loop"), tok.pos)
        if self.at("->"):
            self.take()
            return Return(self.operand("return value"), tok.pos)
        if tok.kind == "name" and VAR_RE.fullmatch(tok.text):
            self.take()
            self.expect("=", f"after variable {tok.text!r}")
            return Assign(Var(tok.text, tok.pos), self.operand("assigned value"), tok.pos)
        if tok.kind == "name" and tok.text not in BOOL_WORDS:
            return CallStmt(self.call(), tok.pos)
        raise SkillSyntaxError(f"unexpected {tok.text!r} at start of statement", tok.pos)

    def block(self, kind: str) -> Program:
        opening = self.expect("{", f"to open the {kind} body")
        body = self.program(in_block=True)
        if not body:
            raise SkillSyntaxError(f"empty {kind} body", opening.pos)
        self.expect("}", f"to close the {kind} body")
        return body

    def condition(self) -> Condition:
        left = self.conjunction()
        while self.at("|"):
            op = self.take()
            left = BoolOp("|", left, self.conjunction(), op.pos)
        return left

    def conjunction(self) -> Condition:
        left: Condition = self.comparison()
        while self.at("&"):
            op = self.take()
            left = BoolOp("&", left, self.comparison(), op.pos)
        return left

    def comparison(self) -> Comparison:
        left = self.operand("operand")
        op = self.peek()
        if op is None or op.kind != "op" or op.text not in COMPARATORS:
            raise SkillSyntaxError(
                f"expected a comparator (> < == !=), got {self.got(op)}", self.pos(op))
        self.take()
        return Comparison(left, op.text, self.operand("operand"), left.pos)

    def operand(self, what: str) -> Operand:
        tok = self.peek()
        if tok is not None and tok.kind == "name" and not VAR_RE.fullmatch(tok.text) \
                and tok.text not in BOOL_WORDS:
            return self.call()
        return self.value(what, words=False)

    def value(self, what: str, *, words: bool):
        tok = self.peek()
        if tok is None or tok.kind not in ("num", "str", "name", "param"):
            raise SkillSyntaxError(f"expected {what}, got {self.got(tok)}", self.pos(tok))
        self.take()
        if tok.kind == "num":
            return Literal(_number(tok.text), tok.pos)
        if tok.kind == "str":
            return Literal(tok.text[1:-1], tok.pos)
        if tok.kind == "param":
            if not self.params:
                raise SkillSyntaxError(
                    f"parameter {tok.text!r} outside a high-level skill definition", tok.pos)
            return Param(int(tok.text[1:]), tok.pos)
        if tok.text in BOOL_WORDS:
            return Literal(BOOL_WORDS[tok.text], tok.pos)
        if VAR_RE.fullmatch(tok.text):
            return Var(tok.text, tok.pos)
        if words:
            return Literal(tok.text, tok.pos)
        raise SkillSyntaxError(f"expected {what}, got {tok.text!r}", tok.pos)

    def call(self) -> Call:
        head = self.take()
        args = []
        if self.at("("):
            self.take()
            if not self.at(")"):
                args.append(self.value(f"argument of {head.text!r}", words=True))
                while self.at(","):
                    self.take()
                    args.append(self.value(f"argument of {head.text!r}", words=True))
            close = self.expect(")", f"to close the arguments of {head.text!r}")
            return Call(head.text, tuple(args), head.pos, close.end)
        end = head.end
        while self.at(","):
            self.take()
            arg = self.value(f"argument of {head.text!r}", words=True)
            args.append(arg)
            end = self.tokens[self.i - 1].end
        return Call(head.text, tuple(args), head.pos, end)


def parse_program(text: str, *, params: bool = False) -> Program:
    """Parse MiniSpec text into a tree. `params`: allow `$1`-style parameters (skill
    definitions). Raises SkillSyntaxError with the character position of the fault."""
    parser = _Parser(text, params)
    return parser.program(in_block=False)
