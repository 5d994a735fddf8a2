"""ArmBackend dispatch to an ArmDriver, and the simulated arm's modelled timings."""

from __future__ import annotations

import threading
import time

import pytest

from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.skills.arm import ARM
from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.robots.factory import make_backend
from timelyllm_ros.robots.arm import ArmBackend, ArmDriver, ArmError, SimulatedArmDriver


class Recorder(ArmDriver):
    def __init__(self, check_result=True, fail_on=None):
        self.calls = []
        self.check_result = check_result
        self.fail_on = fail_on

    def _rec(self, *call):
        self.calls.append(call)
        if self.fail_on == call[0]:
            raise ArmError(f"{call[0]} failed: gripper jammed")

    def pick(self, obj):
        self._rec("pick", obj)

    def place(self, obj, target):
        self._rec("place", obj, target)

    def move(self, x, y, z):
        self._rec("move", x, y, z)

    def check(self, obj):
        self._rec("check", obj)
        return self.check_result


def C(name, *args):
    return SkillCall(name, tuple(str(a) for a in args))


def test_driver_interface_is_abstract():
    with pytest.raises(TypeError):
        ArmDriver()
    with pytest.raises(TypeError, match="ArmDriver"):
        ArmBackend(object())


def test_calls_are_dispatched_in_order_with_typed_arguments():
    driver = Recorder()
    parsed = ARM.parse("pick(red_block)->place(red_block, 'blue block')->move(10, -5.5, 20)->"
                       "check(red_block)").calls
    ok, msg = ArmBackend(driver).execute(parsed)
    assert ok, msg
    assert driver.calls == [("pick", "red_block"), ("place", "red_block", "blue block"),
                            ("move", 10.0, -5.5, 20.0), ("check", "red_block")]
    assert "check(red_block)=True" in msg


@pytest.mark.parametrize("calls, fragment", [
    ([C("pick", "a"), C("wave")], "unknown arm skill 'wave'"),
    ([C("pick", "a"), C("place", "a")], "takes 2 argument(s), got 1"),
    ([C("pick", "a"), C("move", 1, "_x", 3)], "'_x' is not a number"),
    ([C("move", 1, "nan", 3)], "not finite"),
])
def test_invalid_segments_fail_before_anything_moves(calls, fragment):
    driver = Recorder()
    ok, msg = ArmBackend(driver).execute(calls)
    assert not ok and fragment in msg and "nothing executed" in msg
    assert driver.calls == []


def test_driver_errors_and_failed_checks_become_failures():
    driver = Recorder(fail_on="place")
    ok, msg = ArmBackend(driver).execute([C("pick", "a"), C("place", "a", "b"), C("check", "a")])
    assert not ok and "place(a,b): place failed: gripper jammed" in msg and "after 1 of 3" in msg
    assert [c[0] for c in driver.calls] == ["pick", "place"]

    ok, msg = ArmBackend(Recorder(check_result=False)).execute([C("check", "a"), C("pick", "a")])
    assert not ok and "check(a) returned False" in msg
    ok, msg = ArmBackend(Recorder(check_result=False), fail_on_check=False).execute([C("check", "a")])
    assert ok and "check(a)=False" in msg


def test_simulated_driver_timings_come_from_the_model():
    model = ExecutionTimeModel.from_yaml()
    driver = SimulatedArmDriver(model, time_scale=0.01, jitter=False)
    for name, args, nominal in [("pick", ("a",), 4.0), ("place", ("a", "b"), 4.0),
                                ("move", ("1", "2", "3"), 2.0), ("check", ("a",), 1.0)]:
        assert model.model_for(name).nominal(args) == pytest.approx(nominal)
        assert driver.duration(name, args) == pytest.approx(nominal * 0.01)
    jittery = SimulatedArmDriver(model, time_scale=1.0, seed=3)
    samples = [jittery.duration("pick", ("a",)) for _ in range(200)]
    assert len(set(samples)) > 1 and 3.0 < sorted(samples)[100] < 5.3   # median ~4 s


def test_simulated_arm_executes_a_plan_in_modelled_time():
    driver = SimulatedArmDriver(time_scale=0.02, jitter=False)
    backend = ArmBackend(driver)
    plan = ARM.parse("pick(red)->place(red, blue)->check(red)->move(0, 0, 10)").calls
    t0 = time.monotonic()
    ok, msg = backend.execute(plan)
    took = time.monotonic() - t0
    assert ok, msg
    expected = (4.0 + 4.0 + 1.0 + 2.0) * 0.02
    assert 0.95 * expected <= took < expected + 1.0
    assert driver.locations == {"red": "blue"} and driver.held is None
    assert driver.position == (0.0, 0.0, 10.0)
    assert [c[0] for c in driver.calls] == ["pick", "place", "check", "move"]


def test_simulated_arm_rejects_impossible_plans():
    backend = ArmBackend(SimulatedArmDriver(time_scale=0.001, jitter=False, unreachable={"far"}))
    ok, msg = backend.execute([C("place", "red", "blue")])
    assert not ok and "not holding 'red'" in msg
    ok, msg = backend.execute([C("pick", "red"), C("pick", "green")])
    assert not ok and "already holds 'red'" in msg
    ok, msg = backend.execute([C("place", "red", "table"), C("pick", "far")])
    assert not ok and "cannot reach 'far'" in msg
    lenient = ArmBackend(SimulatedArmDriver(time_scale=0.001, jitter=False, strict=False))
    assert lenient.execute([C("place", "red", "blue")])[0]


def test_stop_interrupts_the_simulated_arm():
    stop = threading.Event()
    backend = make_backend("arm-sim", time_scale=1.0, stop=stop, jitter=False)
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    ok, msg = backend.execute([C("pick", "a"), C("place", "a", "b")])
    assert not ok and "shutting down" in msg
    assert time.monotonic() - t0 < 2.0


def test_make_backend_arm_sim():
    backend = make_backend("arm-sim", time_scale=0.001, seed=1)
    assert isinstance(backend, ArmBackend) and isinstance(backend.driver, SimulatedArmDriver)
    assert backend.execute([C("pick", "a"), C("place", "a", "b")])[0]
    with pytest.raises(ValueError, match="time_scale"):
        make_backend("arm-sim", time_scale=0)
    with pytest.raises(ValueError, match="arm-sim"):
        make_backend("arm-sim", wrist="left")
