"""The robot timeline's whole-array reschedule (`_chains_vectorised`) against its loop
(`_chains_stepwise`): the same dispatches, reports and ends give the same estimates, deadlines
and answers, bit for bit, idle gaps and estimates that move far (where `done += new - done` does
not land on `new`) included. The bench's figures depend on these estimates."""

from __future__ import annotations

import copy

import pytest
from hypothesis import example, given, settings, strategies as st

from timelyllm_ros.core.sched import robot_timeline
from timelyllm_ros.core.sched.robot_timeline import RobotTimelines
from timelyllm_ros.core.task import SegmentRecord

LATENCY = 0.008

# (operation, time step, pick, estimate, longest factor): times from sub-millisecond to minutes,
# so some reports move an estimate by far more than a factor of two, and some segments are
# dispatched after the robot is expected to be free (a gap in the chain).
OPS = st.lists(st.tuples(st.sampled_from(["dispatch", "dispatch", "dispatch", "report_oldest",
                                          "report_any", "end"]),
                         st.one_of(st.just(0.0), st.floats(1e-4, 0.5), st.floats(0.5, 90.0)),
                         st.integers(0, 10_000),
                         st.one_of(st.floats(1e-3, 2.0), st.floats(2.0, 60.0)),
                         st.floats(1.0, 4.0)),
               min_size=1, max_size=120)


def _replay(ops, vectorise_from: int, monkeypatch: pytest.MonkeyPatch):
    """Drive a timeline as the scheduler does; return every observable after each operation."""
    monkeypatch.setattr(robot_timeline, "VECTORISE_FROM", vectorise_from)
    timeline = RobotTimelines()
    pending: list[SegmentRecord] = []
    owners = [object() for _ in range(7)]
    now, seq = 0.0, 0
    seen = []
    for op, dt, pick, estimate, factor in ops:
        now += dt
        if op == "dispatch":
            arrive = now + LATENCY
            start = timeline.free_at("r", arrive)
            latest = max(start, timeline.latest_free_at("r", arrive))
            longest = factor * estimate
            segment = SegmentRecord(seq, "x;", (), False, estimate, now, start + estimate,
                                    latest + longest + LATENCY + max(3.0 * estimate, 5.0))
            seq += 1
            timeline.dispatched("r", segment, owner=owners[pick % len(owners)],
                                latest_start=latest, longest_s=longest)
            pending.append(segment)
            moved = None
        elif pending:
            segment = pending[0] if op == "report_oldest" else pending[pick % len(pending)]
            pending.remove(segment)
            timeline.settled("r", [segment])
            moved = None if op == "end" else [
                owners.index(o) for o in timeline.reschedule("r", now, LATENCY)]
        else:
            continue
        seen.append((moved, timeline.free_at("r", now), timeline.latest_free_at("r", now),
                     timeline.pending_count("r"),
                     [(s.estimated_done_s, s.report_deadline_s) for s in pending]))
    return seen


# Found by a search: the first estimate moves from ~0.03 s to ~72 s and does not land on its new
# value; the next one starts from where it landed, one ulp away from the running sum.
_OFF_BY_AN_ULP = [("dispatch", 0.028406591169413156, 0, 0.0034749035043718764, 2.0),
                  ("dispatch", 0.01567718946411201, 1, 0.0015567335892881845, 2.0),
                  ("dispatch", 0.04547965172707575, 2, 0.0321855828537591, 2.0),
                  ("dispatch", 0.032968156405460615, 3, 0.036552984092736336, 2.0),
                  ("dispatch", 0.012034864201322003, 4, 0.021183147979597774, 2.0),
                  ("report_oldest", 71.80999215949281, 0, 1.0, 1.0)]


@settings(max_examples=150, deadline=None)
@given(OPS)
@example(_OFF_BY_AN_ULP)
def test_whole_array_reschedule_equals_the_loop_bit_for_bit(ops):
    with pytest.MonkeyPatch.context() as mp:
        loop = _replay(copy.deepcopy(ops), 10 ** 9, mp)
        vectorised = _replay(copy.deepcopy(ops), 0, mp)
    assert vectorised == loop  # floats compared with ==: bit for bit (no NaN arises here)


def test_a_deep_queue_takes_the_whole_array_path_and_matches_the_loop():
    # 300 segments queued back to back (a deep overload), then reports one by one.
    ops = [("dispatch", 0.01, i, 1.0 + (i % 5) * 0.3, 2.0) for i in range(300)]
    ops += [("report_oldest", 1.1, 0, 1.0, 1.0) for _ in range(250)]
    with pytest.MonkeyPatch.context() as mp:
        loop = _replay(ops, 10 ** 9, mp)
        vectorised = _replay(ops, robot_timeline.VECTORISE_FROM, mp)
    assert vectorised == loop
    assert vectorised[-1][3] == 50
