"""`timelyllm-pred`: the predicted-utility batch control in the scheduler (core/policies/predictive.py)."""

from __future__ import annotations

import numpy as np

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.policies.predictive import FirstSegmentMeans, PredictiveAdmission
from timelyllm_ros.core.policies.registry import DEFAULT_POLICY, get_policy
from timelyllm_ros.core.sched.decision import HOLD_COST
from timelyllm_ros.core.sched.interface import AdmissionPass, Candidate, RunningGen
from timelyllm_ros.core.sched.queue_view import QueueView, initial_row
from timelyllm_ros.core.sched.step_model import StepTimeModel

from fakes import LEVELS, assert_no_leaks, drive, make, spec, states, urgent_beside_two_scenes

POLICY = "timelyllm-pred"
PROFILE = EngineProfile()


def test_it_is_the_planners_default_policy():
    policy = get_policy(POLICY)
    assert policy.suspend_when == "contended" and policy.hopeless == "shed"
    assert DEFAULT_POLICY == POLICY


def test_a_lone_generation_runs_through_and_the_step_model_learns_from_its_steps():
    policy = get_policy(POLICY)
    sch, eng, lis = make(policy)
    task = sch.submit(spec("a", 1, eng))
    drive(sch, eng, lis)
    assert task.state == "done" and len(task.segments) > 1
    assert "suspended" not in states(task) and task.resumes == 0
    assert policy.step_model.steps_seen > 0
    assert_no_leaks(sch, eng)


def test_long_prefills_wait_for_an_urgent_task_that_arrives_with_them():
    """Three tasks of one event: an urgent drone and two normal tasks, each with a long scene of
    its own. Prefilled together (streaming), the urgent one waits for all three prompts."""
    held_urgent, held_normal = urgent_beside_two_scenes(POLICY)
    together_urgent, _ = urgent_beside_two_scenes("vllm-stream")
    assert held_urgent < 0.75 * together_urgent, (held_urgent, together_urgent)
    assert max(held_normal) < LEVELS.get("normal").ert_s


def _gen(key, deadline, segment_index=0, tokens=0, bound=10, context=1000):
    return RunningGen(key, context, tokens, bound, deadline, True, "drone", 0, segment_index,
                      1.0, 10.0)


def test_the_walk_is_answered_from_one_decision_per_pass():
    adm = PredictiveAdmission(StepTimeModel(PROFILE), step_token_budget=8192,
                              kv_block_size=16, max_num_seqs=8)
    now = 10.0
    normal = LEVELS.get("normal")
    rows = [initial_row(normal, now, context_tokens=2500, bound_tokens=10, prefill_tokens=2000,
                        task_seq=1),
            initial_row(normal, now, context_tokens=500, bound_tokens=10, prefill_tokens=10,
                        task_seq=2)]
    view = QueueView.from_rows(rows)
    urgent = _gen("u", now + 0.2, tokens=5)
    adm.begin_pass(AdmissionPass(now, view, np.arange(2), ["long", "short"], [urgent], 1000, 16,
                                 None))
    assert set(adm.shortlist()) == {"short"}
    long = Candidate("long", 1, 2500, 10, 2000, 157, now + normal.ert_s, False, 0)
    short = Candidate("short", 2, 500, 10, 10, 32, now + normal.ert_s, False, 0)
    assert adm.may_admit_candidate([urgent], long, 1000) == (False, HOLD_COST)
    ok, _ = adm.may_admit_candidate([urgent], short, 1000)
    assert ok
    # Blocks are checked again at admission time (a parked eviction may have changed them).
    assert not adm.may_admit_candidate([urgent], short, 10)[0]


def test_a_passive_step_yields_resumes_that_slow_a_late_response():
    adm = PredictiveAdmission(StepTimeModel(PROFILE), step_token_budget=8192,
                              kv_block_size=16)
    now = 5.0
    # ~30 steps of ~22.3 ms (~670 ms), 5 ms late; without the resume each step after its
    # boundary is ~0.9 ms shorter: back on time.
    late = _gen("r", now + 0.665, bound=30)
    resume = RunningGen("y", 4000, 9, 10, now + 10.0, False, "drone", 0, 3, 1.0, 1.0)
    assert set(adm.yield_keys([late, resume], now)) == {"y"}
    on_time = _gen("r", now + 5.0, bound=30)
    assert set(adm.yield_keys([on_time, resume], now + 1)) == set()


def test_first_segments_are_measured_per_skill_set_and_start_at_their_bound():
    means = FirstSegmentMeans()
    assert means.tokens("drone", 10) == 10
    a = RunningGen("a", 10, 3, 10, 1.0, False, "drone")
    means.observe([a])
    means.observe([])
    b = RunningGen("b", 10, 5, 10, 1.0, False, "drone")
    means.observe([b])
    means.observe([RunningGen("b", 10, 6, 10, 1.0, False, "drone", segment_index=1)])
    assert means.tokens("drone", 10) == 4.0
    assert means.tokens("drone", 3) == 3.0  # never above the bound
    assert means.tokens("chat", 60) == 60


def test_resume_weight_scales_what_a_resumes_lateness_costs():
    running = [_gen("r", 1.0), _gen("y", 1.0, segment_index=2)]
    for weight, expected in ((1.0, [10.0, 10.0]), (0.0, [10.0, 0.0])):
        adm = PredictiveAdmission(StepTimeModel(PROFILE), step_token_budget=8192,
                                  kv_block_size=16, resume_weight=weight)
        assert adm.running_set(running).slope.tolist() == expected
    assert get_policy(POLICY).resume_weight == 0.0  # responses first: docs/batch-control.md
