import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from timelyllm_ros.core.policies import (DISPATCH_MODES, Policy, QueueArrays, QueueView,
                                         get_policy, initial_row, policy_names, pud_priority,
                                         suspended_row)
from timelyllm_ros.core.sched.queue_view import COLUMN_NAMES
from timelyllm_ros.core.tuf import TUF

NORMAL = TUF(1.0, 2.0, 1.0)
URGENT = TUF(0.2, 6.67, 2.0)


def test_names_and_unknown():
    names = policy_names()
    for n in ("vllm", "vllm-stream", "fcfs-seg", "edf-seg", "timelyllm", "timelyllm-max_slack_g",
              "timelyllm-exp_decay", "timelyllm-none"):
        assert n in names
    with pytest.raises(KeyError) as info:
        get_policy("sjf")
    assert "timelyllm" in str(info.value) and "vllm" in str(info.value)


@pytest.mark.parametrize("name,dispatch,lga", [
    ("vllm", "whole", False), ("vllm-stream", "stream", False), ("fcfs-seg", "segment", False),
    ("edf-seg", "segment", False), ("timelyllm", "segment", True),
    ("timelyllm-exp_decay", "segment", True), ("timelyllm-none", "segment", True),
])
def test_policy_modes(name, dispatch, lga):
    p = get_policy(name)
    assert p.name == name and p.dispatch == dispatch and p.latency_guided_admission is lga
    assert p.dispatch in DISPATCH_MODES
    assert p.segmented == (dispatch == "segment")


def test_params_and_identity():
    p = get_policy("timelyllm", gen_time_s=0.05)
    assert p.gen_time_s == 0.05
    assert get_policy("timelyllm-exp_decay", scaling_params={"tau": 0.3})._params == {"tau": 0.3}
    with pytest.raises(TypeError):
        get_policy("timelyllm", slack_scaling="none")  # identity is fixed by the name
    with pytest.raises(TypeError):
        get_policy("vllm", gen_time_s=0.05)
    with pytest.raises(ValueError):
        get_policy("timelyllm", gen_time_s=-1)
    with pytest.raises(ValueError):
        Policy(name="x", dispatch="sometimes")


def _mixed_view():
    return QueueView.from_rows([
        # 0: normal task that arrived first, now suspended and due in 2 s
        suspended_row(NORMAL, arrival_s=1.0, previous_done_s=12.0, segment_index=1, enqueued_s=9.0),
        # 1: urgent task that arrived just now
        initial_row(URGENT, arrival_s=10.0, is_urgent=True),
        # 2: normal task that arrived at 5
        initial_row(NORMAL, arrival_s=5.0),
    ])


def test_fcfs_orders_by_task_arrival_even_when_suspended():
    v = _mixed_view()
    for name in ("vllm", "vllm-stream", "fcfs-seg"):
        p = get_policy(name).priorities(v, 10.0)
        assert list(np.argsort(-p)) == [0, 2, 1]


def test_edf_keeps_first_segment_deadline():
    v = _mixed_view()
    p = get_policy("edf-seg").priorities(v, 10.0)
    # deadlines: 1 + 1 = 2, 10 + 0.2 = 10.2, 5 + 1 = 6
    assert p == pytest.approx([-2.0, -10.2, -6.0])
    assert get_policy("edf-seg").select(v, 10.0) == 0


def test_timelyllm_uses_pud_with_slack():
    v = _mixed_view()
    pol = get_policy("timelyllm")
    assert pol.priorities(v, 10.0) == pytest.approx(pud_priority(v, 10.0, 0.09))
    # The urgent task wins; the stale normal one (w = 5.09 s) is late, the suspended one can wait.
    assert pol.select(v, 10.0) == 1
    assert get_policy("timelyllm-none").priorities(v, 10.0) == pytest.approx(
        pud_priority(v, 10.0, 0.09, "none"))


def test_select_empty():
    for name in policy_names():
        assert get_policy(name).select(QueueView.from_rows([]), 0.0) is None


