"""Sizes of a generation that the scheduler's parts all need: its KV context, its plan budget and
the bound of its current run."""

from __future__ import annotations

import re

from timelyllm_ros.core.skills.skillset import SkillSet
from timelyllm_ros.core.task import SegmentRecord, TaskRecord, TaskSpec


def context_of(task: TaskRecord) -> int:
    return len(task.prompt_ids) + len(task.generated.token_ids) + task.observation_tokens


def plan_budget(spec: TaskSpec, skill_set: SkillSet) -> int:
    if spec.max_plan_tokens is None:
        return skill_set.max_plan_tokens
    return min(skill_set.max_plan_tokens, spec.max_plan_tokens)


def bound_of(task: TaskRecord, skill_set: SkillSet) -> int:
    left = plan_budget(task.spec, skill_set) - len(task.generated.token_ids)
    return max(1, min(skill_set.max_segment_tokens, left))


def is_complete_program(regex: str | None, text: str) -> bool:
    if regex is None or not text:
        return False
    try:
        return re.fullmatch(regex, text) is not None
    except re.error:
        return False


def first_unreported(task: TaskRecord) -> SegmentRecord | None:
    for segment in task.segments:
        if segment.finished_s is None:  # (`not segment.reported`, without a property call)
            return segment
    return None
