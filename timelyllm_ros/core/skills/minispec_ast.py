"""MiniSpec programs as trees, and the printer that writes a tree back as MiniSpec text.

The tree is what the parser (minispec_parser.py) builds and the interpreter (interpreter.py)
walks. Node positions (`pos`, a character offset into the parsed text) are kept for error
messages but take no part in equality, so `parse(to_text(tree)) == tree` is a meaningful check.

    Program      tuple of statements
    Statement    CallStmt | Assign | Return | Loop | If
    Operand      Literal | Var | Param | Call        (Call only where the grammar allows it:
                                                    assignment, return, condition operands)
    Condition    Comparison | BoolOp                 (`&` binds tighter than `|`)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Union

IDENT_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
VAR_RE = re.compile(r"_\d+")
BOOL_WORDS = {"True": True, "False": False}
COMPARATORS = ("==", "!=", "<", ">")
# A quote closes a string only when the next visible character is one of these (or the text
# ends): strings may then hold apostrophes, as in TypeFly's `q,'what's the edible target?'`.
STRING_DELIMITERS = frozenset(";,{}()=!<>&|")


@dataclass(frozen=True)
class Literal:
    value: bool | int | float | str
    pos: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class Var:
    name: str                     # `_1`
    pos: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class Param:
    index: int                    # `$1` in a high-level skill definition
    pos: int = field(default=-1, compare=False)


Arg = Union[Literal, Var, Param]


@dataclass(frozen=True)
class Call:
    name: str                     # as written: an abbreviation (`mf`) or a full name
    args: tuple[Arg, ...] = ()
    pos: int = field(default=-1, compare=False)
    end: int = field(default=-1, compare=False)   # offset after the last argument


Operand = Union[Literal, Var, Param, Call]


@dataclass(frozen=True)
class Comparison:
    left: Operand
    op: str
    right: Operand
    pos: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class BoolOp:
    op: str                       # "&" or "|"
    left: "Condition"
    right: "Condition"
    pos: int = field(default=-1, compare=False)


Condition = Union[Comparison, BoolOp]


@dataclass(frozen=True)
class CallStmt:
    call: Call
    pos: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class Assign:
    var: Var
    value: Operand
    pos: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class Return:
    value: Operand
    pos: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class Loop:
    count: int
    body: tuple["Statement", ...]
    pos: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class If:
    condition: Condition
    body: tuple["Statement", ...]
    pos: int = field(default=-1, compare=False)


Statement = Union[CallStmt, Assign, Return, Loop, If]
Program = tuple[Statement, ...]


# --- printing -------------------------------------------------------------------------------

def _quote(text: str) -> str:
    return "'" + text + "'"


def literal_text(value: bool | int | float | str, *, bare_words: bool = False) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return repr(value)
    if bare_words and IDENT_RE.fullmatch(value) and value not in BOOL_WORDS:
        return value
    return _quote(value)


def arg_text(arg: Arg) -> str:
    """An argument as written in a call: object names bare (`s,bottle`), other text quoted."""
    if isinstance(arg, Var):
        return arg.name
    if isinstance(arg, Param):
        return f"${arg.index}"
    return literal_text(arg.value, bare_words=True)


def call_text(call: Call) -> str:
    return ",".join([call.name, *(arg_text(a) for a in call.args)])


def operand_text(op: Operand) -> str:
    if isinstance(op, Call):
        return call_text(op)
    if isinstance(op, Literal):
        # Outside a call's arguments a bare word would be read as a call: quote every string.
        return literal_text(op.value)
    return arg_text(op)


def condition_text(cond: Condition) -> str:
    if isinstance(cond, Comparison):
        return f"{operand_text(cond.left)}{cond.op}{operand_text(cond.right)}"
    return f"{condition_text(cond.left)}{cond.op}{condition_text(cond.right)}"


def statement_text(stmt: Statement) -> str:
    """One statement without its terminator."""
    if isinstance(stmt, CallStmt):
        return call_text(stmt.call)
    if isinstance(stmt, Assign):
        return f"{stmt.var.name}={operand_text(stmt.value)}"
    if isinstance(stmt, Return):
        return f"->{operand_text(stmt.value)}"
    if isinstance(stmt, Loop):
        return f"{stmt.count}{{{to_text(stmt.body)}}}"
    return f"?{condition_text(stmt.condition)}{{{to_text(stmt.body)}}}"


def to_text(program: Program) -> str:
    """Canonical MiniSpec text: statements joined by `;` (the parser reads it back to `program`)."""
    return ";".join(statement_text(s) for s in program)


def head_text(stmt: Statement) -> str:
    """A short label of a statement for messages: blocks print their head only."""
    if isinstance(stmt, Loop):
        return f"{stmt.count}{{...}}"
    if isinstance(stmt, If):
        return f"?{condition_text(stmt.condition)}{{...}}"
    return statement_text(stmt)


def assigned_vars(program: Program) -> tuple[str, ...]:
    """Variables the program assigns (`_1=iv,cup;`), inside blocks too, in first-seen order."""
    seen: list[str] = []
    for stmt in program:
        if isinstance(stmt, Assign):
            names = [stmt.var.name]
        elif isinstance(stmt, (Loop, If)):
            names = list(assigned_vars(stmt.body))
        else:
            names = []
        seen.extend(n for n in names if n not in seen)
    return tuple(seen)


def walk_calls(program: Program):
    """Every Call in textual order, inside blocks, conditions and assignments too."""
    for stmt in program:
        if isinstance(stmt, CallStmt):
            yield stmt.call
        elif isinstance(stmt, (Assign, Return)):
            if isinstance(stmt.value, Call):
                yield stmt.value
        elif isinstance(stmt, Loop):
            yield from walk_calls(stmt.body)
        else:
            yield from _condition_calls(stmt.condition)
            yield from walk_calls(stmt.body)


def _condition_calls(cond: Condition):
    if isinstance(cond, BoolOp):
        yield from _condition_calls(cond.left)
        yield from _condition_calls(cond.right)
        return
    for side in (cond.left, cond.right):
        if isinstance(side, Call):
            yield side