def test_priorities_do_not_alias_inputs():
    v = _mixed_view()
    before = v.arrival_s.copy()
    for name in policy_names():
        p = get_policy(name).priorities(v, 10.0)
        p[:] = 0
    assert np.array_equal(v.arrival_s, before)


# --- QueueArrays ------------------------------------------------------------------------------

def _row(i):
    return initial_row(NORMAL, arrival_s=float(i))


def test_queue_arrays_basic():
    q = QueueArrays(capacity=2)
    a = q.add(_row(1), key="a")
    b = q.add(_row(2), key="b")
    c = q.add(_row(3), key="c")  # grows
    assert len(q) == 3 and q.view().arrival_s.tolist() == [1, 2, 3]
    q.remove(a)  # swap-remove moves c into row 0
    assert sorted(q.view().arrival_s.tolist()) == [2, 3]
    assert q.get(c)["arrival_s"] == 3 and q.key(c) == "c" and q.slot_of("c") == c
    assert q.key_at(q.index_of(c)) == "c"
    q.update(b, reference_s=7.5, segment_index=2)
    assert q.view().reference_s[q.index_of(b)] == 7.5
    assert q.get(b)["segment_index"] == 2
    assert a not in q and b in q
    with pytest.raises(KeyError):
        q.remove(a)
    with pytest.raises(KeyError):
        q.update(b, colour=1)
    with pytest.raises(KeyError):
        q.add(_row(4), key="b")
    d = q.add(_row(4))
    assert d == a  # slot recycled
    assert set(q.ids.tolist()) == {b, c, d}


def test_queue_arrays_row_validation():
    q = QueueArrays()
    with pytest.raises(KeyError):
        q.add(arrival_s=1.0)  # missing columns
    with pytest.raises(KeyError):
        q.add(_row(1), bogus=1)
    s = q.add(arrival_s=1.0, reference_s=1.0, ert_s=1.0, slope=2.0, initial_utility=1.0)
    assert q.get(s)["task_ert_s"] == 1.0 and q.get(s)["enqueued_s"] == 1.0


class QueueModel(RuleBasedStateMachine):
    """QueueArrays against a plain dict of slot -> row."""

    def __init__(self):
        super().__init__()
        self.q = QueueArrays(capacity=1)
        self.model: dict[int, dict] = {}
        self.counter = 0

    @rule(arr=st.floats(0, 100), seg=st.integers(0, 5), urgent=st.booleans())
    def add(self, arr, seg, urgent):
        self.counter += 1
        row = dict(initial_row(URGENT if urgent else NORMAL, arr, is_urgent=urgent),
                   segment_index=seg)
        slot = self.q.add(row, key=("k", self.counter))
        assert slot not in self.model
        self.model[slot] = dict(row, key=("k", self.counter))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data):
        slot = data.draw(st.sampled_from(sorted(self.model)))
        self.q.remove(slot)
        del self.model[slot]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), ref=st.floats(0, 100))
    def update(self, data, ref):
        slot = data.draw(st.sampled_from(sorted(self.model)))
        self.q.update(slot, reference_s=ref)
        self.model[slot]["reference_s"] = ref

    @invariant()
    def consistent(self):
        v = self.q.view()
        assert len(v) == len(self.q) == len(self.model)
        ids = self.q.ids.tolist()
        assert sorted(ids) == sorted(self.model)
        for i, slot in enumerate(ids):
            expected = self.model[slot]
            for name in COLUMN_NAMES:
                assert getattr(v, name)[i] == expected[name], name
            assert self.q.key_at(i) == expected["key"]
            assert self.q.slot_of(expected["key"]) == slot


TestQueueModel = QueueModel.TestCase
TestQueueModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@settings(max_examples=50, deadline=None)
@given(arrivals=st.lists(st.floats(0, 100), min_size=1, max_size=40))
def test_policy_select_matches_argmax_over_queue(arrivals):
    q = QueueArrays()
    for a in arrivals:
        q.add(initial_row(NORMAL, a))
    i = get_policy("fcfs-seg").select(q.view(), 0.0)
    assert q.view().arrival_s[i] == min(arrivals)
