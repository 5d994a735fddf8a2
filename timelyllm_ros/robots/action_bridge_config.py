"""The action bridge's skill map (config/action_bridge/example.yaml): YAML -> checked bindings.

Every mistake is found when the map is loaded, and reported as a ValueError naming the skill
and the field: an unknown interface type, a template key the goal has no field for, a literal
that does not fit its field, a placeholder other than `$1`, `$2`, ..., a result path the result
has no field for. At run time `goal_for(args)` fills the template with a call's arguments,
each converted to its field's type (action_bridge_fields.py).

No rclpy here: only the generated message classes (`pkg/action/Name`, `pkg/srv/Name`,
`pkg/msg/Name`, importable from the ROS 2 environment).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from timelyllm_ros.core.skills.minispec_skills import SKILLS, SkillSpec
from timelyllm_ros.core.skills.values import Value
from timelyllm_ros.robots.action_bridge_fields import (FieldError, check_path, fill,
                                                       parse_path, placeholders)

KINDS = {"action": "action", "service": "srv", "topic": "msg"}
STATUSES = {"succeeded": 4, "canceled": 5, "cancelled": 5, "aborted": 6}
_SKILL_KEYS = {"action", "service", "topic", "type", "goal", "timeout_s", "server_timeout_s",
               "success", "returns", "abbrev", "args"}
_TOP_KEYS = {"node_name", "namespace", "defaults", "skills", "safe_stop_skill"}


_Bad = FieldError     # an error the loader prefixes with the skill's name


@dataclass(frozen=True)
class SkillBinding:
    skill: str                       # full skill name, as the interpreter calls it
    kind: str                        # action | service | topic
    interface: str                   # the action / service / topic name
    type_name: str                   # e.g. example_interfaces/action/Fibonacci
    type: Any                        # the generated class
    goal: Mapping[str, Any]          # the template
    arity: int
    timeout_s: float
    server_timeout_s: float
    statuses: tuple[int, ...] = (4,)
    equals: Mapping[tuple, Any] = field(default_factory=dict)   # result path -> value
    returns: tuple | None = None
    returns_text: str = ""

    def request_class(self):
        return {"action": lambda t: t.Goal, "service": lambda t: t.Request,
                "topic": lambda t: t}[self.kind](self.type)

    def result_class(self):
        return {"action": lambda t: t.Result, "service": lambda t: t.Response,
                "topic": lambda t: None}[self.kind](self.type)

    def goal_for(self, args: tuple[Value, ...]):
        """The goal / request / message with the arguments filled in; raises ValueError."""
        if len(args) != self.arity:
            raise ValueError(f"takes {self.arity} argument(s), got {len(args)}")
        msg = self.request_class()()
        fill(msg, self.goal, args, "goal")
        return msg


@dataclass(frozen=True)
class SkillMap:
    skills: Mapping[str, SkillBinding]
    specs: Mapping[str, SkillSpec]       # the MiniSpec skill table (drone skills + new ones)
    node_name: str = "timelyllm_action_bridge"
    namespace: str = ""
    safe_stop_skill: str | None = None


def import_type(type_name: str, kind: str):
    parts = str(type_name).split("/")
    want = KINDS[kind]
    if len(parts) != 3 or not all(parts):
        raise _Bad(f"{type_name!r} is not a type name like pkg/{want}/Name")
    if parts[1] != want:
        raise _Bad(f"{type_name!r}: a {kind} needs a pkg/{want}/Name type")
    try:
        module = importlib.import_module(f"{parts[0]}.{parts[1]}")
        cls = getattr(module, parts[2])
    except (ImportError, AttributeError) as err:
        raise _Bad(f"unknown type {type_name!r} ({type(err).__name__}: {err}); is its "
                   "package installed and the ROS environment sourced?") from None
    return cls


def _number(raw: Mapping, key: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise _Bad(f"{key}: must be a number of seconds > 0, got {value!r}")
    return float(value)


def _binding(name: str, raw: Any, defaults: Mapping) -> tuple[SkillBinding, SkillSpec]:
    if not isinstance(raw, Mapping):
        raise _Bad(f"must be a mapping (action/service/topic, type, goal, ...), got {raw!r}")
    unknown = sorted(set(raw) - _SKILL_KEYS)
    if unknown:
        raise _Bad(f"{unknown[0]}: unknown field (known: {', '.join(sorted(_SKILL_KEYS))})")
    kinds = [k for k in KINDS if k in raw]
    if len(kinds) != 1:
        raise _Bad("action / service / topic: give exactly one, the interface's name")
    kind = kinds[0]
    interface = raw[kind]
    if not isinstance(interface, str) or not interface.strip():
        raise _Bad(f"{kind}: must be the interface's name, got {interface!r}")
    if "type" not in raw:
        raise _Bad(f"type: missing (e.g. pkg/{KINDS[kind]}/Name)")
    try:
        cls = import_type(raw["type"], kind)
    except _Bad as err:
        raise _Bad(f"type: {err}") from None

    spec = SKILLS.get(name) or next((s for s in SKILLS.values() if s.name == name), None)
    if spec is not None and spec.high_level:
        raise _Bad(f"{spec.name} is a high-level skill, defined in MiniSpec "
                   f"({spec.definition}); map the low-level skills it calls instead")
    if spec is not None and ("abbrev" in raw or "args" in raw):
        raise _Bad(f"abbrev/args: {spec.name} is a MiniSpec skill ({spec.abbrev}, "
                   f"args {list(spec.args)}); leave them out")
    template = raw.get("goal") or {}
    if not isinstance(template, Mapping):
        raise _Bad(f"goal: must be a mapping of field names, got {template!r}")
    used = placeholders(template)
    if spec is None:
        kinds_ = raw.get("args")
        if kinds_ is None:
            kinds_ = ["text"] * (max(used) if used else 0)
        if not isinstance(kinds_, list) or any(k not in ("int", "obj", "text") for k in kinds_):
            raise _Bad(f"args: a list of int / obj / text, got {kinds_!r}")
        abbrev = str(raw.get("abbrev") or name)
        spec = SkillSpec(abbrev, name, tuple(kinds_))
    if used and max(used) > len(spec.args):
        raise _Bad(f"goal: placeholder ${max(used)} but {spec.name} takes {len(spec.args)} "
                   "argument(s)")
    request = {"action": "Goal", "service": "Request", "topic": None}[kind]
    try:
        fill(cls() if request is None else getattr(cls, request)(), template, None, "goal")
    except _Bad as err:
        raise _Bad(str(err)) from None

    success = raw.get("success") or {}
    if not isinstance(success, Mapping) or set(success) - {"status", "equals"}:
        raise _Bad(f"success: a mapping with `status` and/or `equals`, got {success!r}")
    statuses = success.get("status", "succeeded")
    statuses = statuses if isinstance(statuses, list) else [statuses]
    if any(str(s).lower() not in STATUSES for s in statuses):
        raise _Bad(f"success.status: one or more of SUCCEEDED, ABORTED, CANCELED, got "
                   f"{success.get('status')!r}")
    if "status" in success and kind != "action":
        raise _Bad(f"success.status: only actions have a status; a {kind} succeeds when "
                   "its call completes")
    result_cls = {"action": lambda: cls.Result, "service": lambda: cls.Response,
                  "topic": lambda: None}[kind]()
    equals = success.get("equals") or {}
    if not isinstance(equals, Mapping) or (equals and result_cls is None):
        raise _Bad("success.equals: a mapping of result field paths to values"
                   + (" (a topic has no result)" if result_cls is None else ""))
    checked = {}
    for text, value in equals.items():
        try:
            path = parse_path(text)
            check_path(result_cls, path, text)
        except _Bad as err:
            raise _Bad(f"success.equals: {err}") from None
        checked[path] = value
    returns = raw.get("returns")
    rpath = None
    if returns is not None:
        if result_cls is None:
            raise _Bad("returns: a topic has no result to return")
        try:
            rpath = parse_path(returns)
            check_path(result_cls, rpath, returns)
        except _Bad as err:
            raise _Bad(f"returns: {err}") from None
    try:
        timeout = _number(raw, "timeout_s", defaults.get("timeout_s", 30.0))
        server_timeout = _number(raw, "server_timeout_s", defaults.get("server_timeout_s", 5.0))
    except _Bad as err:
        raise _Bad(str(err)) from None
    binding = SkillBinding(
        skill=spec.name, kind=kind, interface=interface.strip(), type_name=str(raw["type"]),
        type=cls, goal=dict(template), arity=len(spec.args), timeout_s=timeout,
        server_timeout_s=server_timeout,
        statuses=tuple(sorted({STATUSES[str(s).lower()] for s in statuses})), equals=checked,
        returns=rpath, returns_text=str(returns or ""))
    return binding, spec


def load_skill_map(source: str | Path | Mapping) -> SkillMap:
    """A skill map from a YAML path, YAML text or an already parsed mapping; ValueError names
    the skill and the field at fault."""
    if isinstance(source, Mapping):
        raw, origin = source, "skill map"
    else:
        path = Path(source) if not (isinstance(source, str) and "\n" in source) else None
        if path is not None and not path.is_file():
            raise ValueError(f"skill_map: no such file {str(source)!r}")
        text = path.read_text() if path is not None else str(source)
        origin = str(path) if path is not None else "skill map"
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"{origin}: not valid YAML: {err}") from None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("skills"), Mapping) \
            or not raw["skills"]:
        raise ValueError(f"{origin}: skills: missing (a mapping of skill name to binding)")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"{origin}: {unknown[0]}: unknown field (known: "
                         f"{', '.join(sorted(_TOP_KEYS))})")
    defaults = raw.get("defaults") or {}
    bindings: dict[str, SkillBinding] = {}
    specs: dict[str, SkillSpec] = dict(SKILLS)
    for name, body in raw["skills"].items():
        try:
            binding, spec = _binding(str(name), body, defaults)
        except _Bad as err:
            raise ValueError(f"{origin}: skill {name!r}: {err}") from None
        if binding.skill in bindings:
            raise ValueError(f"{origin}: skill {name!r}: {binding.skill} is mapped twice")
        clash = specs.get(spec.abbrev)
        if clash is not None and clash.name != spec.name:
            raise ValueError(f"{origin}: skill {name!r}: abbrev: {spec.abbrev!r} already names "
                             f"{clash.name}")
        bindings[binding.skill] = binding
        specs[spec.abbrev] = spec
    stop_skill = raw.get("safe_stop_skill")
    if stop_skill is not None and (str(stop_skill) not in bindings
                                   or bindings[str(stop_skill)].arity):
        raise ValueError(f"{origin}: safe_stop_skill: {stop_skill!r} is not a mapped skill "
                         "without arguments")
    return SkillMap(bindings, specs, str(raw.get("node_name") or "timelyllm_action_bridge"),
                    str(raw.get("namespace") or ""), stop_skill and str(stop_skill))
