"""The scheduler's contract (core.sched.interface): hooks are called as declared, records handed
out are frozen, and admission controllers and engines are typed rather than probed."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from fakes import EXEC_MODEL_PATH, SKILL_SETS, Listener, drive, spec
from timelyllm_ros.core.engine.base import EngineCapabilities
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.policies.builtin import FcfsPolicy
from timelyllm_ros.core.policies.registry import get_policy, policy_names
from timelyllm_ros.core.sched.admission import FixedBatchCap, with_batch_cap
from timelyllm_ros.core.sched.interface import (AdmissionController, Candidate, CandidateAdmission,
                                                Policy, SegmentDispatch)
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler

HOOKS = ("make_admission", "make_gate", "pause_handling", "on_admitted", "on_step",
         "on_task_end", "service_class", "engine_needs")


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_overrides_hooks_with_the_declared_signature(name):
    policy = get_policy(name)
    assert isinstance(policy, Policy)
    for hook in HOOKS:
        mine = getattr(type(policy), hook)
        if mine is getattr(Policy, hook):
            continue
        declared = list(inspect.signature(getattr(Policy, hook)).parameters)
        assert list(inspect.signature(mine).parameters) == declared, (name, hook)


@dataclasses.dataclass
class RecordingPolicy(FcfsPolicy):
    name: str = "recording"
    dispatch: str = "segment"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.admitted: list[tuple[list[int], float]] = []
        self.ended: list[int] = []
        self.steps = 0

    def on_admitted(self, task_seqs, now):
        self.admitted.append((list(task_seqs), now))

    def on_task_end(self, task_seq):
        self.ended.append(task_seq)

    def on_step(self, step):
        self.steps += 1


def test_hooks_are_called_with_task_sequence_numbers():
    engine, listener, policy = SimulatedEngine(), Listener(), RecordingPolicy()
    sch = SegmentScheduler(engine, policy, SKILL_SETS,
                           ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH), listener,
                           SchedulerConfig(network_latency_s=0.008))
    for i, trace in enumerate((1, 6, 2)):
        sch.submit(spec(f"t{i}", trace, engine))
    drive(sch, engine, listener)
    admitted = [seq for seqs, _ in policy.admitted for seq in seqs]
    # Each task's first run and each resume is one admission, named by its task sequence number.
    assert sorted(set(admitted)) == [0, 1, 2]
    assert len(admitted) == sum(1 + t.resumes for t in sch.tasks.values())
    assert sorted(policy.ended) == [0, 1, 2]
    assert policy.steps == sch.steps > 0


def test_listeners_get_frozen_copies():
    engine, listener = SimulatedEngine(), Listener()
    sch = SegmentScheduler(engine, get_policy("timelyllm"), SKILL_SETS,
                           ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH), listener)
    sch.submit(spec("a", 1, engine))
    drive(sch, engine, listener)
    _, dispatch = listener.segments[0]
    assert isinstance(dispatch, SegmentDispatch)
    with pytest.raises(dataclasses.FrozenInstanceError):
        dispatch.text = "mf,1000;"
    with pytest.raises(dataclasses.FrozenInstanceError):
        listener.statuses[-1].state = "done"
    assert sch.tasks["a"].segments[0].text == dispatch.text


def test_batch_cap_keeps_the_kind_of_admission():
    class Refuse(CandidateAdmission):
        skip_refused = True

        def may_admit_candidate(self, batch, candidate, free_kv_blocks):
            return False, "never"

    capped = with_batch_cap(2, Refuse())
    assert isinstance(capped, CandidateAdmission) and capped.skip_refused
    cand = Candidate("k", 0, 10, 5, 10, 1, 1.0, False, 0)
    assert capped.may_admit_candidate([], cand, 100) == (False, "never")
    assert capped.displacement_for([], cand, 100) == []
    plain = with_batch_cap(1, FixedBatchCap(4))
    assert isinstance(plain, AdmissionController) and not isinstance(plain, CandidateAdmission)
    assert plain.may_admit([(0, 1.0, 10)], None, 100, 1) == (False, "batch cap 1 reached")


def test_engine_capabilities_are_declared_not_probed():
    caps = SimulatedEngine(max_num_seqs=7).capabilities()
    assert caps == EngineCapabilities(pause_handling=True, max_num_seqs=7, profile=caps.profile,
                                      kv_bytes_per_token=131072.0, host_link_bytes_per_s=25e9)
    sch = SegmentScheduler(SimulatedEngine(max_num_seqs=7), get_policy("lamps"), SKILL_SETS,
                           ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH), Listener())
    assert sch.context.supports_pause_handling and sch.context.max_num_seqs == 7
