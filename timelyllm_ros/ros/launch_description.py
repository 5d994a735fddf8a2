"""Node-set descriptions (launch/*.nodes.yaml), shared by ROS 2 launch files and `timelyllm launch`.

ROS 2's `launch` and `launch_ros` exist only in a ROS distribution, not as wheels, so the set of
nodes is described in YAML once: a launch file turns it into `launch_ros.actions.Node`s, and the
pip-only runner turns it into processes with the same names, namespaces and parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    """`label.param=value` (label as in NodeSpec.label, e.g. `planner` or `drone_1/executor`)."""
    by_label = {s.label: s for s in specs}
    for item in overrides:
        target, sep, value = item.partition("=")
        label, dot, param = target.rpartition(".")
        if not sep or not dot or label not in by_label:
            raise LaunchDescriptionError(
                f"--set {item!r}: expected NODE.PARAM=VALUE with NODE in {sorted(by_label)}")
        by_label[label].parameters[param] = yaml.safe_load(value)
