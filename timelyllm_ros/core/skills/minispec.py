"""MiniSpec, the drone skill language (TypeFly): segmenter, parser and output regex, one module
per job:

    minispec_ast.py      the tree and its printer
    minispec_parser.py   text -> tree, from TypeFly's published grammar (see its doc)
    minispec_skills.py   the drone's skill table, TypeFly's high-level skill definitions
    minispec_regex.py    the regex for constrained decoding
    flow.py              expected executions per call (loops, conditionals) for estimates
    interpreter.py       runs a tree on a robot (TaskInterpreter)

A program is a list of statements ended by `;`:
    mf,120;            skill call (abbreviation, comma-separated arguments)
    _1=iv,bottle;      assignment of a call result (or of a plain value)
    ->_1;  ->l,'Yes'   return (ends the plan)
    8{tc,45;d,200}     loop
    ?_1==True&_2>0.5{l,'seen'}   conditional; comparators > < == !=, joined by & or |
A block may be followed directly by the next statement; the `;` after `}` is optional.
A segment boundary is the end of a complete top-level statement, never inside a string or a
block.
"""

from __future__ import annotations

from typing import Mapping

from timelyllm_ros.core.skills.base import (
    BracketedLanguage,
    ParsedSegment,
    SkillCall,
    SkillSyntaxError,
    scan_top_level,
)
from timelyllm_ros.core.skills.flow import weighted_calls
from timelyllm_ros.core.skills.minispec_ast import (STRING_DELIMITERS, Program, arg_text,
                                                  assigned_vars)
from timelyllm_ros.core.skills.minispec_parser import parse_program
from timelyllm_ros.core.skills.minispec_regex import minispec_regex
from timelyllm_ros.core.skills.minispec_skills import SKILLS, SkillSpec, check_call, check_skills

__all__ = ["MINISPEC", "MiniSpecLanguage", "SKILLS", "SkillSpec", "SkillSyntaxError",
           "minispec_regex", "parse_program", "closes_quote"]


def closes_quote(text: str, index: int) -> bool:
    """The parser's string rule: a quote ends a string where the next visible character is a
    delimiter or the text ends."""
    j = index + 1
    n = len(text)
    while j < n and text[j].isspace():
        j += 1
    return j == n or text[j] in STRING_DELIMITERS


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
                          separator=";", closes_quote=closes_quote)


class MiniSpecLanguage(BracketedLanguage):
    name = "minispec"

    def __init__(self, skills: Mapping[str, SkillSpec] = SKILLS):
        self.skills = dict(skills)

    def scan(self, text: str, start: int) -> tuple[int | None, int, str | None, bool]:
        return _scan(text, start)

    def program(self, text: str) -> Program:
        """Parse and check against the skill table; raises SkillSyntaxError."""
        program = parse_program(text)
        check_skills(program, self.skills)
        return program

    def parse(self, segment_text: str) -> ParsedSegment:
        program = self.program(segment_text)
        calls = []
        for call, weight in weighted_calls(program):
            spec = check_call(call, self.skills)
            source = segment_text[call.pos:call.end] if call.end > call.pos else ""
            calls.append(SkillCall(spec.name, tuple(arg_text(a) for a in call.args), source,
                                   weight=weight))
        return ParsedSegment(segment_text, tuple(calls), program, binds=assigned_vars(program))

    def output_regex(self, max_statements: int) -> str | None:
        return minispec_regex(max_statements)


MINISPEC = MiniSpecLanguage()
