"""The one place engines are built: the planner node, the bench, the profiler and the LRTrace
replay all call `build_engine`.

An `EngineSpec` says which engine the deployment wants (kind, cost model, vLLM settings); the
policy says what it needs from it (`Policy.engine_needs()`: vLLM's scheduling policy, the
simulated engine variant it is evaluated on). Building from both here keeps the planner and the
bench from disagreeing about, say, which engine `bros` runs on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Mapping

from timelyllm_ros.core.engine.base import ENGINE_SCHEDULING, EngineAdapter, EngineNeeds
from timelyllm_ros.core.engine.cost_model import EngineProfile

# sim:          the calibrated cost-model engine in virtual time (bench replays);
# sim-realtime: the same paced to the wall clock (the planner node serving ROS robots);
# vllm:         the real vLLM engine.
ENGINE_KINDS = ("sim", "sim-realtime", "vllm")


@dataclass(frozen=True)
class EngineSpec:
    """Which engine to build.

    profile: the cost model of a simulated engine (None = the default profile).
    prefix_cache: automatic prefix caching (off reproduces vLLM V0's 2024 default).
    scheduling_policy: vLLM's scheduling policy; None = what the policy needs.
    max_num_seqs: a simulated engine's slot count (None = its default); vLLM's is in `vllm`.
    vllm: `VllmEngineConfig` fields for the real engine (`model` is required).
    """

    kind: str = "sim"
    profile: EngineProfile | None = None
    prefix_cache: bool = True
    scheduling_policy: str | None = None
    max_num_seqs: int | None = None
    vllm: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ENGINE_KINDS:
            raise ValueError(f"engine.kind: {self.kind!r} is not one of {', '.join(ENGINE_KINDS)}")
        if self.scheduling_policy is not None and self.scheduling_policy not in ENGINE_SCHEDULING:
            raise ValueError(f"engine.scheduling_policy: {self.scheduling_policy!r} is not one of "
                             f"{', '.join(ENGINE_SCHEDULING)}")


def build_engine(spec: EngineSpec, needs: EngineNeeds = EngineNeeds()) -> EngineAdapter:
    """A fresh engine as `spec` says, shaped by what the policy `needs`."""
    scheduling = spec.scheduling_policy or needs.scheduling_policy
    if spec.kind == "vllm":
        from timelyllm_ros.core.engine.vllm_engine import VllmEngine, VllmEngineConfig
        values = {**dict(spec.vllm), "scheduling_policy": scheduling}
        if not values.get("model"):
            raise ValueError("engine vllm: a local model directory (`model`) is required")
        if not spec.prefix_cache:
            values["enable_prefix_caching"] = False
        return VllmEngine(VllmEngineConfig.from_mapping(values), profile=spec.profile)
    from timelyllm_ros.core.engine.sim.engine import NoPrefixCacheEngine, SimulatedEngine
    kwargs: dict[str, Any] = {"scheduling_policy": scheduling}
    if spec.max_num_seqs is not None:
        kwargs["max_num_seqs"] = spec.max_num_seqs
    engine_cls = needs.simulated_engine
    if engine_cls is None:
        engine_cls = SimulatedEngine if spec.prefix_cache else NoPrefixCacheEngine
    if spec.kind == "sim-realtime":
        from timelyllm_ros.core.engine.sim.realtime import realtime
        if isinstance(engine_cls, partial):  # a variant with fixed arguments
            engine_cls = partial(realtime(engine_cls.func), *engine_cls.args,
                                 **engine_cls.keywords)
        else:
            engine_cls = realtime(engine_cls)
    return engine_cls(spec.profile, **kwargs)
