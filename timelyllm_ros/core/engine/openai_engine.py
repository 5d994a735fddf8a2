"""`engine.kind: openai`: a client of a running vLLM OpenAI-compatible server (`vllm serve`).

The scheduler drives engines synchronously from one thread; this adapter reaches the server
through an asyncio loop with one `httpx.AsyncClient` in a background thread
(openai_connection.py), and bridges the two:
- `add_request` posts a streamed `/v1/completions` request with the prompt as token ids,
  `return_token_ids`, the output grammar as vLLM `structured_outputs`, and the run's service
  class as vLLM `priority` (a server started with `--scheduling-policy priority` orders by it).
  It waits for the response status, so a request the server refuses (bad sampling parameters,
  an invalid grammar) raises `EngineRefused` with the server's message, which ends the task
  with that reason (the scheduler's `_start`);
- each streamed chunk becomes an event on a thread-safe queue; `step()` collects what arrived
  (waiting up to `poll_s` for the first event while streams are open), one `EngineOutput` per
  request. The final usage chunk gives `num_cached_tokens` from
  `usage.prompt_tokens_details.cached_tokens` (the server needs `--enable-prompt-tokens-details`;
  `recomputed_tokens` is then prompt - cached);
- `abort_request` cancels the stream task: closing the connection makes vLLM abort the request.

No sessions: vLLM's server offers no resumable requests over HTTP in 0.32, so a suspension is an
abort and the resume a new request with `prompt + generated` token ids, served by the server's
automatic prefix cache (`capabilities().pause_handling` is False: the scheduler discards).

KV figures come from the server's Prometheus `/metrics` (`vllm:cache_config_info`
num_gpu_blocks / block_size, `vllm:kv_cache_usage_perc`), refreshed at most every
`metrics_interval_s`; `free_slots()` estimates free capacity for the replica router.

Behind vllm-router (`router: true`, docs/router.md): every run carries its task id in the
`X-Session-ID` header (`consistent_hash` keeps a task's resumes on one worker's prefix cache), and
the KV and slots are every worker's, summed (worker_metrics.py). With `api_key_env` the servers'
key goes in `Authorization: Bearer` (request format and key: openai_wire.py; sent by
openai_connection.py).

Faults: a server that does not answer at start raises `EngineUnavailable`; a stream that breaks
(the server died) ends its request with `finish_reason="error"` and `EngineOutput.error` naming
the server and the cause, and marks the engine down (`healthy()` False) until a probe succeeds.
Behind a router a broken stream ends only its run: the router routes the task's next run to a
live worker, so the engine stays up.
"""

from __future__ import annotations

import asyncio
import queue
import time
from dataclasses import dataclass
from typing import Any, Sequence

from timelyllm_ros.core.engine.base import (EngineCapabilities, EngineOutput, EngineRequest,
                                            KvUsage, PauselessEngine, StepTiming, WallClockIdle)
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.openai_connection import ServerConnection
from timelyllm_ros.core.engine.openai_wire import (SESSION_HEADER, EngineRefused,
                                                   EngineUnavailable, OpenAIEngineConfig,
                                                   StreamEvent, completion_body, parse_chunk)
from timelyllm_ros.core.engine.replicas import affinity_key
from timelyllm_ros.core.engine.worker_metrics import WorkerMetrics, parse_metrics

__all__ = ["EngineRefused", "EngineUnavailable", "OpenAIEngine", "OpenAIEngineConfig"]


@dataclass
class _Stream:
    request_id: str
    prompt_len: int
    task: Any = None            # the asyncio task reading the stream
    generated: int = 0
    finish_reason: str | None = None


