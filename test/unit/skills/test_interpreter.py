"""The MiniSpec interpreter (core/skills/interpreter.py) on a scripted fake robot: control flow,
variables across segments, high-level skills, returns, bad input, and a hypothesis fuzz."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from minispec_strategies import programs

from timelyllm_ros.core.skills.arm import ARM
from timelyllm_ros.core.skills.interpreter import (InterpreterLimits, SkillFailure,
                                                   TaskInterpreter)
from timelyllm_ros.core.skills.minispec import MINISPEC
from timelyllm_ros.core.skills.minispec_ast import to_text
from timelyllm_ros.core.skills.values import UNKNOWN, compare


class FakeRobot:
    """Returns scripted values per skill (a list is consumed call by call), 1 s per call."""

    def __init__(self, script=None, fail=None):
        self.script = {k: list(v) if isinstance(v, list) else v for k, v in (script or {}).items()}
        self.fail = fail or {}
        self.calls = []
        self.clock = 0.0
        self.stops = 0

    def now(self):
        return self.clock

    def safe_stop(self):
        self.stops += 1

    def call(self, name, args):
        self.calls.append((name, args))
        self.clock += 1.0
        if name in self.fail:
            raise SkillFailure(self.fail[name])
        v = self.script.get(name)
        if isinstance(v, list):
            return v.pop(0) if v else False
        return v


def names(robot):
    return [n for n, _ in robot.calls]


def test_loop_repeats_its_body():
    robot = FakeRobot()
    out = TaskInterpreter(MINISPEC, robot).run_segment("3{mf,50;tc,90}")
    assert out.success and not out.ended_by_return
    assert names(robot) == ["move_forward", "turn_cw"] * 3
    assert out.duration_s == 6.0 and len(out.calls_executed) == 6


def test_conditional_compares_returned_values():
    robot = FakeRobot({"is_visible": [True, False], "object_x": 0.7})
    interp = TaskInterpreter(MINISPEC, robot)
    assert interp.run_segment("_1=iv,cup;?_1==True{mf,50}").success
    assert names(robot) == ["is_visible", "move_forward"]
    robot.calls.clear()
    interp.run_segment("_1=iv,cup;?_1==True{mf,50};_2=ox,cup;?_2>0.6&_1==False{tc,15}")
    assert names(robot) == ["is_visible", "object_x", "turn_cw"]


def test_variables_survive_across_segments_of_one_task():
    robot = FakeRobot({"is_visible": True})
    interp = TaskInterpreter(MINISPEC, robot)
    first = interp.run_segment("_1=iv,bottle;")
    assert first.values == {"_1": True}
    second = interp.run_segment("?_1==True{a}")
    assert second.success
    assert names(robot) == ["is_visible", "move_forward"]     # approach = mf,120
    assert robot.calls[-1] == ("move_forward", (120,))
    other_task = TaskInterpreter(MINISPEC, robot).run_segment("?_1==True{a}")
    assert not other_task.success and "read before it is set" in other_task.message


def test_high_level_skill_expands_its_definition_until_the_object_shows():
    robot = FakeRobot({"is_visible": [False, False, True]})
    out = TaskInterpreter(MINISPEC, robot).run_segment("_1=s,bottle")
    assert names(robot) == ["is_visible", "turn_cw"] * 2 + ["is_visible"]
    assert out.values["_1"] is True
    top = out.calls_executed[0]
    assert (top.name, top.depth, top.value) == ("sweeping", 0, True)
    assert all(c.depth == 1 for c in out.calls_executed[1:])


def test_sweep_gives_up_after_eight_turns():
    robot = FakeRobot({"is_visible": False})
    out = TaskInterpreter(MINISPEC, robot).run_segment("_1=s,bottle;?_1==False{l,'none'}")
    assert names(robot).count("turn_cw") == 8 and names(robot)[-1] == "log"
    assert out.values["_1"] is False


def test_return_ends_the_plan_and_later_segments_do_not_run():
    robot = FakeRobot({"query": ["apple"]})
    interp = TaskInterpreter(MINISPEC, robot)
    out = interp.run_segment("8{_1=q,'what's the edible target?';?_1!=False{->l,'Yes'}tc,45}")
    assert out.ended_by_return and out.success and out.plan_ended
    assert names(robot) == ["query", "log"]
    assert robot.calls[-1] == ("log", ("Yes",))
    later = interp.run_segment("mf,50;")
    assert later.ended_by_return and later.calls_executed == ()
    assert names(robot) == ["query", "log"]


@pytest.mark.parametrize(("segment", "fragment", "statement"), [
    ("mf,5;zz,3", "unknown skill abbreviation 'zz'", "zz,3"),
    ("mf,50 tc", "does not parse", "mf,50 tc"),
    ("500{tc,1}", "loop count 500 over the maximum 100", "500{...}"),
    ("l,_4", "variable _4 read before it is set", "l,_4"),
    ("?_2>1{p}", "variable _2 read before it is set", "?_2>1{...}"),
    ("_1=q,'x';?_1<0.5{p}", "cannot compare", "?_1<0.5{...}"),
])
def test_bad_input_fails_the_segment_naming_statement_and_cause(segment, fragment, statement):
    robot = FakeRobot({"query": "some text"})
    out = TaskInterpreter(MINISPEC, robot).run_segment(segment)
    assert not out.success and out.plan_ended
    assert fragment in out.message
    assert f"`{statement}" in out.message


def test_failures_after_motion_make_the_robot_safe():
    robot = FakeRobot(fail={"turn_cw": "motor error"})
    out = TaskInterpreter(MINISPEC, robot).run_segment("mf,50;tc,90;mf,50")
    assert not out.success and out.message == "statement `tc,90`: motor error"
    assert names(robot) == ["move_forward", "turn_cw"] and robot.stops == 1


def test_literal_arguments_are_checked_before_anything_moves():
    class Ranged(FakeRobot):
        def check_call(self, name, args):
            if name == "move_forward" and not 20 <= args[0] <= 500:
                raise SkillFailure("out of range 20-500 cm")

    robot = Ranged()
    out = TaskInterpreter(MINISPEC, robot).run_segment("tc,90;2{mf,900}")
    assert not out.success and "`mf,900`: out of range" in out.message
    assert "nothing executed" in out.message and robot.calls == []


def test_step_budget_and_cancel():
    robot = FakeRobot()
    limits = InterpreterLimits(max_loop_count=100, step_budget=50)
    out = TaskInterpreter(MINISPEC, robot, limits).run_segment("100{100{d,1}}")
    assert not out.success and "step budget of 50" in out.message
    assert len(robot.calls) < 50
    cancel = threading.Event()
    cancel.set()
    out = TaskInterpreter(MINISPEC, robot).run_segment("mf,50", cancel_event=cancel)
    assert not out.success and "cancelled" in out.message


def test_on_call_sees_every_call_with_its_value():
    seen = []
    TaskInterpreter(MINISPEC, FakeRobot({"object_x": 0.25})).run_segment(
        "_1=ox,cup;l,_1", on_call=seen.append)
    assert [(c.name, c.value) for c in seen] == [("object_x", 0.25), ("log", None)]
    assert seen[1].args == (0.25,)


def test_unknown_makes_every_comparison_false():
    for op in ("==", "!=", "<", ">"):
        assert compare(UNKNOWN, op, True) is False and compare(False, op, UNKNOWN) is False
    robot = FakeRobot({"is_visible": UNKNOWN})
    out = TaskInterpreter(MINISPEC, robot).run_segment(
        "_1=iv,cup;?_1==True{mf,50};?_1==False{mb,50};?_1!=False{tc,90}")
    assert out.success and names(robot) == ["is_visible"]


def test_typefly_comparisons():
    assert compare(True, ">", 0.5) and compare(False, "<", 0.4)   # bools are 1 and 0
    assert compare(3, "==", 3.0) and compare("apple", "!=", False)
    assert not compare("apple", "==", False)


def test_arm_sequences_run_on_the_same_interpreter():
    robot = FakeRobot({"check": True})
    out = TaskInterpreter(ARM, robot).run_segment("pick(cup)->place(cup, bin)->check(bin)")
    assert out.success and robot.calls == [("pick", ("cup",)), ("place", ("cup", "bin")),
                                           ("check", ("bin",))]
    bad = TaskInterpreter(ARM, FakeRobot(fail={"pick": "no object 'mug'"})).run_segment(
        "pick(mug)")
    assert not bad.success and bad.message == "statement `pick(mug)`: no object 'mug'"


# ---------------------------------------------------------------------------------------------
# Fuzz: never crashes, always terminates within the step budget

BUDGET = InterpreterLimits(max_loop_count=20, step_budget=300)
_values = st.sampled_from([True, False, 0.3, 0.7, "apple", None, UNKNOWN, 3])


class RandomRobot(FakeRobot):
    def __init__(self, data):
        super().__init__()
        self.data = data

    def call(self, name, args):
        super().call(name, args)
        if self.data.draw(st.integers(0, 30)) == 0:
            raise SkillFailure("random failure")
        return self.data.draw(_values)


@settings(max_examples=150, deadline=None)
@given(programs, st.data())
def test_fuzz_programs_never_crash_and_stay_in_budget(program, data):
    robot = RandomRobot(data)
    interp = TaskInterpreter(MINISPEC, robot, BUDGET)
    text = to_text(program)
    for segment in (text, "l,_1;", text):
        out = interp.run_segment(segment)
        assert out.steps <= BUDGET.step_budget + 1
        assert len(robot.calls) <= 3 * (BUDGET.step_budget + 1)
        assert "internal error" not in out.message
        if not out.success:
            assert out.message.startswith(("statement `", "segment does not parse"))


@settings(max_examples=150, deadline=None)
@given(st.text("mftcivsoql_12=?{};,'->&|<>$ aTrueFals80.", max_size=40), st.data())
def test_fuzz_text_never_crashes(text, data):
    out = TaskInterpreter(MINISPEC, RandomRobot(data), BUDGET).run_segment(text)
    assert out.steps <= BUDGET.step_budget + 1
    assert "internal error" not in out.message
