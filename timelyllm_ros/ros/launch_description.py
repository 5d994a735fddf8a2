"""Node-set descriptions (launch/*.nodes.yaml), shared by ROS 2 launch files and `timelyllm launch`.

ROS 2's `launch` and `launch_ros` exist only in a ROS distribution, not as wheels, so the set of
nodes is described in YAML once: a launch file turns it into `launch_ros.actions.Node`s, and the
pip-only runner turns it into processes with the same names, namespaces and parameters.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

_NODE_KEYS = {"name", "module", "executable", "namespace", "parameters_file", "parameters",
              "lifecycle"}


class LaunchDescriptionError(ValueError):
    pass


@dataclass
class NodeSpec:
    name: str
    module: str
    executable: str
    namespace: str = ""
    parameters_file: Path | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    # A managed node: the runner drives it to active (configure, then activate).
    lifecycle: bool = False

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @property
    def fqn(self) -> str:
        """The node's fully qualified name, e.g. /planner or /drone_1/executor."""
        return f"/{self.namespace.strip('/')}/{self.name}" if self.namespace else f"/{self.name}"

    def ros_args(self) -> list[str]:
        args = ["--ros-args", "-r", f"__node:={self.name}"]
        if self.namespace:
            args += ["-r", f"__ns:=/{self.namespace.strip('/')}"]
        if self.parameters_file is not None:
            args += ["--params-file", str(self.parameters_file)]
        for key, value in self.parameters.items():
            args += ["-p", f"{key}:={_param_literal(value)}"]
        return args


def _param_literal(value: Any) -> str:
    # rcl parses -p values as YAML; flow style keeps lists on one argument.
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def load_description(path: str | Path, root: str | Path | None = None) -> list[NodeSpec]:
    path = Path(path)
    root = Path(root) if root is not None else path.resolve().parent.parent
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise LaunchDescriptionError(f"{path}: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise LaunchDescriptionError(f"{path}: expected a mapping with a 'nodes' list")
    specs = []
    for i, entry in enumerate(data["nodes"]):
        where = f"{path}: nodes[{i}]"
        if not isinstance(entry, dict):
            raise LaunchDescriptionError(f"{where}: expected a mapping")
        unknown = sorted(set(entry) - _NODE_KEYS)
        if unknown:
            raise LaunchDescriptionError(f"{where}: unknown key {unknown[0]!r}")
        for key in ("name", "module", "executable"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise LaunchDescriptionError(f"{where}: {key!r} must be a non-empty string")
        params = entry.get("parameters") or {}
        if not isinstance(params, dict):
            raise LaunchDescriptionError(f"{where}: 'parameters' must be a mapping")
        for name in params:
            # rclpy ignores a parameter its node never declares: a typo here would run the
            # node on its default without a word.
            problem = parameter_problem(entry["module"], str(name))
            if problem:
                raise LaunchDescriptionError(f"{where} ({entry['name']}): parameters: {problem}")
        if not isinstance(entry.get("lifecycle", False), bool):
            raise LaunchDescriptionError(f"{where}: 'lifecycle' must be true or false")
        params_file = entry.get("parameters_file")
        specs.append(NodeSpec(
            name=entry["name"], module=entry["module"], executable=entry["executable"],
            namespace=str(entry.get("namespace") or ""),
            parameters_file=(root / params_file) if params_file else None,
            parameters=dict(params), lifecycle=entry.get("lifecycle", False)))
    return specs


def apply_overrides(specs: list[NodeSpec], overrides: list[str]) -> None:
    """Apply `--set NODE.PARAM=VALUE` items (VALUE read as YAML).

    NODE is a NodeSpec.label (`planner`, `drone_1/executor`); ROS names cannot contain dots, so
    the node ends at the first dot and everything after it is the parameter, dots included
    (`planner.engine.kind=sim`). A parameter the node's module does not declare is an error
    naming the ones it does (LaunchDescriptionError)."""
    by_label = {s.label: s for s in specs}
    for item in overrides:
        target, sep, value = item.partition("=")
        label, dot, param = target.partition(".")
        label = label.strip("/")
        if not sep or not dot or not label or not param:
            raise LaunchDescriptionError(
                f"--set {item!r}: expected NODE.PARAM=VALUE with NODE in {sorted(by_label)} "
                "(the parameter may contain dots: planner.engine.kind=sim)")
        spec = by_label.get(label)
        if spec is None:
            raise LaunchDescriptionError(
                f"--set {item!r}: no node {label!r} in this description; nodes: "
                f"{', '.join(sorted(by_label))}")
        problem = parameter_problem(spec.module, param)
        if problem:
            raise LaunchDescriptionError(f"--set {item!r}: node {label}: {problem}")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise LaunchDescriptionError(f"--set {item!r}: VALUE is not valid YAML: "
                                         f"{str(err).splitlines()[0]}") from None
        if parsed is None:
            # `-p name:=null` would leave the parameter unset, not empty.
            raise LaunchDescriptionError(f"--set {item!r}: VALUE is empty; write '' for an "
                                         "empty string")
        spec.parameters[param] = parsed


# rclpy declares these on every node, whatever the node's own code declares.
ROS_NODE_PARAMETERS = ("use_sim_time", "start_type_description_service")
# Node modules whose parameter table lives in another module (default: the node's module).
_PARAMETER_TABLES = {"timelyllm_ros.ros.planner_node": "timelyllm_ros.ros.planner_params"}


@functools.lru_cache(maxsize=None)
def known_parameters(module: str) -> tuple[str, ...] | None:
    """The parameters a node started as `python -m MODULE` can be given: the `PARAMETER_NAMES`
    table its module keeps (the planner's: planner_params.py) plus rclpy's own. Importing the
    module starts no ROS. None when the module has no table (a node of someone else's package):
    its parameters are then not checked. A module that exists but fails to import is a
    LaunchDescriptionError (its node could not start either)."""
    source = _PARAMETER_TABLES.get(module, module)
    try:
        table = getattr(importlib.import_module(source), "PARAMETER_NAMES", None)
    except ModuleNotFoundError as err:
        if err.name is not None and (source + ".").startswith(err.name + "."):
            return None   # not installed here: starting the node reports it
        raise LaunchDescriptionError(f"node module {module}: {err}") from None
    except Exception as err:  # noqa: BLE001 - any import failure, reported with the module
        raise LaunchDescriptionError(f"node module {module}: cannot import: {err}") from None
    if table is None:
        return None
    return tuple(dict.fromkeys([*table, *ROS_NODE_PARAMETERS]))


def parameter_problem(module: str, name: str) -> str | None:
    """Why node module `module` cannot take parameter `name`, or None when it can (or cannot be
    checked)."""
    known = known_parameters(module)
    if known is None or name in known:
        return None
    return unknown_parameter_message(name, known)


def unknown_parameter_message(name: str, known: Iterable[str]) -> str:
    """`unknown parameter 'polcy' (did you mean 'policy'?); known: ...`."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown parameter {name!r}{hint}; known: {', '.join(known)}"
