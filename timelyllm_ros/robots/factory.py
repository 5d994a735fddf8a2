"""`make_backend(kind, **params)`: the executor node's `backend` parameter turned into a backend.

The kinds, and the module each one lives in, are listed in timelyllm_ros/robots/__init__.py.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

BACKEND_KINDS = ("sim", "tello", "arm-sim", "replay")

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


def make_backend(kind: str, **params: Any):
    """Build a backend. Raises ValueError naming the parameter at fault.

    Each kind's module is imported only when that kind is built, so a simulated drone never
    loads a Tello's socket code or a timing table's reader.

    Common parameters: model (an ExecutionTimeModel) or exec_model (a YAML path; default
    config/exec_model.yaml), time_scale (sim, arm-sim), seed (sim, arm-sim), stop (an Event set
    when the executor shuts down).
    tello: host, port, state_port, local_port, and any other TelloBackend keyword
        (timeout_factor, timeout_margin_s, retries, keepalive_s, speed_cm_s, detector, ...).
    arm-sim: jitter, strict, unreachable, fail_on_check.
    replay: replay_table (a timing table CSV, required), robot_id (prefer that robot's rows);
        time_scale and seed apply (seed: the fallback draws from the model).
    """
    kind = str(kind).strip().lower()
    stop = params.get("stop") or threading.Event()
    time_scale = float(params.get("time_scale", 1.0))
    seed = params.get("seed", 0)
    extra = {k: v for k, v in params.items() if k not in _COMMON}
    if kind in ("sim", "arm-sim", "replay") and not time_scale > 0:
        raise ValueError(f"time_scale: must be > 0, got {time_scale}")
    if kind == "sim":
        if extra:
            raise ValueError(f"{sorted(extra)[0]}: not a parameter of backend 'sim'")
        from timelyllm_ros.robots.sim import SimulatedBackend

        return SimulatedBackend(_model(params), time_scale, int(seed or 0), stop)
    if kind == "tello":
        from timelyllm_ros.robots.tello.backend import TelloBackend
        from timelyllm_ros.robots.tello.timings import TelloTimings

        if "timings" not in extra:
            extra["timings"] = TelloTimings.from_exec_model(_model(params))
        try:
            return TelloBackend(stop=stop, **extra)
        except TypeError as err:
            raise ValueError(f"backend 'tello': {err}") from None
    if kind == "arm-sim":
        from timelyllm_ros.robots.arm import ArmBackend, SimulatedArmDriver

        fail_on_check = extra.pop("fail_on_check", True)
        try:
            driver = SimulatedArmDriver(_model(params), time_scale=time_scale, seed=seed,
                                        stop=stop, **extra)
        except TypeError as err:
            raise ValueError(f"backend 'arm-sim': {err}") from None
        return ArmBackend(driver, fail_on_check=fail_on_check, stop=stop)
    if kind == "replay":
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
    raise ValueError(f"backend: unknown kind {kind!r} (known: {', '.join(BACKEND_KINDS)})")
