"""`timelyllm-pred` on a fleet whose replicas step on their own: one decision per replica
(core/policies/predictive.py, `PredictiveAdmission.decide_per_replica`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.engines import engine_spec
from timelyllm_ros.bench.fleet_scale import fleet_workload, single_task_events
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.workloads import load_bench_workload
from timelyllm_ros.core.engine.base import ReplicaRoom, StepTiming
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.factory import build_engine
from timelyllm_ros.core.engine.sim.fleet import SimulatedFleet
from timelyllm_ros.core.policies.predictive import PredictiveAdmission, PredictiveTimelyPolicy
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.sched.decision import HOLD_COST
from timelyllm_ros.core.sched.interface import AdmissionPass, RunningGen, StepInfo
from timelyllm_ros.core.sched.queue_view import QueueView, suspended_row
from timelyllm_ros.core.sched.step_model import StepTimeModel
from timelyllm_ros.lrtrace.workload import compose

from fakes import LEVELS

H100 = Path(__file__).resolve().parents[3] / "config" / "engine_profiles" / "llama3-8b-h100.yaml"
PROFILE = EngineProfile()
NOW = 5.0
BUSY = 40           # running responses on replica 0
REMAINING = 30      # tokens each of them has left
CONTEXT = 1000      # each one's KV
RESUME_CONTEXT = 4000


def _response(key: str, replica: int, deadline_s: float) -> RunningGen:
    return RunningGen(key, CONTEXT, 0, REMAINING, deadline_s, True, "drone", 0, 0, 1.0, 10.0,
                      replica)


def _busy_replica_and_a_resume(model: StepTimeModel):
    """Replica 0 runs BUSY responses due halfway between their finish without one more
    sequence and with the queued resume beside them; replica 1 runs nothing. The resume (its
    KV preserved: 16 tokens to prefill) belongs to a task on replica 1 and has 10 s of slack."""
    without = REMAINING * model.step_s(BUSY, BUSY * CONTEXT, 0)
    # (The resume's 16-token prefill rides in the first of those steps.)
    with_resume = (REMAINING * model.step_s(BUSY + 1, BUSY * CONTEXT + RESUME_CONTEXT, 0)
                   + model.step_s(0, 0, 16) - model.step_s(0, 0, 0))
    due = NOW + (without + with_resume) / 2
    running = [_response(f"busy{i}", 0, due) for i in range(BUSY)]
    row = suspended_row(LEVELS.get("normal"), NOW - 3.0, NOW + 10.0, 2, enqueued_s=NOW - 1.0,
                        context_tokens=RESUME_CONTEXT, bound_tokens=10, prefill_tokens=16)
    return running, QueueView.from_rows([row])


def test_a_resume_on_a_light_replica_is_admitted_while_another_replica_is_busy():
    model = StepTimeModel(PROFILE)
    running, view = _busy_replica_and_a_resume(model)
    adm = PredictiveAdmission(model, step_token_budget=8192, kv_block_size=16, max_num_seqs=512)
    # Seen as one engine, the resume joins the busy batch and makes its responses late: held.
    adm.begin_pass(AdmissionPass(NOW, view, np.arange(1), ["resume"], running, 10_000, 16))
    assert "resume" not in adm.shortlist()
    assert adm.decision.hold["resume"] == HOLD_COST
    # Per replica, it joins replica 1, where it slows nobody: admitted.
    rooms = [ReplicaRoom(5_000, 256 - BUSY), ReplicaRoom(5_000, 256)]
    adm.begin_pass(AdmissionPass(NOW, view, np.arange(1), ["resume"], running, 10_000, 16,
                                 replica_rooms=rooms, candidate_replicas=np.array([1])))
    assert set(adm.shortlist()) == {"resume"}
    assert adm.replicas == 2
    assert len(adm.replica_snapshots[0].running) == BUSY
    assert len(adm.replica_snapshots[1].candidates) == 1
    # On replica 0 the same resume is held, as on the whole fleet.
    adm.begin_pass(AdmissionPass(NOW, view, np.arange(1), ["resume"], running, 10_000, 16,
                                 replica_rooms=rooms, candidate_replicas=np.array([0])))
    assert "resume" not in adm.shortlist()


def test_a_replica_s_step_is_learnt_against_its_own_batch():
    policy = get_policy("timelyllm-pred")
    policy.step_model = StepTimeModel(PROFILE, prior_steps=1.0, memory_steps=1e6)
    # Four replicas of 2 to 30 sequences each, the fleet 64 in all: each step is one replica's,
    # as long as the profile makes a step of its own batch (twice the profile's per-sequence
    # cost, so that the fit has to move off its prior).
    def step_of(size):
        return PROFILE.decode_fixed_s + 2 * PROFILE.decode_per_seq_s * size

    for step in range(400):
        size = 2 + step % 29
        policy.on_step(StepInfo(step, step_of(size), 64, 0, 0, replica=step % 4,
                                replica_batch_size=size))
    for size in (4, 16, 30):
        predicted = policy.step_model.step_s(size, 0, 0)
        assert abs(predicted - step_of(size)) < 0.03 * step_of(size), (size, predicted)


class FleetSeenAsOneEngine(SimulatedFleet):
    """The same fleet, telling the scheduler nothing of its replicas (as before the decision
    was taken per replica)."""

    def replica_for(self, request_id: str) -> int | None:
        return None

    def replica_rooms(self) -> None:
        return None

    def last_step_timing(self) -> StepTiming:
        return dataclasses.replace(super().last_step_timing(), replica=None)


def test_on_a_simulated_fleet_each_replica_is_decided_on_its_own_steps(monkeypatch):
    # docs/fleet-scale.md's probe without bursts, small: 2 replicas x 2,400 WID1 drones, one
    # task per event, 5 s of arrivals (369 urgent tasks). Measured: 0 late either way; the
    # step model's per-sequence cost 0.27 ms per replica (the profile's 0.25 ms), 0.13 ms with
    # the fleet seen as one engine (each step's time against twice its batch).
    made = []
    make_admission = PredictiveTimelyPolicy.make_admission

    def recorded(policy, ctx):
        admission = make_admission(policy, ctx)
        made.append((policy, admission))
        return admission

    monkeypatch.setattr(PredictiveTimelyPolicy, "make_admission", recorded)
    base = single_task_events(load_bench_workload("WID1", None, None)[0], 1)
    profile = EngineProfile.from_yaml(H100)
    config = BenchConfig(profile=profile, replicas=2)
    spec = engine_spec(config)
    workload = fleet_workload(base, 2 * 2400, 5.0)
    per_seq, admissions = {}, {}
    for fleet_class in (SimulatedFleet, FleetSeenAsOneEngine):
        fleet = fleet_class(lambda _i: build_engine(spec), 2)
        run = run_policy(compose(workload), "timelyllm-pred", workload, config, engine=fleet)
        assert all(steps > 0 for steps in fleet.steps_per_replica)
        urgent = [t for t in run.tasks if t.tuf_level == "urgent"]
        late = sum(1 for t in urgent if not t.response_time_s <= t.ert_s)
        assert late <= 0.05 * len(urgent), (fleet_class.__name__, late, len(urgent))
        policy, admissions[fleet_class] = made[-1]
        per_seq[fleet_class] = policy.step_model.coefficients()["decode_per_seq_s"]
    adm = admissions[SimulatedFleet]
    assert adm.replicas == 2 and set(adm.replica_snapshots) == {0, 1}
    assert admissions[FleetSeenAsOneEngine].replicas is None
    assert abs(per_seq[SimulatedFleet] / profile.decode_per_seq_s - 1) < 0.2, per_seq
    assert per_seq[FleetSeenAsOneEngine] < 0.7 * profile.decode_per_seq_s, per_seq
