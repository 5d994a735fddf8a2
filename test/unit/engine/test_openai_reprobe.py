"""Recovery from a server that dies: a server marked down comes back (the adapter asks its
/health again in the background, so a restarted server gets work again, alone and as one of
`engine.replicas`), and behind a router whose ring still holds a dead worker, tokenizing goes
to a worker that answers (no vLLM needed: a minimal HTTP server on loopback answers the few
calls the adapter makes)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.openai_engine import EngineRefused, OpenAIEngine
from timelyllm_ros.core.engine.openai_wire import OpenAIEngineConfig
from timelyllm_ros.core.engine.replicas import Replica, ReplicaEngine

METRICS = ('vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n'
           'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0\n')


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the http.server name
        if self.path == "/v1/models":
            body, kind = json.dumps({"data": [{"id": "m", "max_model_len": 512}]}), "json"
        elif self.path == "/metrics":
            body, kind = METRICS, "plain"
        elif self.path == "/health":
            body, kind = "", "plain"
        else:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", f"application/{kind}" if kind == "json" else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802 - the http.server name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/v1/completions":
            self._complete()
            return
        if self.path != "/tokenize":
            self.send_error(404)
            return
        if self.server.tokenize_fails:  # a router whose ring still holds a dead worker
            data, status = b'{"error": {"message": "Backend request failed"}}', 502
        else:
            data, status = json.dumps({"tokens": [7, 8, 9]}).encode(), 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _complete(self):
        if self.server.tokenize_fails:  # the router: the worker its hash picked is dead
            data = b'{"error": {"message": "Request failed: error sending request"}}'
            self.send_response(502)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        chunk = {"choices": [{"text": "ok", "token_ids": [5, 6], "finish_reason": "stop"}]}
        data = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


class _Server:
    """The fake server on a fixed loopback port, stopped and started again at will."""

    def __init__(self, tokenize_fails=False):
        self.tokenize_fails = tokenize_fails
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.httpd = None
        self.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        self.httpd.tokenize_fails = self.tokenize_fails
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    made = []

    def make(**kwargs):
        made.append(_Server(**kwargs))
        return made[-1]
    yield make
    for server in made:
        server.stop()


def _config(server, **extra):
    return OpenAIEngineConfig(url=server.url, reprobe_s=0.05, connect_timeout_s=2.0, **extra)


def _wait_until(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_server_marked_down_is_up_again_once_it_answers(servers):
    server = servers()
    engine = OpenAIEngine(_config(server))
    try:
        assert engine.healthy()
        server.stop()
        with pytest.raises(EngineRefused, match="is down"):
            engine.add_request(EngineRequest("t#0", [1, 2, 3], 4))
        assert not engine.healthy() and "is down" in engine.down_reason()
        # Still down while nothing answers: the background probes fail too.
        time.sleep(0.3)
        assert not engine.healthy()
        server.start()
        assert _wait_until(engine.healthy), engine.down_reason()
        assert engine.down_reason() == ""
    finally:
        engine.shutdown()


def test_a_replica_that_died_mid_run_gets_new_plans_again_after_it_restarts(servers):
    first, second = servers(), servers()
    configs = [_config(first, name="a"), _config(second, name="b")]
    engine = ReplicaEngine([Replica(c.name, build=(lambda c=c: OpenAIEngine(c)),
                                    health=OpenAIEngine.healthy) for c in configs])
    try:
        a = engine.replicas[0]
        first.stop()
        with pytest.raises(EngineRefused):
            a.engine.add_request(EngineRequest("x#0", [1], 1))
        # While `a` is down every new plan goes to `b` ...
        assert all(engine._pick().name == "b" for _ in range(5))
        first.start()
        # ... and once a background probe finds it answering, `a` is a candidate again.
        assert _wait_until(a.up), a.engine.down_reason()
        assert engine._pick(exclude=engine.replicas[1]).name == "a"
    finally:
        engine.shutdown()


def test_behind_a_router_tokenizing_and_runs_go_to_a_worker_that_answers(servers):
    router, worker = servers(tokenize_fails=True), servers()
    engine = OpenAIEngine(_config(router, router=True, workers=(worker.url,)))
    try:
        assert engine.render_chat([{"role": "user", "content": "go"}]) == [7, 8, 9]
        assert engine.tokenize("go") == [7, 8, 9]
        # A run the router cannot place (its hash picked a dead worker) is served by a worker
        # that answers, directly.
        engine.add_request(EngineRequest("t#1", [1, 2, 3], 4))
        outputs = []
        assert _wait_until(lambda: outputs.extend(engine.step()) or
                           any(o.finished for o in outputs)), outputs
        assert [t for o in outputs for t in o.new_token_ids] == [5, 6]
        assert not [o for o in outputs if o.error] and engine.healthy()
        # With no worker answering either, the router's failure is what the caller sees.
        worker.tokenize_fails = worker.httpd.tokenize_fails = True
        with pytest.raises(EngineRefused, match="Backend request failed"):
            engine.tokenize("go")
    finally:
        engine.shutdown()


def test_the_planner_parameters_reach_the_server_client():
    pytest.importorskip("rclpy")
    from timelyllm_ros.ros import planner_params

    p = {name: spec[0] for name, spec in planner_params.PARAMETERS.items()}
    p.update({name: default for name, (_f, default) in planner_params.ENGINE_PARAMS.items()})
    p.update({"engine.kind": "openai", "engine.url": "http://127.0.0.1:30000",
              "engine.router": True, "engine.api_key_env": "VLLM_API_KEY",
              "engine.reprobe_s": 7.5})
    spec = planner_params.PlannerSettings.from_parameters(p).engine_spec
    config = OpenAIEngineConfig.from_mapping(dict(spec.openai))
    assert (config.router, config.api_key_env, config.reprobe_s) == (True, "VLLM_API_KEY", 7.5)
    # The key's name is a parameter; the key itself is nowhere in what the planner keeps.
    assert "api_key" not in {k for k in spec.openai if k != "api_key_env"}
