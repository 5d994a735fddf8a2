"""Chat "skill language": free text cut into sentences or paragraphs, each spoken as one `say`."""

from __future__ import annotations

import re

from timelyllm_ros.core.skills.base import ParsedSegment, SkillCall

_MODES = ("sentence", "paragraph")
_TERMINATORS = ".!?"
# Closing quotes/brackets stay with the sentence they end: `He said "go."` then a space.
_CLOSERS = "\"')]"
# A period after these is not the end of a sentence.
_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "st", "vs", "e.g", "i.e"})
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")
_WORD_RE = re.compile(r"\w")


def _has_words(text: str) -> bool:
    return _WORD_RE.search(text) is not None


def reading_time_s(text: str, words_per_minute: float = 300.0) -> float:
    """Seconds a person needs to read (or hear) `text`; chat's stand-in for execution time."""
    if words_per_minute <= 0:
        raise ValueError(f"words_per_minute must be positive, got {words_per_minute}")
    return len(text.split()) * 60.0 / words_per_minute


class ChatLanguage:
    def __init__(self, mode: str = "sentence"):
        if mode not in _MODES:
            raise ValueError(f"unknown chat mode {mode!r}; expected one of {', '.join(_MODES)}")
        self.mode = mode
        self.name = "chat" if mode == "sentence" else "chat-paragraph"

    def next_boundary(self, text: str, start: int) -> int | None:
        if self.mode == "paragraph":
            return self._paragraph_boundary(text, start)
        return self._sentence_boundary(text, start)

    def _sentence_boundary(self, text: str, start: int) -> int | None:
        n = len(text)
        i = start
        while i < n:
            if text[i] not in _TERMINATORS:
                i += 1
                continue
            j = i
            while j < n and text[j] in _TERMINATORS:
                j += 1
            while j < n and text[j] in _CLOSERS:
                j += 1
            if j == n:
                return None
            # The whitespace that proves the sentence is over is part of it.
            if text[j].isspace() and self._ends_sentence(text, start, i):
                return j + 1
            i = j
        return None

    @staticmethod
    def _ends_sentence(text: str, start: int, terminator: int) -> bool:
        if not _has_words(text[start:terminator]):
            return False
        if text[terminator] != ".":
            return True
        word = text[start:terminator].rsplit(None, 1)[-1].lower().lstrip("\"'([")
        return word not in _ABBREVIATIONS

    @staticmethod
    def _paragraph_boundary(text: str, start: int) -> int | None:
        pos = start
        while (m := _BLANK_LINE.search(text, pos)) is not None:
            if _has_words(text[start : m.start()]):
                return m.end()
            pos = m.end()
        return None

    def final_segment_end(self, text: str, start: int) -> int | None:
        boundary = self.next_boundary(text, start)
        if boundary is not None:
            return boundary
        return len(text) if _has_words(text[start:]) else None

    def parse(self, segment_text: str) -> ParsedSegment:
        spoken = segment_text.strip()
        calls = (SkillCall("say", (spoken,), spoken),) if spoken else ()
        return ParsedSegment(segment_text, calls)

    def output_regex(self, max_statements: int) -> str | None:
        return None
