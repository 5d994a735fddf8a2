"""Robot backends found through the `timelyllm_ros.robots` entry-point group
(robots/factory.py), and the arm's interpreted plans with its scene."""

from __future__ import annotations

from importlib import metadata

import pytest

from timelyllm_ros.core.skills.arm import ARM
from timelyllm_ros.core.skills.interpreter import TaskInterpreter
from timelyllm_ros.robots import factory
from timelyllm_ros.robots.factory import known_kinds, make_backend


class ToyBackend:
    def __init__(self, **params):
        self.params = params

    def execute(self, calls):
        return True, f"toy: {len(calls)} call(s)"


def build_toy(**params):
    return ToyBackend(**params)


def test_builtin_kinds_are_registered_as_entry_points():
    installed = {ep.name for ep in metadata.entry_points(group=factory.ENTRY_POINT_GROUP)}
    assert set(factory.BUILTIN_KINDS) <= installed
    for ep in metadata.entry_points(group=factory.ENTRY_POINT_GROUP):
        if ep.name in factory.BUILTIN_KINDS:
            assert ep.load() is factory.builder_for(ep.name)


def test_a_plugin_kind_is_found_through_its_entry_point(monkeypatch):
    ep = metadata.EntryPoint("toy", f"{__name__}:build_toy", factory.ENTRY_POINT_GROUP)
    broken = metadata.EntryPoint("broken", "no_such_module_xyz:build", factory.ENTRY_POINT_GROUP)
    monkeypatch.setattr(factory, "_entry_points", lambda: {"toy": ep, "broken": broken})
    assert "toy" in known_kinds()
    backend = make_backend("toy", colour="red", time_scale=0.5)
    assert isinstance(backend, ToyBackend)
    assert backend.params == {"colour": "red", "time_scale": 0.5}
    with pytest.raises(ValueError, match="broken.*does not load"):
        make_backend("broken")
    with pytest.raises(ValueError, match="unknown kind 'nope'.*toy"):
        make_backend("nope")


def test_arm_plans_run_interpreted_against_the_arms_scene():
    arm = make_backend("arm-sim", time_scale=1e-6, jitter=False,
                       objects=["red_block", "blue_block"])
    interp = TaskInterpreter(ARM, arm.runtime)
    for segment in ("pick(red_block)->", "place(red_block,blue_block)->",
                    "check(red_block)->"):
        out = interp.run_segment(segment)
        assert out.success, out.message
    assert out.calls_executed[0].value is True
    assert arm.driver.locations == {"red_block": "blue_block"}
    assert out.duration_s == pytest.approx(1.0)         # check: 1.0 simulated seconds
    out = interp.run_segment("pick(green_block)->place(green_block,blue_block)")
    assert not out.success
    assert out.message.startswith("statement `pick(green_block)`: no object 'green_block'")
    assert out.failed_statement == "pick(green_block)"
    # A check that finds nothing fails the segment, the arm is stopped.
    out = interp.run_segment("pick(blue_block)->check(blue_block)")
    assert not out.success and "check(blue_block) returned False" in out.message
