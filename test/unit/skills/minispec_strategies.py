"""Hypothesis strategies: random MiniSpec trees from the grammar (minispec_ast), shaped as
the parser builds them (`|` of left-associated `&` chains), with strings that hold quotes."""

from __future__ import annotations

from hypothesis import strategies as st

from timelyllm_ros.core.skills.minispec import closes_quote
from timelyllm_ros.core.skills.minispec_ast import (
    Assign,
    BoolOp,
    Call,
    CallStmt,
    Comparison,
    If,
    Literal,
    Loop,
    Return,
    Var,
)
from timelyllm_ros.core.skills.minispec_skills import SKILLS

_ALPHABET = "ab ;{}'?,"


def _string_ok(s):
    quoted = "'" + s + "'"
    return all(not closes_quote(quoted, i) for i in range(1, len(quoted) - 1) if quoted[i] == "'")


_strings = st.text(_ALPHABET, max_size=8).filter(_string_ok)
_vars = st.integers(1, 12).map(lambda n: Var(f"_{n}"))
_numbers = st.one_of(st.integers(-500, 500),
                     st.floats(-100, 100, allow_nan=False).map(lambda x: round(x, 3)))
_literals = st.one_of(st.booleans(), _numbers, _strings).map(Literal)
_words = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).map(Literal)
_ARG = {"int": st.one_of(st.integers(0, 999).map(Literal), _vars),
        "obj": st.one_of(_words, _strings.map(Literal), _vars),
        "text": st.one_of(_literals, _words, _vars)}


@st.composite
def calls(draw):
    spec = draw(st.sampled_from(sorted(SKILLS.values(), key=lambda s: s.abbrev)))
    return Call(spec.abbrev, tuple(draw(_ARG[k]) for k in spec.args))


_operands = st.one_of(_literals, _vars, calls())
_comparisons = st.builds(Comparison, _operands, st.sampled_from(["==", "!=", "<", ">"]),
                         _operands)


@st.composite
def conditions(draw):
    """`|` of `&`-chains, left-associated: the shape the parser builds."""
    disjuncts = []
    for _ in range(draw(st.integers(1, 3))):
        parts = draw(st.lists(_comparisons, min_size=1, max_size=3))
        cond = parts[0]
        for p in parts[1:]:
            cond = BoolOp("&", cond, p)
        disjuncts.append(cond)
    cond = disjuncts[0]
    for d in disjuncts[1:]:
        cond = BoolOp("|", cond, d)
    return cond


_simple = st.one_of(calls().map(CallStmt), st.builds(Assign, _vars, _operands),
                    st.builds(Return, _operands))
_statements = st.recursive(
    _simple,
    lambda inner: st.one_of(
        st.builds(Loop, st.integers(1, 20), st.lists(inner, min_size=1, max_size=3).map(tuple)),
        st.builds(If, conditions(), st.lists(inner, min_size=1, max_size=3).map(tuple))),
    max_leaves=8)
programs = st.lists(_statements, min_size=1, max_size=5).map(tuple)
