"""Skill languages by name: how each robot kind's plans are segmented and parsed."""

from __future__ import annotations

from timelyllm_ros.core.skills.arm import ARM, ArmLanguage
from timelyllm_ros.core.skills.base import ParsedSegment, SkillCall, SkillLanguage, SkillSyntaxError
from timelyllm_ros.core.skills.chat import ChatLanguage, reading_time_s
from timelyllm_ros.core.skills.minispec import MINISPEC, MiniSpecLanguage
from timelyllm_ros.core.skills.tool_call import TOOL_CALL, ToolCallLanguage

_LANGUAGES: dict[str, SkillLanguage] = {
    "minispec": MINISPEC,
    "drone": MINISPEC,
    "arm": ARM,
    "chat": ChatLanguage("sentence"),
    "chat-paragraph": ChatLanguage("paragraph"),
    "tool-call": TOOL_CALL,
}


def known_languages() -> tuple[str, ...]:
    """Every name get_language accepts, aliases included."""
    return tuple(_LANGUAGES)


def get_language(name: str) -> SkillLanguage:
    try:
        return _LANGUAGES[name]
    except KeyError:
        raise KeyError(
            f"unknown skill language {name!r}; known: {', '.join(known_languages())}"
        ) from None


__all__ = [
    "ARM",
    "MINISPEC",
    "ArmLanguage",
    "ChatLanguage",
    "MiniSpecLanguage",
    "ParsedSegment",
    "SkillCall",
    "SkillLanguage",
    "SkillSyntaxError",
    "TOOL_CALL",
    "ToolCallLanguage",
    "get_language",
    "known_languages",
    "reading_time_s",
]
