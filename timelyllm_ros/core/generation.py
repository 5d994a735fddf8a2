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
offset; text that arrives late is credited to the tokens that showed none and to the step before
them; and tokens whose text has not shown yet are never kept by a cut. A cut then only falls where
tokens and text are known to agree, and a kept token keeps its text. (Not detectable: a token that
shows part of its text while the rest arrives with the next token's. Only multi-byte characters
do that, and the skill languages are ASCII.)
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
    # Trailing tokens whose text has not shown yet (the detokenizer holds it back).
    silent_tokens: int = 0

    def append(self, new_ids: Sequence[int], new_text: str) -> None:
        if not new_ids and not new_text:
            return
        self.text += new_text
        end = len(self.text)
        if new_text and (self.silent_tokens or not new_ids):
            # Text that arrives with no token of its own, or after tokens that showed none,
            # may belong to earlier tokens (a detokenizer held it back): credit it to them.
            start = self._uncertain_from()
            for j in range(start, len(self.token_ends)):
                self.token_ends[j] = end
            self.silent_tokens = 0
        # Offsets inside a multi-token step are unknown: no cut may fall between its tokens.
        self.token_ends.extend([end] * len(new_ids))
        self.token_ids.extend(new_ids)
        if new_ids and not new_text:
            self.silent_tokens += len(new_ids)

    def _uncertain_from(self) -> int:
        """Index of the first token whose text may not all have shown: the trailing tokens that
        showed none, and the step before them (it may have shown only part of its text)."""
        ends = self.token_ends
        i = len(ends) - self.silent_tokens
        if i <= 0:
            return 0
        last = ends[i - 1]
        while i > 0 and ends[i - 1] == last:
            i -= 1
        return i

    @property
    def pending_text(self) -> str:
        return self.text[self.consumed:]

    def cut_for_resume(self, keep_pending: bool = False) -> str:
        """Drop tokens that run past `consumed` and return the characters owed up to it.

        Afterwards `text` is the text of the kept tokens, and `text + owed == old_text[:consumed]`
        (when `consumed <= len(old_text)`).

        `keep_pending`: keep the tokens of the statement in progress too (a generation stopped
        mid-statement whose continuation needs no grammar state); only tokens whose text has not
        shown are dropped, and nothing is owed unless that reaches back before `consumed`.
        """
        # Tokens whose text has not (all) shown cannot be kept: their text is unknown.
        keep = self._uncertain_from() if self.silent_tokens else len(self.token_ends)
        limit = len(self.text) if keep_pending else self.consumed
        while keep > 0 and self.token_ends[keep - 1] > limit:
            keep -= 1
        kept_end = self.token_ends[keep - 1] if keep else 0
        owed = self.text[kept_end:self.consumed]
        del self.token_ids[keep:]
        del self.token_ends[keep:]
        self.text = self.text[:kept_end]
        self.silent_tokens = 0
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
