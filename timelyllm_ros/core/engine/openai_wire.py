"""What `engine.kind: openai` sends to and reads from a vLLM OpenAI-compatible server (or a
vllm-router in front of several): its settings, the completion request body and headers, the
API key, the streamed chunks and the servers' error texts. openai_engine.py drives it.

Checked against vLLM 0.32's server: `--api-key` (or VLLM_API_KEY) guards every path under /v1
(also /v2, /inference, /cohere) and wants `Authorization: Bearer <key>`; /health, /metrics,
/tokenize and /detokenize stay open (vllm/entrypoints/serve/middleware/authenticate.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import Any

from timelyllm_ros.core.engine.base import EngineRequest, engine_priority


class EngineUnavailable(RuntimeError):
    """The server cannot be reached (down, wrong URL, not a vLLM server)."""


class EngineRefused(ValueError):
    """The server refused a request (its message is the reason)."""


def api_key_from_env(variable: str) -> str | None:
    """The API key of `vllm serve --api-key`, from the environment variable named by
    `engine.api_key_env` (empty = no key). The key is never a parameter value: parameters show
    up in logs and in `ros2 param dump`."""
    if not variable:
        return None
    key = os.environ.get(variable, "")
    if not key:
        raise ValueError(f"engine.api_key_env: names the environment variable {variable!r}, "
                         "which is not set or empty in the planner's environment (it must "
                         "hold the servers' --api-key)")
    return key


@dataclass
class OpenAIEngineConfig:
    """One vLLM server. `model`: the served model name (empty = the server's only model)."""

    url: str = "http://127.0.0.1:8000"
    model: str = ""
    temperature: float = 0.0
    repetition_penalty: float = 1.15
    seed: int = 0
    ignore_eos: bool = False
    # The scheduler's view of the server's limits (the API does not expose them).
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    connect_timeout_s: float = 5.0
    # A stream that shows nothing for this long is considered broken.
    read_timeout_s: float = 120.0
    poll_s: float = 0.02
    metrics_interval_s: float = 0.5
    # A server marked down is asked again (/health, in the background) at most this often, so
    # a restarted server gets work again within about this long; one GET per interval.
    reprobe_s: float = 2.0
    name: str = ""
    # `url` is a vllm-router: KV and slots are read from every worker's /metrics (the workers
    # in `workers`, else the router's `GET /workers`), summed (worker_metrics.py).
    router: bool = False
    workers: tuple[str, ...] = ()
    # The environment variable holding the servers' API key (sent as `Authorization: Bearer`);
    # empty = none.
    api_key_env: str = ""

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> "OpenAIEngineConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"engine openai: unknown parameter(s) {unknown}; known: "
                             f"{sorted(known)}")
        values = dict(values)
        workers = values.get("workers", ())
        if isinstance(workers, str):
            workers = [w.strip() for w in workers.split(",") if w.strip()]
        values["workers"] = tuple(workers)
        if values["workers"] and not values.get("router", False):
            raise ValueError("engine.workers: only read behind a router (engine.router true)")
        return cls(**values)


# The header vllm-router's consistent_hash policy keys on: every run of a task carries the task
# id, so each resume reaches the worker whose prefix cache holds the plan so far.
SESSION_HEADER = "X-Session-ID"


@dataclass
class StreamEvent:
    """What one streamed chunk (or the stream's end) says about a run."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    cached: int | None = None
    error: str | None = None


def completion_body(model: str, config: OpenAIEngineConfig,
                    request: EngineRequest) -> dict[str, Any]:
    """The streamed `/v1/completions` request of one run (prompt as token ids)."""
    body: dict[str, Any] = {
        "model": model, "prompt": list(request.prompt_token_ids),
        "max_tokens": request.max_tokens, "temperature": config.temperature,
        "repetition_penalty": config.repetition_penalty, "seed": config.seed,
        "stream": True, "return_token_ids": True, "ignore_eos": config.ignore_eos,
        "priority": engine_priority(request.service_class), "request_id": request.request_id,
        "stream_options": {"include_usage": True},
    }
    if request.output_regex:
        body["structured_outputs"] = {"regex": request.output_regex}
    return body


def parse_chunk(rid: str, chunk: dict, label: str) -> StreamEvent:
    """One `data:` chunk of a completion stream: tokens, text, finish reason, and in the usage
    chunk the prompt tokens served from the prefix cache."""
    if "error" in chunk:
        return StreamEvent(rid, finish_reason="error",
                           error=f"server {label}: {error_text(json.dumps(chunk))}")
    event = StreamEvent(rid)
    for choice in chunk.get("choices") or ():
        event.token_ids.extend(choice.get("token_ids") or ())
        event.text += choice.get("text") or ""
        if choice.get("finish_reason"):
            event.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        event.cached = int(details["cached_tokens"])
    return event


def error_text(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:500]
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        return str(err.get("message") or err)[:500]
    return str(err)[:500]
