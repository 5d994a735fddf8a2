"""How `engine.kind: openai` reaches one vLLM server (or router) from the scheduler's thread.

The scheduler calls engines synchronously from one thread, while a server is best read with
asyncio (many streams open at once). `ServerConnection` keeps an asyncio loop running in a
background thread with one `httpx.AsyncClient` on it: `call` runs a coroutine there and waits for
its result, `submit` runs one without waiting; the coroutines it offers are the server calls the
engine makes (GET JSON or text, POST JSON, a streamed POST read as server-sent events). Every
call carries the servers' API key (`engine.api_key_env`) as `Authorization: Bearer`, and
`unreachable` says why the server could not be reached, a missing or wrong key included.

Separate from openai_engine.py, which is what an engine over such a server means (its runs as
streams, whether it is up, its KV and slots): this is only the plumbing, and knows nothing of
runs, health or routers.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, Callable

from timelyllm_ros.core.engine.openai_wire import (EngineRefused, OpenAIEngineConfig,
                                                   api_key_from_env, error_text)


class ServerConnection:
    """An asyncio loop in a daemon thread and one httpx client on it, for one server.

    label: names the server in errors and in the thread's name. `headers` (the API key) go
    with every call; others that call the server (worker_metrics.py) send them too."""

    def __init__(self, config: OpenAIEngineConfig, label: str):
        import httpx

        self.config = config
        self.label = label
        api_key = api_key_from_env(config.api_key_env)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client: Any = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name=f"openai-engine {label}")
        self._thread.start()
        timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
        self.client = self.call(self._make_client(httpx, timeout))

    async def _make_client(self, httpx, timeout):
        return httpx.AsyncClient(base_url=self.config.url.rstrip("/"), timeout=timeout,
                                 headers=self.headers)

    def unreachable(self, err: Exception) -> str:
        """Why a call to the server failed, for `EngineUnavailable`."""
        import httpx

        if isinstance(err, httpx.HTTPStatusError) and err.response.status_code == 401:
            if self.headers:
                return (f"engine openai: server {self.label} refused the API key from "
                        f"${self.config.api_key_env} (401 Unauthorized)")
            return (f"engine openai: server {self.label} requires an API key (401 "
                    "Unauthorized): set engine.api_key_env to the name of an environment "
                    "variable that holds it")
        return (f"engine openai: server {self.label} is not reachable: "
                f"{type(err).__name__}: {err}")

    def call(self, coro, timeout: float | None = None):
        """Run `coro` on the loop and wait for its result (by default the connect plus the read
        timeout)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout if timeout is not None else
                             self.config.connect_timeout_s + self.config.read_timeout_s)

    def submit(self, coro):
        """Run `coro` on the loop without waiting: its concurrent future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def cancel_soon(self, task: asyncio.Task) -> None:
        """Cancel a task of the loop from another thread."""
        self.loop.call_soon_threadsafe(task.cancel)

    # -- server calls (coroutines, run on the loop) ----------------------------------------
    async def get_json(self, path: str) -> Any:
        response = await self.client.get(path)
        response.raise_for_status()
        return response.json()

    async def get_text(self, path: str) -> str:
        response = await self.client.get(path)
        response.raise_for_status()
        return response.text

    async def post_json(self, path: str, body: dict) -> Any:
        """POST `body` to `path` (or a full URL); an error status raises `EngineRefused` with
        the server's message."""
        response = await self.client.post(path, json=body)
        if response.status_code >= 400:
            raise EngineRefused(f"{self.label}{path}: {error_text(response.text)}")
        return response.json()

    async def stream_events(self, target: str, body: dict, headers: dict,
                            opened: asyncio.Future,
                            on_data: Callable[[dict], None]) -> bool | tuple[int, str]:
        """One streamed POST to `target`: (status, message) when it answers an error status
        (`opened` untouched); else `opened` is set, every `data:` chunk goes to `on_data`, and
        the result says whether the stream ended with [DONE]."""
        async with self.client.stream("POST", target, json=body, headers=headers) as response:
            if response.status_code >= 400:
                text = (await response.aread()).decode(errors="replace")
                return response.status_code, error_text(text)
            opened.set_result(True)
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data.strip() == "[DONE]":
                    return True
                on_data(json.loads(data))
        return False

    def close(self) -> None:
        """Close the client and stop the loop's thread (again: nothing)."""
        client = self.client
        if client is not None and self.loop.is_running():
            try:
                self.call(client.aclose(), timeout=5.0)
            except Exception:  # noqa: BLE001
                pass
            self.client = None
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5.0)
