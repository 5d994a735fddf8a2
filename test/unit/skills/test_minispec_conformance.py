"""MiniSpec as TypeFly defines it: TypeFly's own example plans and high-level skill definitions
(test/unit/skills/data/typefly/, with their source), and property tests on random programs
from the grammar (print -> parse round trip, prefixes, segment boundaries)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from minispec_strategies import programs

from timelyllm_ros.core.skills.base import SkillSyntaxError
from timelyllm_ros.core.skills.minispec import MINISPEC, closes_quote, parse_program
from timelyllm_ros.core.skills.minispec_ast import (
    Assign,
    Call,
    Literal,
    Return,
    Var,
    statement_text,
    to_text,
)
from timelyllm_ros.core.skills.minispec_skills import SKILLS, check_definitions, check_skills

DATA = Path(__file__).parent / "data" / "typefly"


def _rows(name):
    rows = []
    for line in (DATA / name).read_text(encoding="utf-8").splitlines():
        source, ident, text = line.split("\t")
        rows.append(pytest.param(text, id=f"{source}#{ident}"))
    return rows


PLANS = _rows("plan_examples.tsv")
DEFINITIONS = _rows("high_level_skills.tsv")
PAREN_PLANS = _rows("plan_examples_paren.tsv")
# TypeFly's own typos, kept verbatim in the data (see data/typefly/README.md).
DEFECTS = {
    "tcc,180;_1=q,'is there anything edible?';l,_1": "unknown skill abbreviation 'tcc'",
    "8{_1=q'what's the animal target?';?_1!=False{l,_1;->True}tc,45}->False": "expected ';'",
    "tu(90);?iv('apple')==True&iv('orange'){l('Yes');->True}l('No');->False;": "comparator",
}


def segments_of(text):
    segments, pos = [], 0
    while (end := MINISPEC.next_boundary(text, pos)) is not None:
        segments.append(text[pos:end])
        pos = end
    end = MINISPEC.final_segment_end(text, pos)
    if end is not None:
        segments.append(text[pos:end])
        pos = end
    return segments, text[pos:]


def balanced(text):
    depth, quote = 0, None
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote and closes_quote(text, i) else quote
        elif c in "'\"":
            quote = c
        elif c in "{}":
            depth += 1 if c == "{" else -1
    return depth == 0 and quote is None


# ---------------------------------------------------------------------------------------------
# TypeFly's plans and definitions


def test_the_data_is_all_there():
    assert (len(PLANS), len(DEFINITIONS), len(PAREN_PLANS)) == (21, 7, 14)


@pytest.mark.parametrize("plan", PLANS)
def test_typefly_plan_parses_segments_and_matches_the_regex(plan):
    if plan in DEFECTS:
        with pytest.raises(SkillSyntaxError, match=DEFECTS[plan]):
            MINISPEC.parse(plan)
        return
    whole = MINISPEC.parse(plan)
    segments, rest = segments_of(plan)
    assert rest == "" and "".join(segments) == plan
    calls = []
    for segment in segments:
        assert balanced(segment)
        calls.extend(MINISPEC.parse(segment).calls)
    assert tuple(calls) == whole.calls
    assert re.fullmatch(MINISPEC.output_regex(8), plan), plan


def test_typefly_plan_counts():
    ok = sum(1 for p in PLANS if p.values[0] not in DEFECTS)
    assert ok == 18  # of 21: two `tcc` (TypeFly's typo for `tu`) and one missing comma


@pytest.mark.parametrize("definition", DEFINITIONS)
def test_typefly_definitions_parse_and_segment(definition):
    program = parse_program(definition, params=True)
    check_skills(program)
    segments, rest = segments_of(definition)
    assert rest == "" and "".join(segments) == definition
    for segment in segments:
        parse_program(segment, params=True)
    assert parse_program(to_text(program), params=True) == program


def test_our_definitions_are_typeflys():
    check_definitions()
    latest = {p.id.split("#")[1]: p.values[0] for p in DEFINITIONS if "bcc92a25" in p.id}
    ours = {s.name: s.definition for s in SKILLS.values() if s.high_level}
    assert ours == latest


@pytest.mark.parametrize("plan", PAREN_PLANS)
def test_parenthesised_dialect_parses_as_syntax(plan):
    if plan in DEFECTS or "*" in plan:
        with pytest.raises(SkillSyntaxError):
            parse_program(plan)
        return
    program = parse_program(plan)
    assert parse_program(to_text(program)) == program


def test_apostrophes_and_returned_calls():
    program = parse_program("_1=q,'what's the edible target?';->l,'Yes'")
    assert program[0] == Assign(Var("_1"), Call("q", (Literal("what's the edible target?"),)))
    assert program[1] == Return(Call("l", (Literal("Yes"),)))
    # A quote before a letter never ends a string, so the `;` after `it's` is a boundary only
    # once the string has closed.
    assert MINISPEC.next_boundary("l,'it's';p", 0) == 9
    assert MINISPEC.next_boundary("l,'it's", 0) is None


def test_params_only_in_definitions():
    with pytest.raises(SkillSyntaxError, match="parameter"):
        parse_program("s,$1")


# ---------------------------------------------------------------------------------------------
# Random programs from the grammar



@settings(max_examples=150, deadline=None)
@given(programs)
def test_print_then_parse_is_the_same_tree(program):
    text = to_text(program)
    assert parse_program(text) == program, text
    check_skills(parse_program(text))


@settings(max_examples=80, deadline=None)
@given(programs)
def test_segments_are_the_top_level_statements(program):
    text = to_text(program)
    segments, rest = segments_of(text)
    assert rest == ""
    expected = [statement_text(s) + ";" for s in program[:-1]] + [statement_text(program[-1])]
    assert segments == expected
    pos = 0
    for segment, statement in zip(segments, program):
        pos += len(segment)
        assert balanced(text[:pos]), (text, pos)   # never inside a string or a block
        assert parse_program(segment) == (statement,)


@settings(max_examples=60, deadline=None)
@given(programs)
def test_every_prefix_is_a_boundary_or_incomplete(program):
    text = to_text(program)
    full_bounds, pos = set(), 0
    for segment in segments_of(text)[0]:
        pos += len(segment)
        full_bounds.add(pos)
    for k in range(len(text) + 1):
        prefix = text[:k]
        pos = 0
        while (end := MINISPEC.next_boundary(prefix, pos)) is not None:
            assert end in full_bounds            # a boundary of the prefix is one of the plan's
            MINISPEC.parse(prefix[pos:end])
            pos = end
        MINISPEC.final_segment_end(prefix, pos)  # never raises
        try:
            MINISPEC.parse(prefix[pos:])
        except SkillSyntaxError:
            pass                                 # incomplete (or empty): fine, never a crash
