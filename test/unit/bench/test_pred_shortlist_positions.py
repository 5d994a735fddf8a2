"""The default policy hands the scheduler the positions of the candidates it admits
(`CandidateAdmission.shortlist_positions`), so that a pass over thousands of queued generations
does not test every key against the shortlist. Finding them the slow way must give the same
replay, task for task."""

from __future__ import annotations

from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.speed import bench_config
from timelyllm_ros.bench.workloads import load_workload_events
from timelyllm_ros.core.policies.predictive import PredictiveAdmission


def _outcomes(run):
    return sorted((t.task_id, t.state, t.response_time_s, t.utility) for t in run.tasks)


def test_admitting_by_position_replays_as_testing_every_key(monkeypatch):
    spec, events = load_workload_events("mixed-overload", None, 12.0)
    config = bench_config("modern")
    seen = {"passes": 0, "skipping": 0}
    own = PredictiveAdmission.shortlist_positions

    def counted(self):
        positions = own(self)
        seen["passes"] += 1
        # A pass that admits past a held candidate: the positions are not a leading run.
        if positions and list(positions) != list(range(len(positions))):
            seen["skipping"] += 1
        return positions

    monkeypatch.setattr(PredictiveAdmission, "shortlist_positions", counted)
    by_position = run_policy(events, "timelyllm-pred", spec, config)
    monkeypatch.setattr(PredictiveAdmission, "shortlist_positions", lambda self: None)
    by_key = run_policy(events, "timelyllm-pred", spec, config)
    assert seen["passes"] > 100 and seen["skipping"] > 0, seen
    assert len(by_position.tasks) == sum(len(e.tasks) for e in events)
    assert _outcomes(by_position) == _outcomes(by_key)
    assert by_position.steps == by_key.steps
