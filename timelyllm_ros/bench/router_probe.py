"""Small direct measurements of a vllm-router deployment: which worker a session key reaches,
and what the router adds to a request's latency (router vs the same worker directly,
interleaved so both see the same machine load)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Sequence

import httpx

from timelyllm_ros.bench.vllm_deployment import prefix_counters
from timelyllm_ros.core.engine.openai_wire import SESSION_HEADER


def _complete(client: httpx.Client, url: str, model: str, prompt: str, max_tokens: int,
              session: str) -> tuple[float, float]:
    """One streamed completion; (time to first token, total time) in seconds."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    first = None
    with client.stream("POST", f"{url}/v1/completions", json=body,
                       headers={SESSION_HEADER: session}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line[6:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c.get("text") for c in chunk.get("choices") or ()):
                first = time.perf_counter()
    end = time.perf_counter()
    return (first or end) - start, end - start


def served_model(url: str) -> str:
    return httpx.get(f"{url}/v1/models", timeout=10.0).json()["data"][0]["id"]


def worker_of_session(router_url: str, worker_urls: Sequence[str], session: str) -> int:
    """The worker the router sends `session` to: the one whose prefix-cache counters move
    under a one-token request carrying it."""
    model = served_model(router_url)
    before = [prefix_counters(u) for u in worker_urls]
    with httpx.Client(timeout=60.0) as client:
        _complete(client, router_url, model, f"placement probe {session}", 1, session)
    after = [prefix_counters(u) for u in worker_urls]
    moved = [i for i, (b, a) in enumerate(zip(before, after)) if a[0] > b[0]]
    if len(moved) != 1:
        raise RuntimeError(f"session {session!r}: expected one worker to serve the probe, "
                           f"counters moved on {moved}")
    return moved[0]


@dataclass
class LatencyPairs:
    """Paired measurements: request i went through the router and, right before or after it
    (the order alternates), to the same worker directly."""

    ttft_router: list[float] = field(default_factory=list)
    ttft_direct: list[float] = field(default_factory=list)
    total_router: list[float] = field(default_factory=list)
    total_direct: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        import numpy as np

        out = {"requests": len(self.ttft_router)}
        for name, via, direct in (("ttft", self.ttft_router, self.ttft_direct),
                                  ("total", self.total_router, self.total_direct)):
            added = np.array(via) - np.array(direct)
            out.update({f"{name}_direct_p50_ms": 1e3 * float(np.median(direct)),
                        f"{name}_router_p50_ms": 1e3 * float(np.median(via)),
                        f"{name}_added_p50_ms": 1e3 * float(np.median(added)),
                        f"{name}_added_p90_ms": 1e3 * float(np.percentile(added, 90))})
        return out


def router_overhead(router_url: str, worker_urls: Sequence[str], requests: int = 20,
                    max_tokens: int = 8) -> LatencyPairs:
    """`requests` pairs of small streamed completions (a 20-word prompt, `max_tokens` tokens),
    through the router and directly to the worker the router picks for the session."""
    session = "router-overhead"
    worker = worker_urls[worker_of_session(router_url, worker_urls, session)]
    model = served_model(router_url)
    prompt = "Plan the next step of the drone inspection: take off, fly to the north tower, " \
             "and report what you see"
    pairs = LatencyPairs()
    with httpx.Client(timeout=120.0) as client:
        for url in (router_url, worker):  # both paths warm (connections, prefix cache)
            _complete(client, url, model, prompt, max_tokens, session)
        for i in range(requests):
            order = (router_url, worker) if i % 2 == 0 else (worker, router_url)
            for url in order:
                ttft, total = _complete(client, url, model, prompt, max_tokens, session)
                if url == router_url:
                    pairs.ttft_router.append(ttft)
                    pairs.total_router.append(total)
                else:
                    pairs.ttft_direct.append(ttft)
                    pairs.total_direct.append(total)
    return pairs
