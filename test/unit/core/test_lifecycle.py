import time

import pytest
from transitions import MachineError

from timelyllm_ros.core.lifecycle import (STATES, TERMINAL_STATES, TRIGGERS, IllegalTransition,
                                          TaskLifecycle)


def test_happy_path_with_segments():
    t = TaskLifecycle(0.0, task_id="t1")
    assert t.state == "received" and not t.is_terminal
    t.accept(0.1)
    t.admit(0.2)
    t.suspend(0.3)
    t.admit(1.0)
    t.suspend(1.1)
    t.admit(2.0)
    t.finish_generation(2.1)
    t.complete(5.0)
    assert t.state == "done" and t.is_terminal
    assert t.history == [("received", 0.0), ("queued", 0.1), ("generating", 0.2),
                         ("suspended", 0.3), ("generating", 1.0), ("suspended", 1.1),
                         ("generating", 2.0), ("awaiting_robot", 2.1), ("done", 5.0)]
    assert t.time_of("generating") == 2.0 and t.time_of("failed") is None


def test_reject_sets_reason():
    t = TaskLifecycle(1.0)
    t.reject(1.5, reason="unknown TUF level")
    assert t.state == "rejected" and t.reason == "unknown TUF level" and t.is_terminal


@pytest.mark.parametrize("path", [[], ["accept"], ["accept", "admit"], ["accept", "admit", "suspend"],
                                  ["accept", "admit", "finish_generation"]])
@pytest.mark.parametrize("end", ["fail", "cancel"])
def test_fail_and_cancel_from_any_non_terminal(path, end):
    t = TaskLifecycle(0.0)
    for i, trig in enumerate(path):
        t.trigger(trig, float(i + 1))
    t.trigger(end, 9.0, reason="why")
    assert t.state == {"fail": "failed", "cancel": "cancelled"}[end]
    assert t.reason == "why" and t.history[-1] == (t.state, 9.0)


@pytest.mark.parametrize("path,bad", [
    ([], "admit"), ([], "complete"), (["accept"], "suspend"), (["accept"], "accept"),
    (["accept", "admit"], "complete"), (["accept", "admit", "suspend"], "finish_generation"),
    (["accept", "admit", "finish_generation"], "admit"), (["reject"], "accept"),
    (["reject"], "fail"), (["cancel"], "cancel"),
])
def test_illegal_transitions_raise(path, bad):
    t = TaskLifecycle(0.0, task_id=7)
    for trig in path:
        t.trigger(trig, 1.0)
    state, hist = t.state, list(t.history)
    with pytest.raises(IllegalTransition) as info:
        t.trigger(bad, 2.0)
    assert isinstance(info.value, MachineError)
    assert info.value.state == state and info.value.trigger == bad
    assert state in str(info.value) and bad in str(info.value) and "7" in str(info.value)
    assert t.state == state and t.history == hist  # nothing changed


def test_may_and_unknown_trigger():
    t = TaskLifecycle()
    assert t.may("accept") and t.may("reject") and not t.may("admit") and not t.may("fly")
    with pytest.raises(ValueError):
        t.trigger("fly", 0.0)


def test_every_terminal_state_accepts_nothing():
    for trig in TRIGGERS:
        for end in ("fail", "cancel"):
            t = TaskLifecycle()
            t.trigger(end, 0.0)
            assert not t.may(trig)
    assert set(TERMINAL_STATES) < set(STATES)


def test_many_lifecycles_are_independent_and_cheap():
    n = 5000
    t0 = time.perf_counter()
    tasks = [TaskLifecycle(float(i), task_id=i) for i in range(n)]
    per_task = (time.perf_counter() - t0) / n
    assert per_task < 200e-6, f"{per_task * 1e6:.1f} us per lifecycle"
    tasks[0].accept(1.0)
    assert tasks[0].state == "queued" and tasks[1].state == "received"


def test_firing_by_table_matches_the_machine_for_every_state_and_trigger():
    # TaskLifecycle looks destinations up instead of firing transitions' events; the two must
    # agree everywhere, illegal transitions included.
    from timelyllm_ros.core.lifecycle import _EVENTS

    class _Model:
        state = "received"

    for state in STATES:
        for trigger in TRIGGERS:
            model = _Model()
            model.state = state
            try:
                _EVENTS[trigger].trigger(model)
                expected = model.state
            except MachineError:
                expected = None
            lifecycle = TaskLifecycle(0.0, "t")
            lifecycle.state = state
            if expected is None:
                with pytest.raises(IllegalTransition):
                    lifecycle.trigger(trigger, 1.0)
                assert lifecycle.state == state
            else:
                assert lifecycle.trigger(trigger, 1.0) == expected
                assert lifecycle.history[-1] == (expected, 1.0)
