"""Our ROS 2 message types as `rosbags` sees them, without rclpy: what a bag stores and how.

- `typestore()`: the ROS 2 Kilted type store of `rosbags` plus our message types, parsed from
  msg/*.msg, so a bag carries the same definitions (and RIHS01 type hashes) that rosidl generates
  and `ros2 bag` on a real ROS install reads it.
- `from_rclpy` / `to_rclpy` / `to_dict`: convert between rclpy messages and the typestore's
  dataclasses by field name (nested messages and arrays included).
- `serialize` / `deserialize`: CDR bytes of one message.
- `make_qos` / `qos_from_rclpy` / `default_qos`: the QoS profiles of our topics.

Separate from `lrtrace.bag` (the rosbag2 files: writing, reading, salvaging) because the message
schema and its serialisation are a job of their own that the recorder, the replay report and
the timing table use without touching a file.

Nothing here imports rclpy at module level: reading bags, building tables and fitting work
without ROS.
"""

from __future__ import annotations

import functools
import os
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

MSG_PACKAGE = "timelyllm_ros"
GOAL_TYPE = f"{MSG_PACKAGE}/msg/TaskGoal"
SEGMENT_TYPE = f"{MSG_PACKAGE}/msg/SkillSegment"
REPORT_TYPE = f"{MSG_PACKAGE}/msg/ExecutionReport"
STATUS_TYPE = f"{MSG_PACKAGE}/msg/TaskStatus"
METRICS_TYPE = f"{MSG_PACKAGE}/msg/PlannerMetrics"

_NUMPY_DTYPES = {
    "bool": np.bool_, "byte": np.uint8, "octet": np.uint8, "char": np.uint8, "uint8": np.uint8,
    "int8": np.int8, "int16": np.int16, "uint16": np.uint16, "int32": np.int32,
    "uint32": np.uint32, "int64": np.int64, "uint64": np.uint64, "float32": np.float32,
    "float64": np.float64,
}


def find_msg_dir() -> Path:
    """msg/ of the repository, else share/timelyllm_ros/msg of a colcon install."""
    from timelyllm_ros.ros_env import INSTALL_PREFIX, REPO_ROOT

    candidates = [REPO_ROOT / "msg", INSTALL_PREFIX / "share" / MSG_PACKAGE / "msg"]
    for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        if prefix:
            candidates.append(Path(prefix) / "share" / MSG_PACKAGE / "msg")
    for c in candidates:
        if any(c.glob("*.msg")):
            return c
    raise FileNotFoundError(f"no {MSG_PACKAGE} .msg files found (looked in {', '.join(map(str, candidates))})")


def standard_store_id():
    """The `rosbags` store of ROS 2 standard types that ours are registered on top of."""
    from rosbags.typesys import Stores

    # Kilted is what the ROS wheels are; fall back to the newest store this rosbags knows.
    return getattr(Stores, "ROS2_KILTED", Stores.LATEST)


@functools.lru_cache(maxsize=1)
def typestore():
    """The rosbags type store: ROS 2 Kilted standard types + our msg/*.msg types."""
    from rosbags.typesys import get_types_from_msg, get_typestore

    store = get_typestore(standard_store_id())
    types: dict = {}
    for path in sorted(find_msg_dir().glob("*.msg")):
        types.update(get_types_from_msg(path.read_text(encoding="utf-8"), f"{MSG_PACKAGE}/msg/{path.stem}"))
    store.register(types)
    return store


def msgtype_of(msg_or_cls: Any) -> str:
    """`timelyllm_ros/msg/SkillSegment` for an rclpy message (or class) or a rosbags dataclass."""
    name = getattr(msg_or_cls, "__msgtype__", None)
    if isinstance(name, str):
        return name
    cls = msg_or_cls if isinstance(msg_or_cls, type) else type(msg_or_cls)
    return f"{cls.__module__.split('.')[0]}/msg/{cls.__name__}"


def _nodetypes():
    from rosbags.typesys.base import Nodetype

    return Nodetype


def _convert_value(value: Any, desc: tuple, store, convert_struct) -> Any:
    Nodetype = _nodetypes()
    kind, spec = desc
    if kind == Nodetype.BASE:
        typ = spec[0]
        if typ == "string" or typ == "wstring":
            return str(value)
        if typ == "bool":
            return bool(value)
        if typ in ("float32", "float64"):
            return float(value)
        return int(value)
    if kind == Nodetype.NAME:
        return convert_struct(value, spec)
    # ARRAY or SEQUENCE: spec = (element desc, bound/length)
    elem_desc = spec[0]
    if elem_desc[0] == Nodetype.BASE and elem_desc[1][0] not in ("string", "wstring"):
        return np.asarray(list(value), dtype=_NUMPY_DTYPES[elem_desc[1][0]])
    return [_convert_value(v, elem_desc, store, convert_struct) for v in value]


