"""The generated text of one plan, kept aligned with its token ids.

Segment boundaries are found in text, but a generation is resumed from token ids. A boundary can
fall inside a token (e.g. a token `;m` ends one statement and starts the next), so suspending keeps
only the tokens that end at or before the boundary and remembers the characters still owed up to
it. The resumed request is then constrained to produce exactly those characters first, which keeps
the continuation a valid program of the skill language.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class GeneratedText:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    # Character offset in `text` after each token (same length as token_ids).
    token_ends: list[int] = field(default_factory=list)
    # Everything before this character offset has been cut into segments already.
    consumed: int = 0
    statements_done: int = 0

    def append(self, new_ids: Sequence[int], new_text: str) -> None:
        if not new_ids and not new_text:
            return
        self.text += new_text
        # Incremental detokenizers can attribute text to the last of several tokens of a step;
        # giving earlier tokens the previous end keeps cuts conservative (never past the text).
        prev_end = self.token_ends[-1] if self.token_ends else 0
        for _ in new_ids[:-1]:
            self.token_ends.append(prev_end)
        if new_ids:
            self.token_ends.append(len(self.text))
        self.token_ids.extend(new_ids)

    @property
    def pending_text(self) -> str:
        return self.text[self.consumed:]

    def cut_for_resume(self) -> str:
        """Drop tokens that run past `consumed` and return the characters owed up to it."""
        keep = len(self.token_ends)
        while keep > 0 and self.token_ends[keep - 1] > self.consumed:
            keep -= 1
        kept_end = self.token_ends[keep - 1] if keep else 0
        owed = self.text[kept_end:self.consumed]
        del self.token_ids[keep:]
        del self.token_ends[keep:]
        self.text = self.text[:kept_end]
        # `consumed` stays put: the owed characters come back when the generation resumes, and
        # they belong to a segment that is already published.
        return owed


def resume_regex(owed_text: str, program_regex: str | None) -> str | None:
    """The structured-output constraint for a resumed generation."""
    if program_regex is None:
        return None
    if not owed_text:
        return program_regex
    return re.escape(owed_text) + "(?:" + program_regex + ")"
