"""Behind vllm-router: the worker list, each worker's /metrics, the sums the scheduler reads,
the API key from the environment and the session header (no server needed)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.factory import EngineSpec
from timelyllm_ros.core.engine.openai_wire import (OpenAIEngineConfig, api_key_from_env,
                                                   completion_body)
from timelyllm_ros.core.engine.replicas import affinity_key
from timelyllm_ros.core.engine.worker_metrics import (RouterWorker, WorkerMetrics,
                                                      parse_metrics, parse_worker_list)

MODEL = 'model_name="m"'


def metrics_text(blocks, usage, running=0, waiting=0, engine="0", block_size=16):
    return "\n".join([
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        f'vllm:cache_config_info{{block_size="{block_size}",engine="{engine}",'
        f'num_gpu_blocks="{blocks}",prefix_caching_hash_algo="sha256"}} 1.0',
        f'vllm:kv_cache_usage_perc{{engine="{engine}",{MODEL}}} {usage}',
        f'vllm:num_requests_running{{engine="{engine}",{MODEL}}} {running}',
        f'vllm:num_requests_waiting{{engine="{engine}",{MODEL}}} {waiting}',
    ]) + "\n"


def test_metrics_of_one_engine():
    got = parse_metrics(metrics_text(1000, 0.25, running=3, waiting=1))
    assert got == {"num_gpu_blocks": 1000, "block_size": 16, "kv_cache_usage_perc": 0.25,
                   "num_requests_running": 3, "num_requests_waiting": 1}


def test_a_data_parallel_server_sums_its_engines():
    text = metrics_text(1000, 0.5, running=2, engine="0") + metrics_text(3000, 0.1, running=1,
                                                                           engine="1")
    got = parse_metrics(text)
    assert got["num_gpu_blocks"] == 4000 and got["num_requests_running"] == 3
    assert got["kv_cache_usage_perc"] == pytest.approx((500 + 300) / 4000)


def test_the_router_worker_lists():
    answer = {"workers": [{"url": "http://a:1/", "is_healthy": True, "load": 0},
                          {"url": "http://b:2", "is_healthy": False}], "total": 2}
    assert parse_worker_list(answer) == [RouterWorker("http://a:1", True),
                                         RouterWorker("http://b:2", False)]
    assert parse_worker_list({"urls": ["http://a:1"]}) == [RouterWorker("http://a:1", True)]
    with pytest.raises(ValueError, match="router worker list"):
        parse_worker_list({"detail": "Not Found"})
    with pytest.raises(ValueError, match="has no 'url'"):
        parse_worker_list({"workers": [{"is_healthy": True}]})


def _serve(pages):
    """An httpx client whose answers come from `pages` (url -> (status, body))."""
    def handler(request):
        status, body = pages[str(request.url)]
        if isinstance(body, dict):
            return httpx.Response(status, json=body)
        return httpx.Response(status, text=body)
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def test_kv_and_slots_are_summed_and_a_dead_worker_counts_as_full():
    pages = {"http://r/workers": (200, {"workers": [{"url": "http://a", "is_healthy": True},
                                                    {"url": "http://b", "is_healthy": True}]}),
             "http://a/metrics": (200, metrics_text(1000, 0.5, running=2, waiting=1)),
             "http://b/metrics": (200, metrics_text(3000, 0.0))}
    workers = WorkerMetrics("http://r", (), max_num_seqs=8, interval_s=0.5)
    asyncio.run(workers.refresh(_serve(pages)))
    kv = workers.kv_usage()
    assert (kv.free_blocks, kv.total_blocks, kv.block_size) == (500 + 3000, 4000, 16)
    assert workers.slots() == 16 and workers.free_slots() == (8 - 3) + 8
    # b dies: the router's health check fails it; its blocks stay in the total (the
    # deployment's size) but none of them is free, and its slots are gone.
    pages["http://r/workers"] = (200, {"workers": [{"url": "http://a", "is_healthy": True},
                                                   {"url": "http://b", "is_healthy": False}]})
    asyncio.run(workers.refresh(_serve(pages)))
    kv = workers.kv_usage()
    assert (kv.free_blocks, kv.total_blocks) == (500, 4000)
    assert workers.free_slots() == 5 and [w.up for w in workers.live()] == [True]
    # A worker whose /metrics fails counts as full too, with the reason kept.
    pages["http://r/workers"] = (200, {"urls": ["http://a", "http://b"]})
    pages["http://a/metrics"] = (500, "boom")
    pages["http://b/metrics"] = (200, metrics_text(3000, 0.5))
    asyncio.run(workers.refresh(_serve(pages)))
    assert workers.kv_usage().free_blocks == 1500
    assert "500" in workers.describe()[0]["error"]


def test_fixed_workers_skip_the_router_and_none_reported_is_an_error():
    pages = {"http://a/metrics": (200, "# nothing vLLM here\n")}
    workers = WorkerMetrics("http://r", ["http://a/"], max_num_seqs=4, interval_s=0.5)
    asyncio.run(workers.refresh(_serve(pages)))
    with pytest.raises(ValueError, match="no worker has reported"):
        workers.kv_usage()
    assert "cache_config_info" in workers.describe()[0]["error"]


def test_the_api_key_comes_from_the_named_environment_variable(monkeypatch):
    assert api_key_from_env("") is None
    monkeypatch.delenv("TIMELYLLM_TEST_KEY", raising=False)
    with pytest.raises(ValueError, match=r"engine.api_key_env.*'TIMELYLLM_TEST_KEY'.*not set"):
        api_key_from_env("TIMELYLLM_TEST_KEY")
    monkeypatch.setenv("TIMELYLLM_TEST_KEY", "s3cret")
    assert api_key_from_env("TIMELYLLM_TEST_KEY") == "s3cret"


def test_router_settings_from_the_planner_parameters():
    spec = EngineSpec.from_params({"kind": "openai", "url": "http://r:30000", "router": True,
                                   "workers": "http://a:1, http://b:2",
                                   "api_key_env": "VLLM_API_KEY"})
    config = OpenAIEngineConfig.from_mapping(dict(spec.openai))
    assert config.router and config.workers == ("http://a:1", "http://b:2")
    assert config.api_key_env == "VLLM_API_KEY"
    with pytest.raises(ValueError, match="engine.workers: only read behind a router"):
        OpenAIEngineConfig.from_mapping({"workers": ["http://a:1"]})
    with pytest.raises(ValueError, match="engine.router: a vllm-router places the plans"):
        EngineSpec.from_params({"kind": "openai", "router": True,
                                "replicas": ["http://a:1", "http://b:2"]})


def test_every_run_of_a_task_carries_the_task_as_its_session():
    # The header value is the affinity key: the same for a plan's first run and its resumes.
    assert affinity_key("robot7-task3#0") == affinity_key("robot7-task3#12") == "robot7-task3"
    body = completion_body("m", OpenAIEngineConfig(), EngineRequest("t#2", [1, 2], 4))
    assert body["request_id"] == "t#2" and body["prompt"] == [1, 2] and body["stream"]
