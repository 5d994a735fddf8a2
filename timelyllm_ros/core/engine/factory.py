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
# vllm:         the real vLLM engine, embedded (sessions: true suspend/resume);
# openai:       a client of running vLLM OpenAI-compatible servers (`vllm serve`); with more than
#               one in `replicas`, a router over them (replicas.py); with `router: true`, a client
#               of a vllm-router in front of them (docs/router.md).
ENGINE_KINDS = ("sim", "sim-realtime", "vllm", "openai")


@dataclass(frozen=True)
class EngineSpec:
    """Which engine to build.

    profile: the cost model of a simulated engine (None = the default profile).
    prefix_cache: automatic prefix caching (off reproduces vLLM V0's 2024 default).
    scheduling_policy: vLLM's scheduling policy; None = what the policy needs.
    max_num_seqs: a simulated engine's slot count (None = its default); vLLM's is in `vllm`.
    vllm: `VllmEngineConfig` fields for the real engine (`model` is required).
    openai: `OpenAIEngineConfig` fields shared by every server (kind openai).
    replicas: the servers, each a URL or a mapping of `OpenAIEngineConfig` fields (kind openai;
        one = a plain client, several = the replica router).
    """

    kind: str = "sim"
    profile: EngineProfile | None = None
    prefix_cache: bool = True
    scheduling_policy: str | None = None
    max_num_seqs: int | None = None
    vllm: Mapping[str, Any] = field(default_factory=dict)
    openai: Mapping[str, Any] = field(default_factory=dict)
    replicas: tuple = ()

    def __post_init__(self) -> None:
        if self.kind not in ENGINE_KINDS:
            raise ValueError(f"engine.kind: {self.kind!r} is not one of {', '.join(ENGINE_KINDS)}")
        if self.scheduling_policy is not None and self.scheduling_policy not in ENGINE_SCHEDULING:
            raise ValueError(f"engine.scheduling_policy: {self.scheduling_policy!r} is not one of "
                             f"{', '.join(ENGINE_SCHEDULING)}")
        if self.kind == "openai" and not (self.replicas or self.openai.get("url")):
            raise ValueError("engine.kind openai: give the server(s) in engine.replicas "
                             "(URLs) or engine.url")
        for replica in self.replicas:
            if not isinstance(replica, (str, Mapping)):
                raise ValueError(f"engine.replicas: {replica!r} is neither a URL nor a mapping")
        if self.openai.get("router") and len(self.replicas) > 1:
            raise ValueError("engine.router: a vllm-router places the plans itself; give its "
                             "URL in engine.url and leave engine.replicas empty")

    @classmethod
    def from_params(cls, params: Mapping[str, Any], *, profile: EngineProfile | None = None,
                    scheduling_policy: str | None = None) -> "EngineSpec":
        """An EngineSpec from a planner's `engine.*` parameters (the part after `engine.`):
        `kind`, `replicas` (list of URLs), `url`, `model`, for kind openai the
        `OpenAIEngineConfig` fields (`router`, `workers`, `api_key_env`: docs/router.md), and for
        kind vllm the `VllmEngineConfig` fields. The planner node can hand its parameters here
        unchanged."""
        values = dict(params)
        kind = str(values.pop("kind", "sim") or "sim")
        replicas = values.pop("replicas", ()) or ()
        if isinstance(replicas, str):
            replicas = tuple(u.strip() for u in replicas.split(",") if u.strip())
        if kind == "openai":
            openai = {k: v for k, v in values.items() if k in _openai_fields()}
            return cls(kind=kind, profile=profile, scheduling_policy=scheduling_policy,
                       openai=openai, replicas=tuple(replicas))
        if kind == "vllm":
            return cls(kind=kind, profile=profile, scheduling_policy=scheduling_policy,
                       vllm=values)
        return cls(kind=kind, profile=profile, scheduling_policy=scheduling_policy)


def _openai_fields() -> set[str]:
    from dataclasses import fields as dc_fields

    from timelyllm_ros.core.engine.openai_engine import OpenAIEngineConfig
    return {f.name for f in dc_fields(OpenAIEngineConfig)}


def build_openai(spec: EngineSpec) -> EngineAdapter:
    """One server client, or the replica router over several."""
    from timelyllm_ros.core.engine.openai_engine import OpenAIEngine, OpenAIEngineConfig
    from timelyllm_ros.core.engine.replicas import Replica, ReplicaEngine

    servers = list(spec.replicas) or [spec.openai["url"]]

    def config_of(server: Any, index: int) -> OpenAIEngineConfig:
        values = {**dict(spec.openai)}
        values.update({"url": server} if isinstance(server, str) else dict(server))
        values.setdefault("name", f"replica{index}" if len(servers) > 1 else values["url"])
        return OpenAIEngineConfig.from_mapping(values)

    configs = [config_of(s, i) for i, s in enumerate(servers)]
    if len(configs) == 1:
        return OpenAIEngine(configs[0], profile=spec.profile)
    return ReplicaEngine([
        Replica(c.name, build=(lambda c=c: OpenAIEngine(c, profile=spec.profile)),
                health=OpenAIEngine.healthy)
        for c in configs])


def build_engine(spec: EngineSpec, needs: EngineNeeds = EngineNeeds()) -> EngineAdapter:
    """A fresh engine as `spec` says, shaped by what the policy `needs`."""
    scheduling = spec.scheduling_policy or needs.scheduling_policy
    if spec.kind == "openai":
        # The servers' scheduling policy is theirs (`vllm serve --scheduling-policy priority`
        # for the BROS family); requests carry their priority either way.
        return build_openai(spec)
    if spec.kind == "vllm":
        from timelyllm_ros.core.engine.vllm_engine import VllmEngine
        from timelyllm_ros.core.engine.vllm_engine_config import VllmEngineConfig
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
