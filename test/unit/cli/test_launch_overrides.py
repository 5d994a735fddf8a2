"""`timelyllm launch ... --set NODE.PARAM=VALUE` and the parameters of a node-set description:
dotted parameter names reach the node, a parameter the node does not declare is an error naming
the ones it does, and each node module's table of names matches what its code declares."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

pytest.importorskip("rclpy")   # the node modules' tables are read by importing them

from timelyllm_ros.cli import main as top_cli  # noqa: E402
from timelyllm_ros.ros import launch_description as ld  # noqa: E402
from timelyllm_ros.ros_env import REPO_ROOT  # noqa: E402

DEMO = REPO_ROOT / "launch" / "demo.nodes.yaml"
NODE_MODULES = sorted(p.stem for p in (REPO_ROOT / "timelyllm_ros" / "ros").glob("*_node.py"))


def _by_label(specs):
    return {s.label: s for s in specs}


def test_dotted_parameters_and_namespaced_labels_are_set():
    specs = ld.load_description(DEMO)
    ld.apply_overrides(specs, ["planner.engine.kind=sim", "planner.engine.max_num_seqs=8",
                               "drone_1/executor.time_scale=0.5", "/drone_2/executor.seed=7",
                               "planner.robots=[drone_1:drone]", "status_recorder.output=''"])
    nodes = _by_label(specs)
    assert nodes["planner"].parameters == {"engine.kind": "sim", "engine.max_num_seqs": 8,
                                           "robots": ["drone_1:drone"]}
    assert nodes["drone_1/executor"].parameters["time_scale"] == 0.5
    assert nodes["drone_2/executor"].parameters["seed"] == 7
    assert nodes["status_recorder"].parameters["output"] == ""
    # ... and reach the process's command line whole.
    args = nodes["planner"].ros_args()
    assert "engine.kind:=sim" in args and "engine.max_num_seqs:=8" in args


@pytest.mark.parametrize("item, expected", [
    ("planner.polcy=edf-seg", "node planner: unknown parameter 'polcy' (did you mean 'policy'?)"),
    ("planner.engine.knd=sim", "unknown parameter 'engine.knd' (did you mean 'engine.kind'?)"),
    ("drone_1/executor.time_scal=1", "unknown parameter 'time_scal' (did you mean 'time_scale'?)"),
    ("status_recorder.outptu=x", "unknown parameter 'outptu' (did you mean 'output'?)"),
    ("planner.zzz=1", "unknown parameter 'zzz'; known: "),
])
def test_an_unknown_parameter_is_an_error_naming_the_known_ones(item, expected):
    specs = ld.load_description(DEMO)
    with pytest.raises(ld.LaunchDescriptionError) as err:
        ld.apply_overrides(specs, [item])
    message = str(err.value)
    assert message.startswith(f"--set {item!r}: ") and expected in message, message
    label, param = item.split("=")[0].split(".", 1)
    spec = _by_label(specs)[label]
    assert set(message.split("; known: ")[1].split(", ")) == set(ld.known_parameters(spec.module))
    assert param not in spec.parameters


@pytest.mark.parametrize("item, expected", [
    ("rover.policy=x", "no node 'rover' in this description; nodes: drone_1/executor, "
                       "drone_2/executor, planner, status_recorder"),
    ("planner=edf-seg", "expected NODE.PARAM=VALUE"),
    ("planner.policy", "expected NODE.PARAM=VALUE"),
    ("planner.policy=", "VALUE is empty"),
    ("planner.robots=[a", "VALUE is not valid YAML"),
])
def test_malformed_overrides_say_what_is_wrong(item, expected):
    with pytest.raises(ld.LaunchDescriptionError, match="^--set ") as err:
        ld.apply_overrides(ld.load_description(DEMO), [item])
    assert expected in str(err.value), err.value


def test_launch_command_refuses_a_typo_before_starting_anything(capsys):
    assert top_cli.main(["launch", str(DEMO), "--set", "planner.polcy=edf-seg"]) == 2
    err = capsys.readouterr().err
    assert "timelyllm launch: --set 'planner.polcy=edf-seg'" in err
    assert "did you mean 'policy'?" in err and "engine.kind" in err


def test_a_description_naming_an_unknown_parameter_is_refused(tmp_path):
    bad = tmp_path / "bad.nodes.yaml"
    bad.write_text("nodes:\n  - {name: executor, namespace: drone_1, module: "
                   "timelyllm_ros.ros.executor_node, executable: x,\n"
                   "     parameters: {robot_id: drone_1, time_scael: 0.5}}\n")
    with pytest.raises(ld.LaunchDescriptionError, match=r"nodes\[0\] \(executor\): parameters: "
                       r"unknown parameter 'time_scael' \(did you mean 'time_scale'\?\)"):
        ld.load_description(bad)


def test_a_module_without_a_table_is_not_checked():
    # A node of another package: nothing to check against, so the value goes through.
    assert ld.known_parameters("timelyllm_ros.ros.topics") is None
    assert ld.known_parameters("no_such_package.node") is None
    spec = ld.NodeSpec(name="theirs", module="timelyllm_ros.ros.topics", executable="x")
    ld.apply_overrides([spec], ["theirs.any.thing=3"])
    assert spec.parameters == {"any.thing": 3}


def test_a_node_module_that_fails_to_import_is_reported(tmp_path, monkeypatch):
    (tmp_path / "broken_node_for_test.py").write_text("import no_such_dependency_xyz\n")
    (tmp_path / "table_node_for_test.py").write_text("PARAMETER_NAMES = ('rate',)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = ld.NodeSpec(name="broken", module="broken_node_for_test", executable="x")
    with pytest.raises(ld.LaunchDescriptionError,
                       match="node module broken_node_for_test: No module named "
                             "'no_such_dependency_xyz'"):
        ld.apply_overrides([spec], ["broken.rate=1"])
    # Someone else's node module with a table of its own is checked like ours.
    spec = ld.NodeSpec(name="theirs", module="table_node_for_test", executable="x")
    ld.apply_overrides([spec], ["theirs.rate=2"])
    with pytest.raises(ld.LaunchDescriptionError, match="did you mean 'rate'"):
        ld.apply_overrides([spec], ["theirs.rat=2"])


def _literal_declarations(path: Path) -> set[str]:
    """Names passed as a literal to `declare_parameter(...)` in a module's source, and the
    robot nodes' `planner_lost_after_s` (declared by planner_liveness.declare_lost_after)."""
    from timelyllm_ros.ros import planner_liveness

    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "declare_parameter" and node.args
                and isinstance(node.args[0], ast.Constant)):
            names.add(node.args[0].value)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "declare_lost_after"):
            names.add(planner_liveness.PARAMETER)
    return names


@pytest.mark.parametrize("module", NODE_MODULES)
def test_every_node_module_has_a_table_of_what_it_declares(module):
    """A name missing from a table would make `--set` refuse a real parameter; every branch
    (an executor's backend-specific parameters) counts, so the source is read, not a node."""
    name = f"timelyllm_ros.ros.{module}"
    known = ld.known_parameters(name)
    assert known is not None, f"{name} has no PARAMETER_NAMES table"
    declared = _literal_declarations(REPO_ROOT / "timelyllm_ros" / "ros" / f"{module}.py")
    if module == "planner_node":   # declared from planner_params' tables in a loop
        params = importlib.import_module("timelyllm_ros.ros.planner_params")
        declared = {*params.PARAMETERS, *params.ENGINE_PARAMS}
    assert declared, name
    assert set(known) == declared | set(ld.ROS_NODE_PARAMETERS)
