"""The drone's MiniSpec skills: abbreviations, argument kinds, and the high-level skills that
TypeFly defines in MiniSpec itself (typefly/TypeFly, controller/assets/high_level_skills.json).

A call may name a skill by its abbreviation (`mf,50`) or its full name (`move_forward,50`).
`check_skills` validates a parsed tree against a table: unknown skills, argument counts, and
argument kinds ("int": an integer literal or a variable; "obj": an object name, string or
variable; "text": anything).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping

from timelyllm_ros.core.skills.base import SkillSyntaxError
from timelyllm_ros.core.skills.minispec_ast import (
    Call,
    Literal,
    Param,
    Program,
    Var,
    arg_text,
    walk_calls,
)


@dataclass(frozen=True)
class SkillSpec:
    abbrev: str
    name: str
    # One entry per argument: "int" (integer literal or variable), "obj" (object name), "text".
    args: tuple[str, ...] = ()
    # High-level skills: their MiniSpec definition, `$1`.. standing for the arguments.
    definition: str | None = None

    @property
    def high_level(self) -> bool:
        return self.definition is not None

    @functools.cached_property
    def body(self) -> Program:
        """The parsed definition (high-level skills only)."""
        from timelyllm_ros.core.skills.minispec_parser import parse_program

        if self.definition is None:
            raise ValueError(f"{self.name} is a low-level skill: it has no definition")
        return parse_program(self.definition, params=True)


# TypeFly's high-level skills, as its high_level_skills.json defines them.
SWEEPING = "8{_1=iv,$1;?_1==True{->True}tc,45}->False"
SWEEPING_ABSTRACT = "8{_1=q,$1;?_1!=False{->_1}tc,45}->False"
APPROACH = "mf,120"
ORIENTING = "4{_1=ox,$1;?_1>0.6{tc,15};?_1<0.4{tu,15};_2=ox,$1;?_2<0.6&_2>0.4{->True}}->False"

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
        SkillSpec("s", "sweeping", ("obj",), SWEEPING),
        SkillSpec("sa", "sweeping_abstract", ("text",), SWEEPING_ABSTRACT),
        SkillSpec("a", "approach", (), APPROACH),
        SkillSpec("o", "orienting", ("obj",), ORIENTING),
        SkillSpec("tk", "takeoff"),
        SkillSpec("ld", "land"),
    )
}


def lookup(table: Mapping[str, SkillSpec], name: str) -> SkillSpec | None:
    """A skill by abbreviation or by full name."""
    spec = table.get(name)
    if spec is not None:
        return spec
    return _by_name(tuple(table.values())).get(name)


@functools.lru_cache(maxsize=8)
def _by_name(specs: tuple[SkillSpec, ...]) -> dict[str, SkillSpec]:
    return {s.name: s for s in specs}


def _fits_kind(arg, kind: str) -> bool:
    if isinstance(arg, (Var, Param)):
        return True
    assert isinstance(arg, Literal)
    if kind == "int":
        return isinstance(arg.value, int) and not isinstance(arg.value, bool)
    if kind == "obj":
        return isinstance(arg.value, str)
    return True


def check_call(call: Call, table: Mapping[str, SkillSpec]) -> SkillSpec:
    spec = lookup(table, call.name)
    if spec is None:
        raise SkillSyntaxError(f"unknown skill abbreviation {call.name!r}", call.pos)
    if len(call.args) != len(spec.args):
        raise SkillSyntaxError(
            f"{call.name!r} ({spec.name}) takes {len(spec.args)} argument(s), got {len(call.args)}",
            call.pos)
    for arg, kind in zip(call.args, spec.args):
        if not _fits_kind(arg, kind):
            raise SkillSyntaxError(
                f"argument {arg_text(arg)!r} of {call.name!r} ({spec.name}) must be {kind}",
                arg.pos)
    return spec


def check_skills(program: Program, table: Mapping[str, SkillSpec] = SKILLS) -> None:
    """Raise SkillSyntaxError at the first call the table does not allow."""
    for call in walk_calls(program):
        check_call(call, table)


def check_definitions(table: Mapping[str, SkillSpec] = SKILLS) -> None:
    """Every high-level definition parses, uses known skills and only its own parameters."""
    for spec in table.values():
        if not spec.high_level:
            continue
        try:
            body = spec.body
            check_skills(body, table)
        except SkillSyntaxError as err:
            raise ValueError(f"high-level skill {spec.name!r}: {err}") from None
        for call in walk_calls(body):
            for arg in call.args:
                if isinstance(arg, Param) and not 1 <= arg.index <= len(spec.args):
                    raise ValueError(f"high-level skill {spec.name!r}: ${arg.index} but the "
                                     f"skill takes {len(spec.args)} argument(s)")
