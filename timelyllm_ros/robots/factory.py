"""`make_backend(kind, **params)`: the executor node's `backend` parameter turned into a backend.

Kinds are found through the Python entry-point group `timelyllm_ros.robots`: each entry point
names a builder, `builder(**params) -> backend`, so a package of your own adds a robot without
editing this repository (README, "Adding a robot backend"). The built-in kinds are registered
the same way in setup.py, and are also known here so that a source checkout that was never
`pip install`ed still finds them. The kinds, and the module each lives in, are listed in
timelyllm_ros/robots/__init__.py.
"""

from __future__ import annotations

import threading
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

ENTRY_POINT_GROUP = "timelyllm_ros.robots"
BUILTIN_KINDS = ("sim", "drone-sim", "tello", "arm-sim", "replay")
BACKEND_KINDS = BUILTIN_KINDS   # kept for older callers

# Parameters every kind accepts (the executor node passes them whatever the kind); those a
# kind has no use for are ignored: a Tello runs in real time, so time_scale and seed do not
# apply to it.
_COMMON = ("model", "exec_model", "time_scale", "seed", "stop")


def _model(params: dict[str, Any]):
    from timelyllm_ros.core.exec_model import ExecutionTimeModel

    model = params.get("model")
    if model is not None:
        return model
    path = params.get("exec_model")
    return ExecutionTimeModel.from_yaml(Path(path) if path else None)


def _split(kind: str, params: dict[str, Any]) -> tuple[threading.Event, float, Any, dict]:
    stop = params.get("stop") or threading.Event()
    time_scale = float(params.get("time_scale", 1.0))
    if kind != "tello" and not time_scale > 0:
        raise ValueError(f"time_scale: must be > 0, got {time_scale}")
    extra = {k: v for k, v in params.items() if k not in _COMMON}
    return stop, time_scale, params.get("seed", 0), extra


def build_sim(**params: Any):
    stop, time_scale, seed, extra = _split("sim", params)
    if extra:
        raise ValueError(f"{sorted(extra)[0]}: not a parameter of backend 'sim'")
    from timelyllm_ros.robots.sim import SimulatedBackend

    return SimulatedBackend(_model(params), time_scale, int(seed or 0), stop)


def build_drone_sim(**params: Any):
    """drone-sim: scene (a YAML path, or a Scene), jitter, max_loop_count, step_budget.
    time_scale: real seconds slept per simulated second (0 = do not sleep)."""
    stop, _, seed, extra = _split("drone-sim", {**params, "time_scale": 1.0})
    from timelyllm_ros.core.skills.interpreter import InterpreterLimits
    from timelyllm_ros.robots.drone_sim import SimDrone, SimDroneBackend
    from timelyllm_ros.robots.scene import Scene, load_scene

    scene = extra.pop("scene", None)
    if scene is not None and not isinstance(scene, Scene):
        scene = load_scene(scene) if str(scene) else None
    limits = {k: int(extra.pop(k)) for k in ("max_loop_count", "step_budget") if k in extra}
    jitter = bool(extra.pop("jitter", False))
    if extra:
        raise ValueError(f"{sorted(extra)[0]}: not a parameter of backend 'drone-sim'")
    time_scale = float(params.get("time_scale", 0.0))
    if time_scale < 0:
        raise ValueError(f"time_scale: must be >= 0, got {time_scale}")
    drone = SimDrone(scene, _model(params), jitter=jitter, seed=int(seed or 0),
                     time_scale=time_scale, stop=stop)
    return SimDroneBackend(drone, InterpreterLimits(**limits))


def build_tello(**params: Any):
    stop, _, _, extra = _split("tello", params)
    from timelyllm_ros.robots.tello.backend import TelloBackend
    from timelyllm_ros.robots.tello.timings import TelloTimings

    if "timings" not in extra:
        extra["timings"] = TelloTimings.from_exec_model(_model(params))
    try:
        return TelloBackend(stop=stop, **extra)
    except TypeError as err:
        raise ValueError(f"backend 'tello': {err}") from None


def build_arm_sim(**params: Any):
    stop, time_scale, seed, extra = _split("arm-sim", params)
    from timelyllm_ros.robots.arm import ArmBackend, SimulatedArmDriver

    fail_on_check = extra.pop("fail_on_check", True)
    try:
        driver = SimulatedArmDriver(_model(params), time_scale=time_scale, seed=seed,
                                    stop=stop, **extra)
    except TypeError as err:
        raise ValueError(f"backend 'arm-sim': {err}") from None
    return ArmBackend(driver, fail_on_check=fail_on_check, stop=stop)


def build_replay(**params: Any):
    stop, time_scale, seed, extra = _split("replay", params)
    from timelyllm_ros.robots.replay import ReplayBackend

    table = extra.pop("replay_table", None)
    robot_id = str(extra.pop("robot_id", "") or "")
    if extra:
        raise ValueError(f"{sorted(extra)[0]}: not a parameter of backend 'replay'")
    if not table:
        raise ValueError("replay_table: required for backend 'replay' (a timing table CSV, "
                         "see `timelyllm lrtrace table`)")
    return ReplayBackend(table, _model(params), time_scale=time_scale, seed=int(seed or 0),
                         stop=stop, robot_id=robot_id)


_BUILTIN: dict[str, Callable[..., Any]] = {
    "sim": build_sim, "drone-sim": build_drone_sim, "tello": build_tello,
    "arm-sim": build_arm_sim, "replay": build_replay,
}


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def known_kinds() -> tuple[str, ...]:
    return tuple(sorted(set(_BUILTIN) | set(_entry_points())))


def builder_for(kind: str) -> Callable[..., Any]:
    kind = str(kind).strip().lower()
    if kind in _BUILTIN:
        return _BUILTIN[kind]
    ep = _entry_points().get(kind)
    if ep is None:
        raise ValueError(f"backend: unknown kind {kind!r} (known: {', '.join(known_kinds())})")
    try:
        builder = ep.load()
    except Exception as err:  # noqa: BLE001 - a broken plug-in is a configuration error
        raise ValueError(f"backend {kind!r}: entry point {ep.value!r} does not load: "
                         f"{type(err).__name__}: {err}") from None
    if not callable(builder):
        raise ValueError(f"backend {kind!r}: entry point {ep.value!r} is not callable")
    return builder


def make_backend(kind: str, **params: Any):
    """Build a backend. Raises ValueError naming the parameter at fault.

    Each kind's module is imported only when that kind is built, so a simulated drone never
    loads a Tello's socket code or a timing table's reader.

    Common parameters: model (an ExecutionTimeModel) or exec_model (a YAML path; default
    config/exec_model.yaml), time_scale (sim, arm-sim, replay; drone-sim: 0 = no sleeping),
    seed (sim, drone-sim, arm-sim), stop (an Event set when the executor shuts down).
    drone-sim: scene (YAML path), jitter, max_loop_count, step_budget.
    tello: host, port, state_port, local_port, and any other TelloBackend keyword
        (timeout_factor, timeout_margin_s, retries, keepalive_s, speed_cm_s, detector, ...).
    arm-sim: jitter, strict, unreachable, objects (the arm's scene), fail_on_check.
    replay: replay_table (a timing table CSV, required), robot_id (prefer that robot's rows);
        time_scale and seed apply (seed: the fallback draws from the model).
    Plug-in kinds (entry points) receive every parameter as given.
    """
    return builder_for(kind)(**params)