class OpenAIEngine(WallClockIdle, PauselessEngine):
    """EngineAdapter over one vLLM OpenAI-compatible server (module docstring)."""

    name = "openai"

    def __init__(self, config: OpenAIEngineConfig, profile: EngineProfile | None = None):
        self.config = config
        self.profile = profile
        self.label = config.name or config.url
        self._server = ServerConnection(config, self.label)
        self._workers = (WorkerMetrics(config.url, config.workers, config.max_num_seqs,
                                       config.metrics_interval_s, self._server.headers)
                         if config.router else None)
        self._events: queue.Queue[StreamEvent] = queue.Queue()
        self._streams: dict[str, _Stream] = {}
        self._last_timing = StepTiming()
        self._healthy = True
        self._down_reason = ""
        self._probed_at = -1e9
        self._probe_future: Any = None
        self._metrics: dict[str, Any] = {}
        self._metrics_at = -1e9
        try:
            models = self._server.call(self._server.get_json("/v1/models"))
        except Exception as err:  # noqa: BLE001
            self.shutdown()
            raise EngineUnavailable(self._server.unreachable(err)) from err
        try:
            served = [m["id"] for m in models.get("data", [])]
            if not config.model:
                if not served:
                    raise EngineUnavailable(f"{self.label}: the server serves no model")
                self.model = served[0]
            elif config.model not in served:
                raise EngineUnavailable(f"{self.label}: model {config.model!r} is not served "
                                        f"(served: {served})")
            else:
                self.model = config.model
            entry = next(m for m in models["data"] if m["id"] == self.model)
            self._max_model_len = int(entry.get("max_model_len") or 2048)
            self._refresh_metrics(force=True)
        except EngineUnavailable:
            self.shutdown()
            raise
        except Exception as err:  # noqa: BLE001 - any failure to talk to it means: unavailable
            self.shutdown()
            raise EngineUnavailable(self._server.unreachable(err)) from err

    # -- health and capacity ---------------------------------------------------------------
    def healthy(self) -> bool:
        """Whether the server takes work. A server marked down is probed again in the
        background every `reprobe_s` (never on the caller's thread: a partitioned host would
        block it for the connect timeout), and is up again once a probe answers."""
        if not self._healthy:
            self._probe_in_background()
        return self._healthy

    def down_reason(self) -> str:
        return self._down_reason

    def probe(self) -> bool:
        """Ask the server now (blocking); marks the engine up or down."""
        return self._server.call(self._probe_once(), timeout=self.config.connect_timeout_s + 6)

    def _probe_in_background(self) -> None:
        now = time.monotonic()
        running = self._probe_future is not None and not self._probe_future.done()
        if running or now - self._probed_at < self.config.reprobe_s:
            return
        self._probed_at = now
        self._probe_future = self._server.submit(self._probe_once())

    async def _probe_once(self) -> bool:
        """The server's /health (behind a router, whose /health fails while any worker is down:
        whether a worker answers its /metrics)."""
        try:
            if self._workers is not None:
                await asyncio.wait_for(self._workers.refresh(self._server.client), 5.0)
                if not self._workers.live():
                    raise ConnectionError(f"no worker is up: {self._workers.describe()}")
            else:
                await self._server.get_text("/health")
        except Exception as err:  # noqa: BLE001
            self._mark_down(f"{type(err).__name__}: {err}")
            return False
        self._healthy, self._down_reason = True, ""
        return True

    def _mark_down(self, reason: str) -> None:
        self._healthy = False
        self._down_reason = f"server {self.label} is down: {reason}"

    def _refresh_metrics(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._metrics_at < self.config.metrics_interval_s:
            return
        self._metrics_at = now
        try:
            if self._workers is not None:
                self._server.call(self._workers.refresh(self._server.client), timeout=5.0)
                self._workers.kv_usage()  # raises while no worker has reported
            else:
                self._metrics = parse_metrics(self._server.call(
                    self._server.get_text("/metrics"), timeout=5.0))
        except Exception:  # noqa: BLE001 - keep the last figures; streams report the failure
            if force:
                raise

    def capabilities(self) -> EngineCapabilities:
        seqs = self.config.max_num_seqs if self._workers is None else self._workers.slots()
        return EngineCapabilities(max_num_seqs=seqs, profile=self.profile)

    def kv_usage(self) -> KvUsage:
        self._refresh_metrics()
        if self._workers is not None:
            return self._workers.kv_usage()
        total = int(self._metrics.get("num_gpu_blocks", 1 << 30))
        usage = float(self._metrics.get("kv_cache_usage_perc", 0.0))
        return KvUsage(free_blocks=int(total * (1.0 - usage)), total_blocks=total,
                       block_size=int(self._metrics.get("block_size", 16)))

    def free_slots(self) -> int:
        """Requests this server could still take: its slots less our open streams (behind a
        router: the workers' slots less what their /metrics say runs or waits there)."""
        if self._workers is not None:
            self._refresh_metrics()
            return self._workers.free_slots()
        return self.config.max_num_seqs - len(self._streams)

    def worker_figures(self) -> list[dict[str, Any]]:
        """Behind a router: what each worker reported last (empty otherwise)."""
        return [] if self._workers is None else self._workers.describe()

    # -- text ------------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic()

    def tokenize(self, text: str) -> list[int]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        return list(self._server.call(self._post_json("/tokenize", body))["tokens"])

    def decode(self, token_ids: Sequence[int]) -> str:
        body = {"model": self.model, "tokens": list(token_ids)}
        return str(self._server.call(self._post_json("/detokenize", body))["prompt"])

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        return list(self._server.call(self._post_json("/tokenize", body))["tokens"])

    def _direct_targets(self, path: str) -> list[str]:
        """Behind a router, `path` on each worker that reported last, tried directly when the
        router fails a call: a worker that just died stays in the router's ring until its
        health check drops it, and the router answers with that worker's failure meanwhile.
        Empty for a plain server."""
        if self._workers is None:
            return []
        return [f"{worker.url}{path}" for worker in self._workers.live()]

    async def _post_json(self, path: str, body: dict) -> Any:
        """A stateless call (tokenize, detokenize); every worker answers it alike, so behind a
        router a failed call is tried again on the workers directly (`_direct_targets`)."""
        try:
            return await self._server.post_json(path, body)
        except Exception as err:  # noqa: BLE001 - re-raised below when no worker answers
            failure = err
        for target in self._direct_targets(path):
            try:
                return await self._server.post_json(target, body)
            except Exception:  # noqa: BLE001 - that worker is down too: try the next
                continue
        raise failure

    def max_model_len(self) -> int:
        return self._max_model_len

    def max_num_batched_tokens(self) -> int:
        return self.config.max_num_batched_tokens

    # -- requests --------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        if not self.healthy():
            raise EngineRefused(self._down_reason)
        rid = request.request_id
        stream = _Stream(rid, len(request.prompt_token_ids))
        opened: asyncio.Future | None = None

        async def start() -> None:
            nonlocal opened
            opened = self._server.loop.create_future()
            stream.task = self._server.loop.create_task(self._run_stream(stream, request, opened))
            await opened

        self._streams[rid] = stream
        try:
            self._server.call(start(), timeout=self.config.connect_timeout_s
                              + self.config.read_timeout_s)
        except Exception:
            self._streams.pop(rid, None)
            if stream.task is not None:
                self._server.cancel_soon(stream.task)
            raise

    async def _run_stream(self, stream: _Stream, request: EngineRequest,
                          opened: asyncio.Future) -> None:
        rid = stream.request_id

        def on_data(chunk: dict) -> None:
            self._events.put(parse_chunk(rid, chunk, self.label))

        try:
            headers = {SESSION_HEADER: affinity_key(rid)}
            body = completion_body(self.model, self.config, request)
            outcome = await self._server.stream_events("/v1/completions", body, headers, opened,
                                                       on_data)
            if isinstance(outcome, tuple) and outcome[0] >= 500:
                # The router could not reach the worker its hash picked: the run goes to one
                # that answers, where the router itself sends it once the dead one is dropped;
                # only the prefix cache is lost, as on a failover.
                for target in self._direct_targets("/v1/completions"):
                    try:
                        outcome = await self._server.stream_events(target, body, headers,
                                                                   opened, on_data)
                    except Exception:  # noqa: BLE001 - that worker is down too: the next
                        if opened.done():
                            raise  # it broke off mid-stream: handled below
                        continue
                    if not isinstance(outcome, tuple):
                        break
            if isinstance(outcome, tuple):
                opened.set_exception(EngineRefused(
                    f"server {self.label} refused the request: {outcome[1]}"))
                return
            if not outcome:
                # A server always ends a stream with [DONE]; a proxy in between (vllm-router)
                # closes it cleanly when the worker behind it dies.
                raise ConnectionError("the stream ended before [DONE]")
            self._events.put(StreamEvent(rid, finish_reason="end"))
        except asyncio.CancelledError:
            if not opened.done():
                opened.cancel()
            raise
        except Exception as err:  # noqa: BLE001 - the connection broke: the server died
            reason = f"{type(err).__name__}: {err}"
            if not opened.done():
                self._mark_down(reason)
                opened.set_exception(EngineRefused(self._down_reason))
                return
            if self._workers is not None:
                # The router answered; the worker behind it died. The router routes the
                # task's next run elsewhere, so the engine stays up.
                self._events.put(StreamEvent(rid, finish_reason="error", error=(
                    f"router {self.label}: the worker serving this run broke off: {reason}")))
                return
            self._mark_down(reason)
            self._events.put(StreamEvent(rid, finish_reason="error", error=self._down_reason))

    def abort_request(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None and stream.task is not None:
            # Closing the connection is how a client aborts a vLLM request.
            self._server.cancel_soon(stream.task)

    def step(self) -> list[EngineOutput]:
        start = time.perf_counter()
        batch = len(self._streams)
        events: list[StreamEvent] = []
        if self._streams:
            try:
                events.append(self._events.get(timeout=self.config.poll_s))
            except queue.Empty:
                pass
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                break
        outputs: dict[str, EngineOutput] = {}
        for ev in events:
            stream = self._streams.get(ev.request_id)
            if stream is None:
                continue  # aborted meanwhile
            out = outputs.get(ev.request_id)
            if out is None:
                out = outputs[ev.request_id] = EngineOutput(ev.request_id, [], "")
            out.new_token_ids.extend(ev.token_ids)
            out.new_text += ev.text
            stream.generated += len(ev.token_ids)
            if ev.cached is not None:
                out.num_cached_tokens = ev.cached
                out.recomputed_tokens = max(0, stream.prompt_len - ev.cached)
            if ev.error is not None:
                out.error = ev.error
            if ev.finish_reason is not None and ev.finish_reason != "end":
                out.finish_reason = ev.finish_reason
            if ev.finish_reason == "end" or ev.error is not None:
                # The stream is over (the usage chunk came before its end).
                out.finished = True
                out.finish_reason = out.finish_reason or stream.finish_reason or "stop"
                self._streams.pop(ev.request_id, None)
            elif ev.finish_reason is not None:
                stream.finish_reason = ev.finish_reason
        self._last_timing = StepTiming(duration_s=time.perf_counter() - start, batch_size=batch,
                                       extra={"tokens": sum(len(o.new_token_ids)
                                                            for o in outputs.values())})
        return list(outputs.values())

    def has_unfinished_requests(self) -> bool:
        return bool(self._streams)

    def num_running(self) -> int:
        return len(self._streams)

    def shutdown(self) -> None:
        for rid in list(self._streams):
            self.abort_request(rid)
        self._server.close()

    def describe(self) -> dict[str, Any]:
        out = {"engine": self.name, "url": self.config.url, "model": self.model}
        if self._workers is not None:
            out["workers"] = self.worker_figures()
        return out
