"""The regex that constrains decoding to MiniSpec (vLLM structured outputs).

A regular language cannot nest without bound, so blocks nest two levels deep, which covers
every plan and skill definition TypeFly publishes (a conditional inside a loop). Within that,
it admits what the parser accepts, in the parser's canonical spelling: calls by abbreviation
with comma-separated arguments, `;` between statements (optional after a block and at the
end), a block directly followed by the next statement, a return of a value or of a call
(`->l,'Yes'`), and strings that hold apostrophes (`'what's the edible target?'`: inside a
string a quote is followed by a letter, so it never ends the string, see minispec_parser.py).

Plain groups, classes and bounded repeats only, so that Python `re` and vLLM's structured
output backends read it the same way. Bounds on numbers, names and bodies keep a small model
from rambling inside one statement.
"""

from __future__ import annotations

import functools
from typing import Mapping

from timelyllm_ros.core.skills.minispec_skills import SKILLS, SkillSpec

INTEGER = "[1-9][0-9]{0,2}"
VAR = "_[1-9]"
OBJ = "[a-z][a-z0-9_]{0,23}"
TEXT = "'[A-Za-z0-9 ,.?!]([A-Za-z0-9 ,.?!]|'[a-z]){0,59}'"
NUMBER = "-?(0|[1-9][0-9]{0,2})(\\.[0-9]{1,2})?"
# A loop of one iteration is never meant; small models otherwise open every plan with `1{`.
LOOP_HEAD = "([2-9]|[1-9][0-9])"
# Bodies of the inner and the outer block level (statements per body).
INNER_BODY_MAX = 4
OUTER_BODY_MAX = 6


def _alternatives(items: list[str]) -> str:
    return "(" + "|".join(items) + ")"


def call_regex(table: Mapping[str, SkillSpec] = SKILLS) -> str:
    arg_re = {"int": f"({INTEGER}|{VAR})", "obj": f"({OBJ}|{VAR})", "text": f"({TEXT}|{VAR})"}
    by_kind: dict[tuple[str, ...], list[str]] = {}
    for spec in table.values():
        by_kind.setdefault(spec.args, []).append(spec.abbrev)
    alternatives = []
    for kinds, abbrevs in sorted(by_kind.items()):
        names = _alternatives(sorted(abbrevs, key=lambda a: (-len(a), a)))
        alternatives.append(names + "".join("," + arg_re[k] for k in kinds))
    return _alternatives(alternatives)


def _sequence(statements: tuple[str, str], most: int) -> str:
    """1..most statements: simple ones need `;` before the next, blocks may go without."""
    simple, block = statements
    item = f"({simple};|{block};?)" if block else f"({simple};)"
    last = f"({simple}|{block})" if block else f"({simple})"
    return f"{item}{{0,{most - 1}}}{last};?"


@functools.lru_cache(maxsize=16)
def minispec_regex(max_statements: int) -> str:
    """Regex admitting 1..max_statements top-level statements (see the module doc)."""
    if max_statements < 1:
        raise ValueError(f"max_statements must be >= 1, got {max_statements}")
    call = call_regex()
    value = f"({VAR}|True|False|{NUMBER}|{TEXT})"
    simple = f"({call}|{VAR}=({call}|{value})|->({call}|{value}))"
    comparison = f"{VAR}(==|!=|<|>){value}"
    condition = f"{comparison}([&|]{comparison}){{0,2}}"
    head = f"({LOOP_HEAD}|\\?{condition})"
    inner = f"({head}\\{{{_sequence((simple, ''), INNER_BODY_MAX)}\\}})"
    outer = f"({head}\\{{{_sequence((simple, inner), OUTER_BODY_MAX)}\\}})"
    return _sequence((simple, outer), max_statements)
