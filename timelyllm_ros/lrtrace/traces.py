"""Task traces of LRTrace (`lrtrace/traces.yaml`): what each robot task asks and plans.

A trace is model-independent: it fixes the instruction, the robot category, the TUF level and a
representative plan. Workloads (workload.py) draw tasks from traces; the simulated engine emits
a trace's plan as its generated text. A task may add its own context to the trace's instruction
(`context_text`, drawn by `workload.compose` for a workload with `context_tokens`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml

# Robot categories; a category is also the prefix of robot ids (`drone_07`). `batch`: a client
# of best-effort batch work (reports, summaries) whose output nobody waits on.
CATEGORIES = ("drone", "arm", "chat", "agent", "batch")

_REQUIRED = ("id", "instruction", "category", "tuf_level", "skill_set", "plan")
_OPTIONAL = ("notes", "max_plan_tokens")


class TraceError(ValueError):
    """An invalid trace file; the message names the file, the trace id and the field."""


@dataclass(frozen=True)
class Trace:
    trace_id: int
    instruction: str
    category: str
    tuf_level: str
    skill_set: str
    plan: str
    notes: str = ""
    # The task's own output budget (see TaskSpec.max_plan_tokens); None = the skill set's.
    max_plan_tokens: int | None = None


def lrtrace_dir() -> Path:
    """Folder holding traces.yaml and workloads/: $TIMELYLLM_LRTRACE_DIR, else the repository's."""
    override = os.environ.get("TIMELYLLM_LRTRACE_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "lrtrace"


def read_yaml(path: Path, error: type[Exception]) -> Any:
    """The YAML document at `path`, or `error` naming the file when it cannot be read or
    parsed (every LRTrace file reader's first step)."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: invalid YAML: {exc}") from None


def default_traces_path() -> Path:
    return lrtrace_dir() / "traces.yaml"


def load_traces(path: str | Path | None = None) -> dict[int, Trace]:
    """Load and validate a traces file; returns traces keyed by id, in id order."""
    path = Path(path) if path is not None else default_traces_path()
    data = read_yaml(path, TraceError)
    return traces_from_data(data, origin=str(path))


def traces_from_data(data: Any, *, origin: str = "<traces>") -> dict[int, Trace]:
    if not isinstance(data, Mapping) or not isinstance(data.get("traces"), list):
        raise TraceError(f"{origin}: expected a mapping with a `traces` list")
    unknown_top = set(data) - {"schema", "traces"}
    if unknown_top:
        raise TraceError(f"{origin}: unknown top-level key {sorted(unknown_top)[0]!r}")
    traces: dict[int, Trace] = {}
    for index, entry in enumerate(data["traces"]):
        trace = _parse_trace(entry, index, origin)
        if trace.trace_id in traces:
            raise TraceError(f"{origin}: trace {trace.trace_id}: id: duplicate trace id")
        traces[trace.trace_id] = trace
    if not traces:
        raise TraceError(f"{origin}: traces: no traces defined")
    return dict(sorted(traces.items()))


def _parse_trace(entry: Any, index: int, origin: str) -> Trace:
    if not isinstance(entry, Mapping):
        raise TraceError(f"{origin}: traces[{index}]: expected a mapping")
    tid = entry.get("id")
    if isinstance(tid, bool) or not isinstance(tid, int) or tid < 1:
        raise TraceError(f"{origin}: traces[{index}]: id: must be a positive integer, got {tid!r}")
    where = f"{origin}: trace {tid}"
    for key in entry:
        if key not in _REQUIRED and key not in _OPTIONAL:
            raise TraceError(f"{where}: {key}: unknown field")
    for key in _REQUIRED[1:]:
        if key not in entry:
            raise TraceError(f"{where}: {key}: missing field")
        value = entry[key]
        if not isinstance(value, str) or not value.strip():
            raise TraceError(f"{where}: {key}: must be a non-empty string, got {value!r}")
    notes = entry.get("notes", "")
    if not isinstance(notes, str):
        raise TraceError(f"{where}: notes: must be a string")
    budget = entry.get("max_plan_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                               or budget < 1):
        raise TraceError(f"{where}: max_plan_tokens: must be an integer >= 1, got {budget!r}")
    if entry["category"] not in CATEGORIES:
        raise TraceError(
            f"{where}: category: {entry['category']!r} is not one of {', '.join(CATEGORIES)}"
        )
    return Trace(
        trace_id=tid,
        instruction=entry["instruction"].strip(),
        category=entry["category"],
        tuf_level=entry["tuf_level"].strip(),
        skill_set=entry["skill_set"].strip(),
        plan=entry["plan"],
        notes=notes.strip(),
        max_plan_tokens=budget,
    )


# A context is a label, the task number in three words, then words drawn from the workload's
# seed. Every piece is one token on the simulated engine's tokenizer (`PieceTokenizer`: a word
# with its leading space is one token), so a context of n tokens makes the prompt n tokens longer.
CONTEXT_LABEL = "\nContext:"  # 3 tokens: newline, word, colon
CONTEXT_WORDS = (
    "red", "blue", "green", "white", "black", "grey", "small", "large", "left", "right", "near",
    "far", "above", "below", "behind", "front", "table", "chair", "door", "window", "shelf",
    "sofa", "bed", "desk", "lamp", "cup", "bottle", "book", "box", "bag", "plant", "wall",
    "floor", "person", "child", "dog", "cat", "toy", "phone", "keys", "wallet", "tool", "paper",
    "pen", "tray", "bin", "apple", "carrot", "open", "closed", "moving", "still", "bright",
    "dark", "battery", "low", "high", "route", "clear", "blocked", "seen", "lost", "north",
    "south")
CONTEXT_MIN_TOKENS = 6  # label (3) + task number (3)
CONTEXT_MAX_TOKENS = 1_000_000
CONTEXT_SEED = 0x636F6E74  # the context draws' own stream of the workload's seed ("cont")


def context_text(task_id: int, tokens: int, rng: np.random.Generator) -> str:
    """`tokens` tokens of context for task `task_id`: distinct per task (its number is written in
    the first words, least significant first, so consecutive tasks differ at the first word),
    the rest words drawn from `rng`."""
    if tokens < CONTEXT_MIN_TOKENS:
        raise ValueError(f"a context has at least {CONTEXT_MIN_TOKENS} tokens, got {tokens}")
    v = len(CONTEXT_WORDS)
    words = [(task_id // v ** i) % v for i in range(3)]
    words += rng.integers(0, v, size=tokens - CONTEXT_MIN_TOKENS).tolist()
    return CONTEXT_LABEL + "".join(" " + CONTEXT_WORDS[w] for w in words)
