"""KV and slots of vLLM servers, read from their Prometheus `/metrics`.

One server (`engine.url` a `vllm serve`): its own gauges. Behind `vllm-router` the router's
`/metrics` answers for one worker picked per request, so the planner reads every worker's
`/metrics` itself: the worker URLs come from `engine.workers`, or else from the router's worker
list (`GET /workers`: each worker's URL and whether the router's health check passes), fetched
again at every refresh so a worker added to or removed from the router is followed.

What the scheduler gets (`WorkerMetrics.kv_usage`): total blocks = the sum of every worker's
`num_gpu_blocks` last seen (the deployment's size; a worker that is down keeps its place, so a
plan that fits a worker is never rejected while one is restarting); free blocks = the sum over
the workers whose last fetch succeeded and that the router calls healthy, of blocks x (1 -
`kv_cache_usage_perc`). A worker that is down or does not answer counts as full. vLLM updates
these gauges as its engine steps; the planner reads them at most every `metrics_interval_s`, so
a figure is at most that old plus one fetch (a few milliseconds on a LAN).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any, Sequence

from timelyllm_ros.core.engine.base import KvUsage

_SAMPLE = re.compile(r'^(vllm:[a-z_]+)\{([^}]*)\}\s+([0-9.eE+-]+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_metrics(text: str) -> dict[str, Any]:
    """The few vLLM gauges the planner reads, from Prometheus text. A data-parallel server
    reports one series per engine (label `engine`): blocks and running/waiting requests are
    summed over them, and `kv_cache_usage_perc` is the block-weighted mean."""
    per_engine: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m:
            continue
        name, value = m.group(1).split(":", 1)[1], float(m.group(3))
        labels = dict(_LABEL.findall(m.group(2)))
        figures = per_engine.setdefault(labels.get("engine", "0"), {})
        if name == "cache_config_info":
            for key in ("num_gpu_blocks", "block_size"):
                if labels.get(key, "").isdigit():
                    figures[key] = int(labels[key])
        elif name in ("kv_cache_usage_perc", "num_requests_running", "num_requests_waiting"):
            figures[name] = value
    out: dict[str, Any] = {}
    engines = [f for f in per_engine.values() if f]
    if not engines:
        return out
    blocks = [int(f.get("num_gpu_blocks", 0)) for f in engines]
    if all(b > 0 for b in blocks):
        out["num_gpu_blocks"] = sum(blocks)
        if all("kv_cache_usage_perc" in f for f in engines):
            used = sum(b * f["kv_cache_usage_perc"] for b, f in zip(blocks, engines))
            out["kv_cache_usage_perc"] = used / sum(blocks)
    elif any("kv_cache_usage_perc" in f for f in engines):
        usages = [f["kv_cache_usage_perc"] for f in engines if "kv_cache_usage_perc" in f]
        out["kv_cache_usage_perc"] = sum(usages) / len(usages)
    sizes = {f["block_size"] for f in engines if "block_size" in f}
    if sizes:
        out["block_size"] = min(sizes)
    for key in ("num_requests_running", "num_requests_waiting"):
        if any(key in f for f in engines):
            out[key] = sum(f.get(key, 0.0) for f in engines)
    return out


@dataclass(frozen=True)
class RouterWorker:
    url: str
    healthy: bool = True


def parse_worker_list(payload: Any) -> list[RouterWorker]:
    """The workers in a vllm-router answer: `GET /workers` ({"workers": [{"url", "is_healthy",
    ...}]}) or `GET /list_workers` ({"urls": [...]}, no health)."""
    if isinstance(payload, dict) and isinstance(payload.get("workers"), list):
        out = []
        for entry in payload["workers"]:
            if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
                raise ValueError(f"router worker list: entry {entry!r} has no 'url'")
            out.append(RouterWorker(entry["url"].rstrip("/"), bool(entry.get("is_healthy", True))))
        return out
    if isinstance(payload, dict) and isinstance(payload.get("urls"), list):
        return [RouterWorker(str(u).rstrip("/")) for u in payload["urls"]]
    raise ValueError(f"router worker list: expected {{'workers': [...]}} or {{'urls': [...]}}, "
                     f"got {str(payload)[:200]}")


@dataclass
class WorkerFigures:
    """The last figures read from one worker."""

    url: str
    total_blocks: int = 0
    block_size: int = 16
    usage: float = 1.0
    running: int = 0
    waiting: int = 0
    up: bool = False
    error: str = ""
    read_at: float = -1e9


class WorkerMetrics:
    """The KV and slots of the workers behind a router (module docstring).

    workers: fixed worker URLs (`engine.workers`); empty = ask the router's `/workers`.
    max_num_seqs: one worker's `--max-num-seqs` (the API does not expose it).
    """

    def __init__(self, router_url: str, workers: Sequence[str], max_num_seqs: int,
                 interval_s: float, headers: dict[str, str] | None = None):
        self.router_url = router_url.rstrip("/")
        self.fixed = [w.rstrip("/") for w in workers]
        self.max_num_seqs = max_num_seqs
        self.interval_s = interval_s
        self.headers = dict(headers or {})
        self.workers: dict[str, WorkerFigures] = {}
        self.read_at = -1e9

    def due(self, now: float) -> bool:
        return now - self.read_at >= self.interval_s

    async def refresh(self, client: Any) -> None:
        """Read the worker list (unless fixed) and every worker's /metrics, concurrently."""
        self.read_at = time.monotonic()
        if self.fixed:
            listed = [RouterWorker(u) for u in self.fixed]
        else:
            response = await client.get(f"{self.router_url}/workers", headers=self.headers)
            response.raise_for_status()
            listed = parse_worker_list(response.json())
        if not listed:
            raise ValueError(f"router {self.router_url} lists no worker")
        for gone in set(self.workers) - {w.url for w in listed}:
            del self.workers[gone]
        await asyncio.gather(*(self._read(client, w) for w in listed))

    async def _read(self, client: Any, worker: RouterWorker) -> None:
        figures = self.workers.setdefault(worker.url, WorkerFigures(worker.url))
        if not worker.healthy:
            figures.up, figures.error = False, "the router's health check fails"
            return
        try:
            response = await client.get(f"{worker.url}/metrics", headers=self.headers)
            response.raise_for_status()
            parsed = parse_metrics(response.text)
        except Exception as err:  # noqa: BLE001 - a worker that does not answer counts as full
            figures.up, figures.error = False, f"{type(err).__name__}: {err}"
            return
        if "num_gpu_blocks" not in parsed:
            figures.up, figures.error = False, "no vllm:cache_config_info in its /metrics"
            return
        figures.total_blocks = int(parsed["num_gpu_blocks"])
        figures.block_size = int(parsed.get("block_size", figures.block_size))
        figures.usage = float(parsed.get("kv_cache_usage_perc", 0.0))
        figures.running = int(parsed.get("num_requests_running", 0))
        figures.waiting = int(parsed.get("num_requests_waiting", 0))
        figures.up, figures.error, figures.read_at = True, "", time.monotonic()

    def live(self) -> list[WorkerFigures]:
        return [w for w in self.workers.values() if w.up]

    def kv_usage(self) -> KvUsage:
        known = [w for w in self.workers.values() if w.total_blocks > 0]
        if not known:
            raise ValueError(f"router {self.router_url}: no worker has reported its KV cache")
        free = sum(int(w.total_blocks * (1.0 - w.usage)) for w in known if w.up)
        return KvUsage(free_blocks=free, total_blocks=sum(w.total_blocks for w in known),
                       block_size=min(w.block_size for w in known))

    def slots(self) -> int:
        """Every known worker's `max_num_seqs`, summed (the scheduler's slot limit)."""
        return self.max_num_seqs * max(1, len(self.workers))

    def free_slots(self) -> int:
        """Requests the live workers could still start: slots less running and waiting."""
        return sum(max(0, self.max_num_seqs - w.running - w.waiting) for w in self.live())

    def describe(self) -> list[dict[str, Any]]:
        return [{"url": w.url, "up": w.up, "total_blocks": w.total_blocks,
                 "kv_usage": round(w.usage, 4), "running": w.running, "waiting": w.waiting,
                 **({"error": w.error} if w.error else {})} for w in self.workers.values()]
