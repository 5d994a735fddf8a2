"""Tool-call "skill language": free text in which the model calls an external tool (an API).

An agent's output interleaves reasoning text with calls written `<call:NAME>`; generation must
pause at each call until the tool answers (INFERCEPT / LAMPS's augmented requests, seed 004). A
robot skill is exactly such a call, so a segment here is "text up to and including one call", and
the call's execution time is the tool's latency (the execution-time model keys it by NAME). Text
after the last call is the final answer: a segment with no call, delivered without a pause.
"""

from __future__ import annotations

import re

from timelyllm_ros.core.skills.base import ParsedSegment, SkillCall, SkillSyntaxError

_CALL = re.compile(r"<call:([A-Za-z_][A-Za-z0-9_]*)>")
# An opening `<call:` whose closing `>` has not been generated yet, or a malformed one.
_OPEN = re.compile(r"<call:")
_WORD = re.compile(r"\w")


class ToolCallLanguage:
    name = "tool-call"

    def next_boundary(self, text: str, start: int) -> int | None:
        match = _CALL.search(text, start)
        return match.end() if match else None

    def final_segment_end(self, text: str, start: int) -> int | None:
        boundary = self.next_boundary(text, start)
        if boundary is not None:
            return boundary
        return len(text) if _WORD.search(text, start) else None

    def parse(self, segment_text: str) -> ParsedSegment:
        calls = _CALL.findall(segment_text)
        if len(calls) > 1:
            raise SkillSyntaxError(f"a segment holds one tool call, got {len(calls)}: "
                                   f"{segment_text!r}")
        if not calls and _OPEN.search(segment_text):
            raise SkillSyntaxError(f"unterminated or malformed tool call in {segment_text!r}")
        if calls:
            return ParsedSegment(segment_text, (SkillCall(calls[0], (), f"<call:{calls[0]}>"),))
        return ParsedSegment(segment_text, ())

    def output_regex(self, max_statements: int) -> str | None:
        return None


TOOL_CALL = ToolCallLanguage()
