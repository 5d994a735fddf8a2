"""The admission walk's fast paths (issue 11's bench speed) change nothing it decides: keys by
row, and a candidate-aware controller's shortlist."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from fakes import EXEC_MODEL_PATH, SKILL_SETS, Listener, drive, spec
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.builtin import FcfsPolicy
from timelyllm_ros.core.sched.admission import with_batch_cap
from timelyllm_ros.core.sched.interface import CandidateAdmission
from timelyllm_ros.core.sched.queue_view import QueueArrays
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler


def test_keys_by_row_follow_adds_removes_and_growth():
    q = QueueArrays(capacity=2)
    rng = random.Random(3)
    slots: dict[str, int] = {}
    for step in range(300):
        if slots and rng.random() < 0.45:
            key = rng.choice(sorted(slots))
            q.remove(slots.pop(key))
        else:
            key = f"k{step}"
            slots[key] = q.add(arrival_s=float(step), reference_s=0.0, ert_s=1.0, slope=1.0,
                               initial_utility=1.0, key=key)
        n = len(q)
        expected = [q.key_at(i) for i in range(n)]
        assert q.keys_column().tolist() == expected
        rows = list(range(n))
        rng.shuffle(rows)
        assert q.keys_at(rows) == [expected[i] for i in rows]


class EveryOther(CandidateAdmission):
    """Admits only the candidates whose task number has the parity of the pass (as if chosen up
    front), skipping the rest; with `listed`, names that choice as its shortlist."""

    skip_refused = True

    def __init__(self, listed: bool):
        self.listed = listed
        self.offered: list[tuple[int, str]] = []  # (pass, key)
        self.chosen: set = set()
        self.passes = 0

    def begin_pass(self, p) -> None:
        self.passes += 1
        self.chosen = {k for k in p.keys if (int(k[1:]) + self.passes) % 2 == 0}

    def shortlist(self):
        return self.chosen if self.listed else None

    def may_admit_candidate(self, batch, candidate, free_kv_blocks):
        self.offered.append((self.passes, candidate.key))
        return candidate.key in self.chosen, ""


@dataclass
class EveryOtherPolicy(FcfsPolicy):
    name: str = "every-other"
    listed: bool = False
    cap: int | None = None

    def make_admission(self, ctx):
        self.controller = EveryOther(self.listed)
        return self.controller if self.cap is None else with_batch_cap(self.cap,
                                                                       self.controller)


@pytest.mark.parametrize("cap", [None, 2])
def test_a_shortlist_skips_refused_candidates_and_decides_the_same(cap):
    runs = {}
    for listed in (False, True):
        engine = SimulatedEngine()
        policy = EveryOtherPolicy(listed=listed, cap=cap)
        listener = Listener()
        sch = SegmentScheduler(engine, policy, SKILL_SETS,
                               ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH), listener,
                               SchedulerConfig(network_latency_s=0.008))
        for i, trace in enumerate([1, 6, 9, 2, 7, 3, 10, 8, 4, 5]):
            sch.submit(spec(f"t{i}", trace, engine))
        drive(sch, engine, listener)
        runs[listed] = (policy.controller.offered,
                        [(t.task_id, t.state, t.lifecycle.history) for t in sch.tasks.values()])
    offered_all, outcome_all = runs[False]
    offered_listed, outcome_listed = runs[True]
    assert outcome_listed == outcome_all
    assert all(t == "done" for _, t, _ in outcome_listed)
    # Only shortlisted candidates were built and offered; without the shortlist every one was.
    assert all((int(k[1:]) + n) % 2 == 0 for n, k in offered_listed)
    assert any((int(k[1:]) + n) % 2 for n, k in offered_all)
    assert set(offered_listed) < set(offered_all)
