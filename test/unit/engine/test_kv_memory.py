"""Every CPU engine sizes its KV cache in bytes, and a cache that does not fit says which knob
to turn and what the NUMA node has (issue: `vllm serve` failed on a machine whose one NUMA node
held 9 GB, because a fraction of that node was less than the weights)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from timelyllm_ros.core.engine.vllm_engine_config import VllmEngineConfig
from timelyllm_ros.core.engine.vllm_memory import (DEFAULT_KV_CACHE_BYTES, kv_memory_advice,
                                                   kv_memory_args)
from timelyllm_ros.ros_env import REPO_ROOT

# Where an engine or a `vllm serve` command line can be configured.
SOURCES = [*REPO_ROOT.glob("timelyllm_ros/**/*.py"), *REPO_ROOT.glob("test/**/*.py"),
           *REPO_ROOT.glob("config/*.yaml"), *REPO_ROOT.glob("launch/*"),
           *REPO_ROOT.glob("scripts/*"), *REPO_ROOT.glob("tools/*.py"), REPO_ROOT / "Makefile"]


def test_the_default_engine_config_is_sized_in_bytes():
    config = VllmEngineConfig(model="m")
    assert config.kv_cache_memory_bytes == DEFAULT_KV_CACHE_BYTES and config.gpu_memory_utilization is None
    assert kv_memory_args(config) == {"kv_cache_memory_bytes": DEFAULT_KV_CACHE_BYTES}
    # 1 GiB is the bundled model's 23,301 tokens (46,080 bytes a token in float32).
    assert DEFAULT_KV_CACHE_BYTES // (2 * 30 * 3 * 64 * 4) == 23_301


def test_the_planner_defaults_build_a_config_sized_in_bytes():
    pytest.importorskip("rclpy")
    from timelyllm_ros.ros import planner_params

    p = {name: spec[0] for name, spec in planner_params.PARAMETERS.items()}
    p.update({name: default for name, (_f, default) in planner_params.ENGINE_PARAMS.items()})
    p["model"] = str(REPO_ROOT)  # any directory
    config = planner_params._vllm_config(p, "fcfs")
    assert config.kv_cache_memory_bytes == DEFAULT_KV_CACHE_BYTES
    assert config.gpu_memory_utilization is None
    # A GPU user sizes by fraction with the bytes set to 0.
    p.update({"engine.kv_cache_bytes": 0, "engine.memory_fraction": 0.9})
    config = planner_params._vllm_config(p, "fcfs")
    assert (config.kv_cache_memory_bytes, config.gpu_memory_utilization) == (None, 0.9)
    # engine.sessions reaches the engine (the engine's own error tells users to set it).
    p.update({"engine.sessions": False, "engine.memory_fraction": 0.0, "engine.kv_cache_bytes": 1 << 28})
    assert planner_params._vllm_config(p, "fcfs").sessions is False
    p.update({"engine.kv_cache_bytes": 0, "engine.memory_fraction": 0.9})
    # Both, or neither: refused naming both parameters.
    p.update({"engine.kv_cache_bytes": 1 << 28})
    with pytest.raises(ValueError, match="engine.kv_cache_bytes / engine.memory_fraction"):
        planner_params._vllm_config(p, "fcfs")


def test_no_cpu_configuration_in_the_project_asks_for_a_fraction():
    offenders = []
    for path in SOURCES:
        if not path.is_file() or path == Path(__file__):
            continue
        lines = path.read_text(errors="replace").splitlines()
        for number, line in enumerate(lines, 1):
            if line.lstrip().startswith("#"):  # a comment may explain the GPU option
                continue
            for pattern in (r"--gpu-memory-utilization", r"gpu_memory_utilization\s*=\s*0?\.\d",
                            r"memory_fraction:\s*0?\.[1-9]", r"VLLM_CPU_KVCACHE_SPACE"):
                for m in re.finditer(pattern, line):
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{number}: {m.group(0)}")
    assert not offenders, "CPU engines must be sized in bytes:\n" + "\n".join(offenders)
    # Every `vllm serve` the project starts passes the size in bytes.
    for path in SOURCES:
        if path.is_file() and "vllm.entrypoints.openai.api_server" in path.read_text(errors="replace"):
            assert "--kv-cache-memory-bytes" in path.read_text(), path


def test_a_fraction_on_a_cpu_is_refused_naming_the_bytes_knob():
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("a GPU machine: a fraction is allowed there")
    config = VllmEngineConfig(model="m", kv_cache_memory_bytes=None, gpu_memory_utilization=0.15)
    with pytest.raises(ValueError, match=r"engine\.kv_cache_bytes"):
        kv_memory_args(config)


@pytest.mark.parametrize("kwargs, field", [
    ({"kv_cache_memory_bytes": None}, "set exactly one"),
    ({"kv_cache_memory_bytes": 0}, "must be positive"),
    ({"kv_cache_memory_bytes": None, "gpu_memory_utilization": 1.5}, "engine.memory_fraction"),
])
def test_bad_sizes_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        VllmEngineConfig(model="m", **kwargs)


def test_the_advice_names_the_knob_its_value_and_the_node():
    message = kv_memory_advice(VllmEngineConfig(model="m", kv_cache_memory_bytes=3 << 30),
                               "Available memory on node 0 (5.77/8.59 GiB) ...")
    assert "engine.kv_cache_bytes" in message and str(3 << 30) in message
    assert "--kv-cache-memory-bytes" in message and "5.77/8.59" in message
    if Path("/sys/devices/system/node/node0/meminfo").is_file():
        assert re.search(r"NUMA node 0: [\d.]+ GiB free of [\d.]+ GiB", message), message


@pytest.mark.vllm
def test_a_cache_larger_than_the_node_fails_with_the_knob_to_turn():
    pytest.importorskip("vllm")
    from timelyllm_ros.core.engine.model_prep import DEFAULT_MODEL_DIR
    from timelyllm_ros.core.engine.vllm_engine import VllmEngine

    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip("bundled model not prepared (run scripts/bootstrap.sh)")
    too_big = 1 << 44  # 16 TiB: no machine's node has it free
    with pytest.raises(ValueError) as info:
        VllmEngine(VllmEngineConfig(model=str(DEFAULT_MODEL_DIR), max_model_len=512,
                                    kv_cache_memory_bytes=too_big))
    message = str(info.value)
    print(message)
    assert message.startswith("engine.kv_cache_bytes: the KV cache does not fit")
    assert str(too_big) in message and "vLLM said:" in message
