"""The simulated engine's tokenizer: deterministic and lossless, without a model's vocabulary."""

from __future__ import annotations

import re
from typing import Sequence


class PieceTokenizer:
    """Deterministic, lossless stand-in for a BPE tokenizer.

    Text is cut into pieces by one regular expression: a run of letters with at most one leading
    space (like BPE's " word" tokens), up to three digits (Llama 3 splits numbers that way), a run
    of whitespace, or any other single character. Every character falls into exactly one piece, so
    `decode(tokenize(s)) == s`. Ids are assigned in order of first appearance from a vocabulary
    grown on demand, hence stable for the lifetime of one tokenizer.
    """

    _PIECE = re.compile(r" ?[^\W\d_]+|\d{1,3}|\s+|.", re.DOTALL)
    # Texts whose ids are remembered. A replay tokenizes the same few prompts (a skill set's
    # instructions, thousands of characters each) and plan remainders for every task and every
    # resumption; the ids of a text never change once its pieces have ids.
    MEMO_TEXTS = 4096

    def __init__(self) -> None:
        self._id_of: dict[str, int] = {}
        self._pieces: list[str] = []
        self._memo: dict[str, tuple[int, ...]] = {}

    def pieces(self, text: str) -> list[str]:
        return self._PIECE.findall(text)

    def tokenize(self, text: str) -> list[int]:
        known = self._memo.get(text)
        if known is not None:
            return list(known)
        ids = self._tokenize(text)
        if len(self._memo) >= self.MEMO_TEXTS:
            del self._memo[next(iter(self._memo))]  # the oldest
        self._memo[text] = tuple(ids)
        return ids

    def _tokenize(self, text: str) -> list[int]:
        ids = []
        for piece in self._PIECE.findall(text):
            token = self._id_of.get(piece)
            if token is None:
                token = len(self._pieces)
                self._id_of[piece] = token
                self._pieces.append(piece)
            ids.append(token)
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        pieces = self._pieces
        out = []
        for token in token_ids:
            if not 0 <= token < len(pieces):
                raise ValueError(f"unknown token id {token}")
            out.append(pieces[token])
        return "".join(out)

    def __len__(self) -> int:
        return len(self._pieces)
