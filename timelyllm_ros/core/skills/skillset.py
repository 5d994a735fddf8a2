"""Skill sets: the fixed, server-side part of a robot kind's prompt plus its generation limits.

One YAML file per skill set in config/skillsets/; the file name (without .yaml) is the set's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from timelyllm_ros.core.skills import get_language
from timelyllm_ros.core.skills.base import SkillLanguage

_STR_KEYS = ("language", "system_prompt", "user_template")
_INT_KEYS = ("max_statements", "max_segment_tokens", "max_plan_tokens")
_PLACEHOLDER = "{instruction}"
_SCENE = "{scene}"


@dataclass(frozen=True)
class SkillSet:
    name: str
    language: SkillLanguage
    system_prompt: str
    user_template: str
    max_statements: int
    max_segment_tokens: int
    max_plan_tokens: int
    # Robot results flow into the resumed plan (core/sched/observations.py): a generation
    # stops after a segment that stores skill results, waits for the robot's report and
    # resumes with it appended ("# ok _1=False"). Optional YAML key, default off.
    observations: bool = False

    def render_messages(self, instruction: str, scene: str = "") -> list[dict[str, str]]:
        """The chat messages of one task. `scene`, what the robot sees (TypeFly's scene
        description), goes where the template says `{scene}`, or else on a `Scene:` line
        before the task; it is in the user message, so the system prompt stays one prefix
        that every task shares in the prefix cache."""
        # Plain replacement, not str.format: MiniSpec prompts are full of literal braces.
        user = self.user_template.replace(_PLACEHOLDER, instruction)
        if _SCENE in user:
            user = user.replace(_SCENE, scene)
        elif scene:
            user = f"Scene: {scene}\n{user}"
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": user},
        ]

    def output_regex(self) -> str | None:
        return self.language.output_regex(self.max_statements)


def load_skillset(path: str | Path) -> SkillSet:
    path = Path(path)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of keys, got {type(data).__name__}")
    expected = set(_STR_KEYS) | set(_INT_KEYS) | {"observations"}
    unknown = sorted(str(key) for key in set(data) - expected)
    if unknown:
        raise ValueError(f"{path}: unknown key {unknown[0]!r}")
    for key in [*_STR_KEYS, *_INT_KEYS]:
        if key not in data:
            raise ValueError(f"{path}: missing key {key!r}")
    for key in _STR_KEYS:
        if not isinstance(data[key], str) or not data[key].strip():
            raise ValueError(f"{path}: key {key!r} must be a non-empty string")
    for key in _INT_KEYS:
        value = data[key]
        # bool is an int subclass; `max_statements: yes` is a typo, not 1.
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{path}: key {key!r} must be a positive integer, got {value!r}")
    observations = data.get("observations", False)
    if not isinstance(observations, bool):
        raise ValueError(f"{path}: key 'observations' must be true or false, got {observations!r}")
    if _PLACEHOLDER not in data["user_template"]:
        raise ValueError(f"{path}: key 'user_template' lacks the {_PLACEHOLDER} placeholder")
    try:
        language = get_language(data["language"])
    except KeyError as exc:
        raise ValueError(f"{path}: key 'language': {exc.args[0]}") from None
    return SkillSet(
        name=path.stem,
        language=language,
        system_prompt=data["system_prompt"].strip(),
        user_template=data["user_template"],
        max_statements=data["max_statements"],
        max_segment_tokens=data["max_segment_tokens"],
        max_plan_tokens=data["max_plan_tokens"],
        observations=observations,
    )


def load_skillsets(config_dir: str | Path) -> dict[str, SkillSet]:
    """All `*.yaml` skill sets in `config_dir`, keyed by file stem."""
    config_dir = Path(config_dir)
    if not config_dir.is_dir():
        raise ValueError(f"{config_dir}: not a directory")
    return {p.stem: load_skillset(p) for p in sorted(config_dir.glob("*.yaml"))}
