"""The TimelyLLM authors' skill names and ours, and the plans an imported job generates.

Their data lists each job's measured skills as the names their executor matched in the plan
text (`exe_time_detail`: `mf`, `iv`, `s(` for their scan, `g(` for goto, `move_to` for the arm).
Each maps to one skill of our drone (MiniSpec) or arm skill set, so that the i-th measured time
is the i-th call of the plan our simulated engine generates for the job.

A plan is ours, in our dialect: either written for the job's instruction in a plans file
(lrtrace/authors/plans.yaml: the objects and distances of the authors' own plans) or built here,
one statement per measured skill, with default arguments. Either way its calls must be the
job's mapped skills, in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from timelyllm_ros.lrtrace.traces import read_yaml


class AuthorsImportError(ValueError):
    """Data that cannot be imported; the message names the file, the job and the field."""


@dataclass(frozen=True)
class OurSkill:
    name: str  # our full skill name, as the planner's parsed calls name it
    statement: str  # the statement the plan builder writes; {var} a fresh result, {ms} a delay
    why: str = ""  # how theirs and ours differ, when they do


# Their drone skills (TypeFly's MiniSpec as their prompt defines it) -> our drone skill set.
DRONE: dict[str, OurSkill] = {
    **{ab: OurSkill(name, f"{ab},50;") for ab, name in (
        ("mf", "move_forward"), ("mb", "move_backward"), ("ml", "move_left"),
        ("mr", "move_right"), ("mu", "move_up"), ("md", "move_down"))},
    "tc": OurSkill("turn_cw", "tc,90;"),
    "tu": OurSkill("turn_ccw", "tu,90;"),
    "d": OurSkill("delay", "d,{ms};", "theirs takes seconds, ours milliseconds"),
    **{ab: OurSkill(name, f"{{var}}={ab},target;") for ab, name in (
        ("iv", "is_visible"), ("ox", "object_x"), ("oy", "object_y"), ("ow", "object_width"),
        ("oh", "object_height"))},
    "p": OurSkill("query", "{var}=q,'which object is it';", "their `p` (probe) asks the LLM, "
                  "as our `q` does; our `p` is a picture"),
    "l": OurSkill("log", "l,'done';"),
    "tp": OurSkill("picture", "p;"),
    "s(": OurSkill("sweeping", "{var}=s,target;", "their scan is TypeFly's sweeping"),
    "sa(": OurSkill("sweeping_abstract", "{var}=sa,'target';"),
    "g(": OurSkill("approach", "a;", "their goto flies to the named object; our approach flies "
                   "120 cm towards the object the drone faces"),
}

# Their arm skills (FLTRNN's move_to / take / drop, and their TypeFly-style arm's gt / pi / dr /
# sc) -> our arm skill set (LLM^3 style).
ARM: dict[str, OurSkill] = {
    "move_to": OurSkill("move", "move(0,0,300)", "theirs moves to an object's detected "
                        "position; ours to coordinates"),
    "take": OurSkill("pick", "pick(target)"),
    "drop": OurSkill("place", "place(target,table)", "ours names where the object goes"),
    "gt": OurSkill("move", "move(0,0,300)"),
    "pi": OurSkill("pick", "pick(target)"),
    "dr": OurSkill("place", "place(target,table)"),
    "sc": OurSkill("check", "check(target)", "their scan looks for an object; our check looks "
                   "at one"),
}

SKILL_MAPS: dict[str, dict[str, OurSkill]] = {"drone": DRONE, "arm": ARM}

# Their skills with no counterpart in our sets: named in the error, never guessed.
UNMAPPED: dict[str, str] = {
    "od": "object_dis (distance to an object): our drone measures no distances",
    "rp": "re_plan: our plans have no statement that asks for a new plan",
    "t": "time (the plan's elapsed time): our skill sets have no clock",
    "sd": "sound (their robot dog): no speaker in our skill sets",
}


def our_skill(skill_set: str, theirs: str) -> OurSkill | None:
    return SKILL_MAPS[skill_set].get(theirs)


def why_unmapped(skill_set: str, theirs: str) -> str:
    if theirs in UNMAPPED:
        return UNMAPPED[theirs]
    other = [s for s, table in SKILL_MAPS.items() if s != skill_set and theirs in table]
    if other:
        return f"a skill of our {other[0]} skill set, not of the {skill_set}'s"
    return f"not a skill we know of their {skill_set}"


def build_plan(skill_set: str, skills: Sequence[tuple[str, float]]) -> str:
    """A plan of one statement per measured skill, in order, with default arguments (50 cm,
    90 degrees, an object called `target`; a delay as long as was measured). Every skill must
    be mapped (our_skill)."""
    parts = []
    var = 0
    for theirs, seconds in skills:
        ours = SKILL_MAPS[skill_set][theirs]
        text = ours.statement
        if "{var}" in text:
            var += 1
            text = text.replace("{var}", f"_{var}")
        text = text.replace("{ms}", str(max(1, round(seconds * 1000))))
        parts.append(text)
    return "->".join(parts) if skill_set == "arm" else "".join(parts)


def load_plans(path: str | Path) -> dict[str, str]:
    """A plans file: `plans:` a list of {instruction, plan}, the instruction exactly as the
    authors' task_input. Errors name the file and the entry."""
    p = Path(path)
    data = read_yaml(p, AuthorsImportError)
    if not isinstance(data, Mapping) or not isinstance(data.get("plans"), list):
        raise AuthorsImportError(f"{p}: plans: expected a mapping with a `plans` list")
    plans: dict[str, str] = {}
    for i, entry in enumerate(data["plans"]):
        where = f"{p}: plans[{i}]"
        if not isinstance(entry, Mapping) or set(entry) != {"instruction", "plan"}:
            raise AuthorsImportError(f"{where}: expected exactly the keys instruction and plan")
        instruction, plan = entry["instruction"], entry["plan"]
        for key, value in (("instruction", instruction), ("plan", plan)):
            if not isinstance(value, str) or not value.strip():
                raise AuthorsImportError(f"{where}: {key}: must be a non-empty string")
        if instruction in plans:
            raise AuthorsImportError(f"{where}: instruction: listed twice")
        plans[instruction] = plan
    return plans


def mapping_table(used: Mapping[str, Any] | None = None) -> list[tuple[str, str, str, str]]:
    """(skill set, theirs, ours, note) for every mapped skill, or only those in `used`
    ({skill set: names})."""
    rows = []
    for skill_set, table in SKILL_MAPS.items():
        for theirs, ours in table.items():
            if used is None or theirs in used.get(skill_set, ()):
                rows.append((skill_set, theirs, ours.name, ours.why))
    return rows
