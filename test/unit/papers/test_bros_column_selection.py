"""BROS's selection on request columns (`column_selection`) against the per-request reference
(`selection.select_batch`), and the admission pass's request columns against `segment_request`:
the fast path must give the very same selection, bit for bit."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.policies import QueueView, get_policy, initial_row, suspended_row
from timelyllm_ros.core.sched.interface import AdmissionPass, RunningGen, SchedulerContext
from timelyllm_ros.core.tuf import TUF
from timelyllm_ros.papers.bros.column_selection import RequestColumns, select_columns
from timelyllm_ros.papers.bros.cost_model import BrosCostModel, PhaseCost
from timelyllm_ros.papers.bros.policy import _pass_requests, _service_class
from timelyllm_ros.papers.bros.requests import BE, RT, BrosRequest, segment_request
from timelyllm_ros.papers.bros.selection import BrosScheduler, select_batch

# Coefficients of the order of a real engine's, so that batches of a few requests reach the
# slack of the generated requests (HITs, displacements and late requests all occur).
MODEL = BrosCostModel(prefill=PhaseCost(2e-4, 1e-8, 0.01), decode=PhaseCost(1e-3, 2e-6, 0.005),
                      swap_per_slot_s=2e-4)


class CapacityOracle:
    """FindBlock with fixed free slots, and more for RT requests (as the policy's `_FreeSlots`)."""

    def __init__(self, slots: int, rt_extra: int):
        self.slots, self.rt_slots = slots, slots + rt_extra

    def rt_capacity(self, req_id) -> int:
        return self.rt_slots

    def be_capacity(self, req_id) -> int:
        return self.slots


# Mostly finite SLOs; inf (no deadline) and NaN (which Python's sort and min order by position)
# now and then.
slo = st.one_of(st.floats(0.0, 0.6), st.floats(0.0, 0.6), st.sampled_from([math.inf, math.nan]))
request_fields = st.tuples(st.booleans(), st.booleans(), st.integers(0, 400),
                           st.integers(0, 3000), st.floats(0.0, 0.3), st.integers(1, 12), slo,
                           st.integers(0, 200))


def make_requests(fields) -> list[BrosRequest]:
    return [BrosRequest(f"r{i}", kind=RT if rt else BE, prefill=prefill, new_tokens=new,
                        context_tokens=context, t_since_token_s=since, tokens_left=left,
                        slo_s=slo_s, host_slots=host)
            for i, (rt, prefill, new, context, since, left, slo_s, host) in enumerate(fields)]


def same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@settings(max_examples=400, deadline=None)
@given(fields=st.lists(request_fields, max_size=24), t_avg=st.floats(0.005, 0.1),
       batch_limit=st.integers(1, 10),
       token_budget=st.one_of(st.none(), st.integers(0, 3000)),
       capacity=st.one_of(st.none(), st.tuples(st.integers(0, 4000), st.integers(0, 2000))))
def test_column_selection_equals_select_batch(fields, t_avg, batch_limit, token_budget,
                                              capacity):
    requests = make_requests(fields)
    blocks = None if capacity is None else CapacityOracle(*capacity)
    expected = select_batch([r for r in requests if r.kind == RT],
                            [r for r in requests if r.kind == BE], cost=MODEL, t_avg_s=t_avg,
                            batch_limit=batch_limit, blocks=blocks, token_budget=token_budget)
    got = select_columns(RequestColumns.from_requests(requests), cost=MODEL, t_avg_s=t_avg,
                         batch_limit=batch_limit, blocks=blocks,
                         token_budget=token_budget).to_selection()
    for part in ("rt", "be", "rt_queue", "be_queue", "displaced"):
        assert [r.req_id for r in getattr(got, part)] == \
            [r.req_id for r in getattr(expected, part)], part
    assert same_float(got.tres_s, expected.tres_s)
    assert got.est_iter_s == expected.est_iter_s
    assert (got.hit, got.late_served) == (expected.hit, expected.late_served)


@settings(max_examples=200, deadline=None)
@given(fields=st.lists(request_fields, min_size=1, max_size=16))
def test_alone_of_a_column_equals_alone_per_request(fields):
    """The vectorized price alone is `ModelCostAccumulator.alone` of each request, bit for bit
    (itself checked against push, value, pop in test_seed_bros)."""
    requests = make_requests(fields)
    cols = RequestColumns.from_requests(requests)
    acc = MODEL.accumulator()
    got = MODEL.alone_s(cols.prefill, cols.new_tokens, cols.context_tokens, cols.host_slots)
    assert got.tolist() == [acc.alone(r) for r in requests]


def test_scheduler_accounts_a_column_selection_like_a_request_selection():
    requests = make_requests([(True, True, 300, 300, 0.0, 5, 0.3, 0)] * 6)
    by_request, by_column = BrosScheduler(MODEL), BrosScheduler(MODEL)
    for _ in range(3):
        a = by_request.select(requests, [])
        b = by_column.select_columns(RequestColumns.from_requests(requests))
        assert [r.req_id for r in a.rt] == [r.req_id for r in b.to_selection().rt]
    assert (by_request.iterations, by_request.hits, by_request.batch.current) == \
        (by_column.iterations, by_column.hits, by_column.batch.current)


NORMAL = TUF(1.0, 2.0, 1.0)
URGENT = TUF(0.2, 6.67, 2.0)


@settings(max_examples=100, deadline=None)
@given(queued=st.lists(st.tuples(st.booleans(), st.booleans(), st.floats(0.0, 8.0),
                                 st.integers(0, 40), st.integers(0, 900), st.integers(0, 300)),
                       max_size=12),
       running=st.lists(st.tuples(st.booleans(), st.integers(0, 900), st.integers(0, 40),
                                  st.integers(0, 40), st.floats(0.0, 12.0)), max_size=6),
       now=st.floats(0.0, 10.0), t_avg=st.floats(0.005, 0.1))
def test_pass_requests_are_the_segment_requests(queued, running, now, t_avg):
    """`_pass_requests` builds, as columns, exactly the requests that one `segment_request` per
    running and queued generation gives (the per-request construction it replaced)."""
    rows = []
    for i, (urgent, suspended, reference, bound, context, prefill) in enumerate(queued):
        sizes = dict(bound_tokens=bound, context_tokens=context, prefill_tokens=prefill,
                     task_seq=i)
        tuf = URGENT if urgent else NORMAL
        rows.append(suspended_row(tuf, 0.0, reference, 1, enqueued_s=0.0, is_urgent=urgent,
                                  **sizes) if suspended
                    else initial_row(tuf, reference, is_urgent=urgent, **sizes))
    view = QueueView.from_rows(rows)
    order = np.arange(len(view))
    gens = [RunningGen(f"g{i}", context, done, bound, deadline, urgent)
            for i, (urgent, context, done, bound, deadline) in enumerate(running)]
    p = AdmissionPass(now, view, order, [f"k{i}" for i in order], gens, 1000, 16)
    be_slack = 5.0
    running_rt = [_service_class(urgent=g.is_urgent, deadline_s=g.deadline_s, now=now,
                                 tokens_left=max(1, g.remaining_tokens), t_avg_s=t_avg,
                                 be_slack_s=be_slack) == RT for g in gens]
    got = _pass_requests(p, running_rt, t_avg, be_slack)

    expected = []
    for g, is_rt in zip(gens, running_rt):
        expected.append(segment_request(("run", g.key), now_s=now, reference_s=now,
                                        deadline_s=g.deadline_s,
                                        tokens_left=max(1, g.remaining_tokens), prefill=False,
                                        new_tokens=1, context_tokens=g.context_tokens,
                                        kind=RT if is_rt else BE))
    for j, key in enumerate(p.keys):
        deadline = float(view.reference_s[j] + view.ert_s[j])
        bound = max(int(view.bound_tokens[j]), 1)
        kind = _service_class(urgent=bool(view.is_urgent[j]), deadline_s=deadline, now=now,
                              tokens_left=bound, t_avg_s=t_avg, be_slack_s=be_slack)
        expected.append(segment_request(key, now_s=now, reference_s=now, deadline_s=deadline,
                                        tokens_left=bound, prefill=True,
                                        new_tokens=max(int(view.prefill_tokens[j]), 1),
                                        context_tokens=int(view.context_tokens[j]), kind=kind))
    assert [got.request(i) for i in range(len(got))] == expected
    rows_all = np.arange(len(got))
    assert got.slack(rows_all, t_avg).tolist() == [r.slack(t_avg) for r in expected]


def test_admission_exposes_its_selection_as_requests():
    view = QueueView.from_rows([initial_row(NORMAL, 0.0, bound_tokens=10, context_tokens=100,
                                            prefill_tokens=10, task_seq=i) for i in range(3)])
    policy = get_policy("timelyllm-bros")
    adm = policy.make_admission(SchedulerContext("sim", 16, 2560, 10, 256))
    assert adm.last_selection is None
    adm.begin_pass(AdmissionPass(0.0, view, np.arange(3), ["k0", "k1", "k2"], [], 10_000, 16))
    sel = adm.last_selection
    assert [r.req_id for r in sel.rt] == ["k0", "k1", "k2"]
    assert adm.allowed == adm.selected_rt == {"k0", "k1", "k2"}


def test_several_displaced_requests_go_back_to_the_rt_queue_last_first():
    """A case the random ones seldom reach: BE requests displace two RT requests in turn."""
    model = BrosCostModel(decode=PhaseCost(a0=0.01))  # 10 ms per request
    rts = [BrosRequest(f"rt{i}", kind=RT, slo_s=0.5 + 0.1 * i) for i in range(3)]
    bes = [BrosRequest(f"be{i}", kind=BE) for i in range(3)]
    expected = select_batch(rts, bes, cost=model, t_avg_s=0.05, batch_limit=4)
    assert [r.req_id for r in expected.displaced] == ["rt2", "rt1"]
    assert [r.req_id for r in expected.rt_queue] == ["rt1", "rt2"]
    got = select_columns(RequestColumns.from_requests(rts + bes), cost=model, t_avg_s=0.05,
                         batch_limit=4).to_selection()
    for part in ("rt", "be", "rt_queue", "be_queue", "displaced"):
        assert [r.req_id for r in getattr(got, part)] == \
            [r.req_id for r in getattr(expected, part)], part
