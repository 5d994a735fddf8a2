"""A simulated robot's world: a pose, a camera's field of view, and objects, from YAML.

    # config/scenes/kitchen.yaml
    drone: {x: 0, y: 0, z: 80, heading: 0, fov: 82.6, vfov: 52, range: 800, flying: true}
    objects:
      - {name: bottle, x: 0, y: -300, z: 80, width: 8, height: 25, tags: [drinkable]}
      - {name: apple, x: 250, y: 0, z: 90, width: 8, height: 8, tags: [edible, fruit, red]}
    answers: {"how many people are there?": 2}      # optional: fixed answers to `query`

Units: cm and degrees. The drone's heading 0 faces +y; headings grow clockwise (a `tc,90`
turns from +y to +x), as the Tello's yaw does. An object is visible when it is in front of the
camera, within `range`, and inside the horizontal (`fov`) and vertical (`vfov`) fields of view.
Image coordinates follow TypeFly: x and y in (0, 1) from the left / top edge, width and height
as fractions of the field of view. One file per robot: the executor's `scene` parameter names
it (the same file for two robots gives each its own copy). `describe()` renders what the robot
sees now for the planner's prompt, in TypeFly's `[name x:.. y:.. width:.. height:..]` form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import yaml


@dataclass(frozen=True)
class SceneObject:
    name: str
    x: float
    y: float
    z: float = 0.0
    width: float = 20.0
    height: float = 20.0
    tags: tuple[str, ...] = ()


@dataclass
class Pose:
    x: float = 0.0
    y: float = 0.0
    z: float = 80.0
    heading: float = 0.0
    flying: bool = True

    def forward(self) -> tuple[float, float]:
        r = math.radians(self.heading)
        return math.sin(r), math.cos(r)

    def right(self) -> tuple[float, float]:
        r = math.radians(self.heading)
        return math.cos(r), -math.sin(r)


@dataclass(frozen=True)
class View:
    """Where an object appears in the camera image (TypeFly's units)."""

    visible: bool
    x: float
    y: float
    width: float
    height: float
    distance: float


@dataclass
class Scene:
    pose: Pose = field(default_factory=Pose)
    objects: tuple[SceneObject, ...] = ()
    fov: float = 82.6
    vfov: float = 52.0
    range_cm: float = 800.0
    answers: dict[str, Any] = field(default_factory=dict)

    def copy(self) -> "Scene":
        return replace(self, pose=replace(self.pose), answers=dict(self.answers))

    def find(self, name: str) -> SceneObject | None:
        """An object by name, or the first whose name starts with `name_` (`chair` finds
        `chair_13`, as TypeFly plans name general objects)."""
        for obj in self.objects:
            if obj.name == name:
                return obj
        for obj in self.objects:
            if obj.name.startswith(name + "_"):
                return obj
        return None

    def view(self, obj: SceneObject) -> View:
        p = self.pose
        dx, dy, dz = obj.x - p.x, obj.y - p.y, obj.z - p.z
        fx, fy = p.forward()
        rx, ry = p.right()
        ahead = dx * fx + dy * fy
        side = dx * rx + dy * ry
        dist = math.sqrt(dx * dx + dy * dy + dz * dz)
        if ahead <= 0:
            return View(False, 0.0, 0.0, 0.0, 0.0, dist)
        bearing = math.degrees(math.atan2(side, ahead))
        elevation = math.degrees(math.atan2(dz, math.hypot(ahead, side)))
        visible = (abs(bearing) <= self.fov / 2 and abs(elevation) <= self.vfov / 2
                   and dist <= self.range_cm)
        flat = max(math.hypot(ahead, side), 1e-6)
        width = min(1.0, math.degrees(2 * math.atan(obj.width / 2 / flat)) / self.fov)
        height = min(1.0, math.degrees(2 * math.atan(obj.height / 2 / flat)) / self.vfov)
        return View(visible, 0.5 + bearing / self.fov, 0.5 - elevation / self.vfov,
                     width, height, dist)

    def visible_objects(self) -> list[tuple[SceneObject, View]]:
        seen = [(o, self.view(o)) for o in self.objects]
        return sorted(((o, v) for o, v in seen if v.visible), key=lambda ov: abs(ov[1].x - 0.5))

    def describe(self) -> str:
        parts = [f"{o.name} x:{v.x:.2f} y:{v.y:.2f} width:{v.width:.2f} height:{v.height:.2f}"
                 for o, v in self.visible_objects()]
        return "[" + ", ".join(parts) + "]"


class SceneError(ValueError):
    """A scene file that cannot be used; names the file and the key."""


def _num(source: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SceneError(f"{source}: {key}: must be a finite number, got {value!r}")
    return float(value)


def scene_from_mapping(data: Any, source: str = "<memory>") -> Scene:
    if not isinstance(data, Mapping):
        raise SceneError(f"{source}: must be a mapping with 'drone' and 'objects'")
    unknown = set(data) - {"drone", "objects", "answers"}
    if unknown:
        raise SceneError(f"{source}: {sorted(unknown)[0]}: unknown key")
    drone = data.get("drone") or {}
    if not isinstance(drone, Mapping):
        raise SceneError(f"{source}: drone: must be a mapping")
    pose_keys = {"x", "y", "z", "heading"}
    view_keys = {"fov": "fov", "vfov": "vfov", "range": "range_cm"}
    for key in drone:
        if key not in pose_keys | set(view_keys) | {"flying"}:
            raise SceneError(f"{source}: drone.{key}: unknown key")
    pose = Pose(**{k: _num(source, f"drone.{k}", drone[k]) for k in pose_keys if k in drone},
                flying=bool(drone.get("flying", True)))
    view = {attr: _num(source, f"drone.{k}", drone[k]) for k, attr in view_keys.items()
            if k in drone}
    objects = []
    for i, item in enumerate(data.get("objects") or []):
        where = f"objects[{i}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise SceneError(f"{source}: {where}: must be a mapping with a 'name'")
        extra = set(item) - {"name", "x", "y", "z", "width", "height", "tags"}
        if extra:
            raise SceneError(f"{source}: {where}.{sorted(extra)[0]}: unknown key")
        nums = {k: _num(source, f"{where}.{k}", item[k])
                for k in ("x", "y", "z", "width", "height") if k in item}
        if "x" not in nums or "y" not in nums:
            raise SceneError(f"{source}: {where}: needs x and y")
        objects.append(SceneObject(item["name"], tags=tuple(str(t) for t in item.get("tags", ())),
                                   **nums))
    answers = data.get("answers") or {}
    if not isinstance(answers, Mapping):
        raise SceneError(f"{source}: answers: must be a mapping of question -> answer")
    return Scene(pose=pose, objects=tuple(objects), answers=dict(answers), **view)


def load_scene(path: str | Path) -> Scene:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise SceneError(f"{p}: {err}") from None
    return scene_from_mapping(data, str(p))
