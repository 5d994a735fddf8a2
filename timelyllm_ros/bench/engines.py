"""The engine a replay runs on, built by `core.engine.factory` (the planner's factory too) from the
bench configuration and what the policy needs; `EnginePool` reuses a real engine across policies."""

from __future__ import annotations

from typing import Callable

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.core.engine.base import EngineAdapter, EngineNeeds
from timelyllm_ros.core.engine.factory import EngineSpec
from timelyllm_ros.core.engine.factory import build_engine as build_from_spec
from timelyllm_ros.core.sched.interface import Policy

EngineBuilder = Callable[..., EngineAdapter]


def engine_spec(config: BenchConfig, prefix_cache: bool = True) -> EngineSpec:
    """What `build_engine` builds. On the real engine, an explicit `profile` is its measured
    cost model (as the planner's `engine.profile`): policies that price work, such as the
    default policy's prefill hold, need one; the default simulated profile is not given to it."""
    if config.engine == "sim":
        return EngineSpec(kind="sim", profile=config.load_profile(), prefix_cache=prefix_cache,
                          max_num_seqs=config.max_num_seqs)
    if not config.model:
        raise ValueError("engine vllm: --model DIR (a local model directory) is required")
    vllm = {"model": str(config.model), **dict(config.vllm_config)}
    profile = config.load_profile() if config.profile is not None else None
    return EngineSpec(kind="vllm", prefix_cache=prefix_cache, vllm=vllm, profile=profile,
                      scheduling_policy=vllm.pop("scheduling_policy", None))


def build_engine(config: BenchConfig, prefix_cache: bool = True,
                 policy: Policy | None = None) -> EngineAdapter:
    """A fresh engine for a replay; `prefix_cache=False` turns automatic prefix caching off. The
    policy's needs decide vLLM's scheduling policy and, on the simulated engine, the engine
    variant (BROS's bidirectional KV blocks, MC-SF's clearing baselines). With
    `config.replicas` > 1, that many simulated engines in parallel behind the replica router's
    placement (core/engine/sim/fleet.py)."""
    needs = policy.engine_needs() if policy is not None else EngineNeeds()
    spec = engine_spec(config, prefix_cache)
    if config.replicas > 1:
        from timelyllm_ros.core.engine.sim.fleet import simulated_fleet
        return simulated_fleet(lambda: build_from_spec(spec, needs), config.replicas)
    return build_from_spec(spec, needs)


class EnginePool:
    """Real engines for a run of several policies: one engine at a time, kept while consecutive
    policies need the same prefix-caching setting and engine scheduling, and rebuilt when they
    do not (a vLLM engine holds most of the machine's memory, so two are never alive
    together)."""

    def __init__(self, config: BenchConfig, build: EngineBuilder | None = None):
        self.config = config
        self._build = build or build_engine
        self._engine: EngineAdapter | None = None
        self._key: tuple | None = None

    def get(self, prefix_cache: bool = True, policy: Policy | None = None) -> EngineAdapter:
        key = (prefix_cache, policy.engine_needs().scheduling_policy if policy is not None
               else "fcfs")
        if self._engine is None or self._key != key:
            self.shutdown()
            self._engine = self._build(self.config, prefix_cache=prefix_cache, policy=policy)
            self._key = key
        return self._engine

    def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        self._key = None
        if engine is not None:
            engine.shutdown()
