"""The generated text of one plan, kept aligned with its token ids.

Segment boundaries are found in text, but a generation is resumed from token ids. A boundary can
fall inside a token (e.g. a token `;m` ends one statement and starts the next), so suspending keeps
only the tokens that end at or before the boundary and remembers the characters still owed up to
it. The resumed request is then constrained to produce exactly those characters first, which keeps
the continuation a valid program of the skill language.

Invariant kept by `append` and `cut_for_resume`: for every i, `text[:token_ends[i]]` is exactly
the text of `token_ids[:i + 1]`, as far as the engine's outputs tell. An engine step may deliver
several tokens with one piece of text (speculative decoding, multi-step scheduling), or deliver
text late (an incremental detokenizer holds back an incomplete UTF-8 sequence). In both cases the
character offsets inside the step are unknown, so every token of the step gets the step's end
offset, and text that arrives without a token is credited to the tokens before it: a cut then only
ever happens at a point where tokens and text are known to agree, and a kept token always keeps
its text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class GeneratedText:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    # Character offset in `text` after each token (same length as token_ids, non-decreasing,
    # never beyond len(text)).
    token_ends: list[int] = field(default_factory=list)
    # Everything before this character offset has been cut into segments already.
    consumed: int = 0
    statements_done: int = 0

    def append(self, new_ids: Sequence[int], new_text: str) -> None:
        if not new_ids and not new_text:
            return
        self.text += new_text
        end = len(self.text)
        if new_text and (not new_ids or self._last_token_empty()):
            # Text that arrives with no token of its own, or after tokens that showed none, may
            # belong to those earlier tokens (a detokenizer held it back): credit it to them.
            self._credit_late_text(end)
        # Offsets inside a multi-token step are unknown: no cut may fall between its tokens.
        self.token_ends.extend([end] * len(new_ids))
        self.token_ids.extend(new_ids)

    def _end_before(self, i: int) -> int:
        return self.token_ends[i - 1] if i > 0 else 0

    def _last_token_empty(self) -> bool:
        n = len(self.token_ends)
        return n > 0 and self.token_ends[-1] == self._end_before(n - 1)

    def _credit_late_text(self, end: int) -> None:
        ends = self.token_ends
        i = len(ends) - 1
        while i >= 0 and ends[i] == self._end_before(i):
            i -= 1  # tokens that showed no text
        # ...and the last token that did show text, which may have shown only part of it.
        for j in range(max(i, 0), len(ends)):
            ends[j] = end

    @property
    def pending_text(self) -> str:
        return self.text[self.consumed:]

    def cut_for_resume(self) -> str:
        """Drop tokens that run past `consumed` and return the characters owed up to it.

        Afterwards `text` is the text of the kept tokens, and `text + owed == old_text[:consumed]`
        (when `consumed <= len(old_text)`).
        """
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


def resume_regex(owed_text: str, program_regex: str | None, *, may_end: bool = False) -> str | None:
    """The structured-output constraint for a (resumed) generation.

    `owed_text` must come first, literally. `may_end`: the plan generated so far is already a
    complete program (e.g. MiniSpec `tk;mf,100;`), so after the owed text the generation may stop
    instead of having to produce at least one more statement.
    """
    if program_regex is None:
        return None
    tail = "(?:" + program_regex + ")" + ("?" if may_end else "")
    if not owed_text:
        return tail if may_end else program_regex
    return re.escape(owed_text) + tail
