"""The online iteration level of seed 003: the Lagrangian gate choosing a prefill stage or one
more decode round. Our `hybrid` policy puts it in front of every admission pass.
"""

from __future__ import annotations

import math
from typing import Literal, Sequence

from timelyllm_ros.papers.hybrid.time_model import TimeModel


class PrefillDecodeGate:
    """Lagrangian choice between a prefill stage and one more decode round (paper §IV-C).

    C_p: the time of one prefill stage over all waiting prompts. C_d: decode time accumulated
    since the last prefill - the price already paid by waiting prompts. While C_p >= C_d, one more
    decode round is cheaper than stopping every decoding sequence for a prefill; once the waiting
    has cost more than the prefill would, prefill (and C_d restarts from zero).

    Call `decide` after every decode round (after `note_decode`), and `note_prefill` after a
    prefill stage. Times in ms. The paper charges only the per-sequence part of a round
    (`note_decode_round` does that); passing measured wall time to `note_decode` also charges
    the fixed 29 ms and makes the gate prefill sooner.
    """

    def __init__(self, tm: TimeModel = TimeModel()):
        self.tm = tm
        self.c_d = 0.0

    def prefill_cost(self, waiting_prompt_tokens: Sequence[float]) -> float:
        return self.tm.prefill_ms(float(sum(waiting_prompt_tokens)))

    def decide(self, waiting_prompt_tokens: Sequence[float], decoding: int) -> Literal["prefill", "decode"]:
        if len(waiting_prompt_tokens) == 0:
            return "decode"        # also with nothing decoding: the caller then simply idles
        if decoding <= 0:
            return "prefill"       # no decode round to weigh against; prefilling wastes nothing
        return "decode" if self.prefill_cost(waiting_prompt_tokens) >= self.c_d else "prefill"

    def note_decode(self, duration_ms: float) -> None:
        if not (math.isfinite(duration_ms) and duration_ms >= 0):
            raise ValueError("decode duration must be finite and >= 0")
        self.c_d += float(duration_ms)

    def note_decode_round(self, decoding: int) -> None:
        self.note_decode(self.tm.decode_marginal_ms(decoding))

    def note_prefill(self) -> None:
        self.c_d = 0.0
