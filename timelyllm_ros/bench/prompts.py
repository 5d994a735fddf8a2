"""Prompts of the paper's length on the simulated engine: each skill set's system prompt gets a
fixed preamble, shared by all its tasks and so cacheable like TypeFly's fixed prompt, sized so
that the set's shortest prompt has the paper's 2884 tokens (its latency profile)."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping

from timelyllm_ros.core.engine.sim.tokenizer import PieceTokenizer
from timelyllm_ros.core.skills.skillset import SkillSet


def _prompt_length(tokenizer: PieceTokenizer, skill_set: SkillSet, instruction: str) -> int:
    # As SegmentScheduler._prompt_ids builds a prompt for an engine without a chat template.
    messages = skill_set.render_messages(instruction)
    return len(tokenizer.tokenize("\n".join(m["content"] for m in messages) + "\n"))


_PREAMBLE_HEAD = ("Context shared by every task of this robot kind (fixed preamble: scene, skill "
                  "documentation and worked examples, here as filler words so that the prompt "
                  "has the length of the paper's latency profile):")
_PREAMBLE_WORDS = ("scene", "object", "table", "bottle", "person", "window", "door", "chair",
                   "example", "plan", "skill", "move", "turn", "check", "visible", "report")


def pad_skill_sets(skill_sets: Mapping[str, SkillSet], prompt_tokens: int | None,
                   instructions: Mapping[str, Iterable[str]]) -> dict[str, SkillSet]:
    """Skill sets whose system prompts start with a fixed preamble, sized so that the shortest
    prompt of each set (over `instructions[name]`) has `prompt_tokens` tokens on the simulated
    engine's tokenizer. The preamble is the same for every task of a set, so prefix caching can
    share it as it shares the real fixed prompt. Sets already that long, sets without
    instructions and `prompt_tokens=None` are returned unchanged. `instructions` are the traces'
    own: a task's context (`lrtrace.workload.TaskSpec.context`) comes on top of the padding."""
    out = dict(skill_sets)
    if prompt_tokens is None:
        return out
    tokenizer = PieceTokenizer()
    for name, skill_set in skill_sets.items():
        texts = list(instructions.get(name, ()))
        if not texts:
            continue
        shortest = min(texts, key=lambda t: _prompt_length(tokenizer, skill_set, t))
        missing = prompt_tokens - _prompt_length(tokenizer, skill_set, shortest)
        if missing <= 0:
            continue
        words = max(0, missing - len(tokenizer.tokenize(_PREAMBLE_HEAD + "\n\n")))
        for _ in range(8):  # each " word" is one token: converges in a step or two
            preamble = _PREAMBLE_HEAD + "".join(
                " " + _PREAMBLE_WORDS[i % len(_PREAMBLE_WORDS)] for i in range(words))
            padded = replace(skill_set, system_prompt=preamble + "\n\n" + skill_set.system_prompt)
            diff = prompt_tokens - _prompt_length(tokenizer, padded, shortest)
            if diff == 0 or words + diff < 0:
                break
            words += diff
        out[name] = padded
    return out