def _fielddesc(store, msgtype: str) -> list[tuple[str, tuple]]:
    try:
        return list(store.fielddefs[msgtype][1])
    except KeyError:
        raise KeyError(f"message type {msgtype!r} is not in the type store") from None


def from_rclpy(msg: Any, msgtype: str | None = None, store=None) -> Any:
    """rclpy message -> the typestore's dataclass, field by field (by name)."""
    store = store or typestore()

    def convert_struct(value: Any, typ: str) -> Any:
        cls = store.types[typ]
        kwargs = {}
        for name, desc in _fielddesc(store, typ):
            attr = name.rstrip("_") if not hasattr(value, name) else name
            kwargs[name] = _convert_value(getattr(value, attr), desc, store, convert_struct)
        return cls(**kwargs)

    return convert_struct(msg, msgtype or msgtype_of(msg))


def _rclpy_class(msgtype: str) -> type:
    import importlib

    pkg, kind, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.{kind}"), name)


def to_rclpy(obj: Any, store=None) -> Any:
    """Typestore dataclass (e.g. from a bag) -> rclpy message (needs rclpy and the msg types)."""
    store = store or typestore()
    Nodetype = _nodetypes()

    def convert(value: Any, desc: tuple) -> Any:
        kind, spec = desc
        if kind == Nodetype.BASE:
            return value
        if kind == Nodetype.NAME:
            return convert_struct(value, spec)
        elem_desc = spec[0]
        if elem_desc[0] == Nodetype.BASE:
            return list(value.tolist() if isinstance(value, np.ndarray) else value)
        return [convert(v, elem_desc) for v in value]

    def convert_struct(value: Any, typ: str) -> Any:
        out = _rclpy_class(typ)()
        for name, desc in _fielddesc(store, typ):
            setattr(out, name, convert(getattr(value, name), desc))
        return out

    return convert_struct(obj, msgtype_of(obj))


def to_dict(obj: Any) -> Any:
    """Typestore dataclass -> plain dicts / lists / scalars (recursively)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields(obj)
                if f.name != "__msgtype__" and not f.name.isupper()}
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def serialize(obj: Any, msgtype: str | None = None, store=None) -> bytes:
    """CDR bytes (little endian, with the encapsulation header) of a dataclass or rclpy message."""
    store = store or typestore()
    msgtype = msgtype or msgtype_of(obj)
    if not hasattr(obj, "__msgtype__"):
        obj = from_rclpy(obj, msgtype, store)
    return bytes(store.serialize_cdr(obj, msgtype, little_endian=True))


def deserialize(raw: bytes, msgtype: str, store=None) -> Any:
    store = store or typestore()
    return store.deserialize_cdr(raw, msgtype)


def stamp_s(stamp: Any) -> float:
    """builtin_interfaces/Time (dataclass, rclpy or dict) -> seconds."""
    if isinstance(stamp, Mapping):
        return stamp["sec"] + stamp["nanosec"] * 1e-9
    return stamp.sec + stamp.nanosec * 1e-9


# --- QoS ----------------------------------------------------------------------------------------

def make_qos(*, reliable: bool = True, transient_local: bool = False, depth: int = 10):
    """A rosbags Qos (what metadata.yaml lists as offered_qos_profiles)."""
    from rosbags.interfaces import (Qos, QosDurability, QosHistory, QosLiveliness,
                                    QosReliability, QosTime)

    zero = QosTime(0, 0)
    return Qos(history=QosHistory.KEEP_LAST, depth=int(depth),
               reliability=QosReliability.RELIABLE if reliable else QosReliability.BEST_EFFORT,
               durability=QosDurability.TRANSIENT_LOCAL if transient_local else QosDurability.VOLATILE,
               deadline=zero, lifespan=zero, liveliness=QosLiveliness.AUTOMATIC,
               liveliness_lease_duration=zero, avoid_ros_namespace_conventions=False)


def qos_from_rclpy(profile: Any):
    """rclpy QoSProfile -> rosbags Qos (same reliability, durability and depth)."""
    from rclpy.qos import DurabilityPolicy, ReliabilityPolicy

    return make_qos(reliable=profile.reliability == ReliabilityPolicy.RELIABLE,
                    transient_local=profile.durability == DurabilityPolicy.TRANSIENT_LOCAL,
                    depth=profile.depth)


def default_qos(msgtype: str):
    """QoS of our topics (mirrors timelyllm_ros.ros.topics, which needs rclpy)."""
    if msgtype == STATUS_TYPE:
        return make_qos(transient_local=True, depth=200)
    if msgtype == METRICS_TYPE:
        return make_qos(reliable=False, depth=5)
    return make_qos(depth=50)
