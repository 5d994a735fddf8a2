"""Work-conserving segmentation, responses first, and the overload rule (issue 11):
`timelyllm-wc` (core/policies/work_conserving.py, the planner's default until issue 22, kept for
the comparison) and the scheduler mechanics behind `Policy.suspend_when` and
`Policy.hopeless`."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from timelyllm_ros.core.engine.base import DISCARD, PRESERVE
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.policies.prefill_hold import FirstSegmentLengths, PrefillHold
from timelyllm_ros.core.policies.work_conserving import (ResponseFirstAdmission,
                                                         WorkConservingTimelyPolicy)
from timelyllm_ros.core.sched.admission import BatchSpeedModel
from timelyllm_ros.core.sched.interface import (AdmissionPass, Candidate, PauseInfo, RunningGen,
                                                SchedulerContext)
from timelyllm_ros.core.sched.queue_view import QueueView, initial_row, suspended_row
from timelyllm_ros.core.tuf import TUF

from fakes import LEVELS, assert_no_leaks, drive, make, spec, states, urgent_beside_two_scenes

NORMAL = LEVELS.get("normal")

WC = "timelyllm-wc"


def _segments(task):
    return len(task.segments)


# ------------------------------------------------------------------ the scheduler's mechanics

def test_a_lone_generation_is_never_suspended_under_timelyllm_wc():
    sch, eng, lis = make(WC)
    task = sch.submit(spec("a", 1, eng))
    drive(sch, eng, lis)
    assert task.state == "done" and _segments(task) > 1
    # Nothing waited, so it kept generating: no suspension, no resume, every boundary counted.
    assert "suspended" not in states(task) and task.resumes == 0
    assert sch.suspensions_avoided == _segments(task) - 1 >= 1
    assert_no_leaks(sch, eng)


def test_the_papers_rule_suspends_at_every_boundary_even_when_nothing_waits():
    sch, eng, lis = make("timelyllm")
    task = sch.submit(spec("a", 1, eng))
    drive(sch, eng, lis)
    assert task.state == "done" and task.resumes >= _segments(task) - 1 >= 1
    assert sch.suspensions_avoided == 0


def test_a_refused_response_makes_a_running_generation_yield_at_its_next_boundary():
    # One slot: while A generates, B (a first segment, ranked above every resume) is refused.
    sch, eng, lis = make(WC, batch_cap=1)
    a = sch.submit(spec("a", 1, eng))
    sch.tick()  # A admitted alone
    b = sch.submit(spec("b", 2, eng))
    drive(sch, eng, lis, until=lambda s: b.segments)
    # A suspended at the boundary after B was refused, and B got the slot before A went on.
    assert "suspended" in states(a)
    a_second = a.segments[1].dispatched_s if len(a.segments) > 1 else float("inf")
    assert b.segments[0].dispatched_s < a_second
    drive(sch, eng, lis)
    assert a.state == b.state == "done"
    assert_no_leaks(sch, eng)


def test_the_same_contention_under_streaming_order_does_not_suspend():
    # fcfs-wc: FCFS order, so the running (older) generation ranks above the newcomer and
    # keeps its slot, exactly as vllm-stream would.
    from timelyllm_ros.core.policies.builtin import FcfsPolicy
    from timelyllm_ros.core.policies.registry import PolicyDefinition, register_policy
    if "test-fcfs-wc" not in __import__("timelyllm_ros.core.policies.registry",
                                        fromlist=["policy_names"]).policy_names():
        register_policy("test-fcfs-wc", PolicyDefinition(
            FcfsPolicy, name="test-fcfs-wc", dispatch="segment", suspend_when="contended"))
    sch, eng, lis = make("test-fcfs-wc", batch_cap=1)
    a = sch.submit(spec("a", 1, eng))
    sch.tick()
    b = sch.submit(spec("b", 2, eng))
    drive(sch, eng, lis)
    assert "suspended" not in states(a) and a.resumes == 0
    assert b.segments[0].dispatched_s > a.segments[-1].dispatched_s


def test_a_task_that_can_no_longer_have_positive_utility_is_shed_with_a_reason():
    sch, eng, lis = make(WC)
    eng.advance_idle(10.0)
    # Arrived 5 s ago with a 1.5 s cut-off (ERT 1 s + 1/2): whenever it is served, U < 0.
    late = sch.submit(dataclasses.replace(spec("late", 1, eng), arrival_s=eng.now() - 5.0))
    fresh = sch.submit(spec("fresh", 2, eng))
    drive(sch, eng, lis)
    assert late.state == "rejected" and "overload" in late.lifecycle.reason
    assert "utility can no longer be positive" in late.lifecycle.reason
    assert states(late) == ["received", "queued", "rejected"]
    # It counts as answered (by the refusal) when it was shed: a miss with utility <= 0.
    assert late.response_time_s >= 5.0 and late.utility <= 0.0
    assert late.utility == pytest.approx(NORMAL.utility(late.response_time_s))
    assert fresh.state == "done" and sch.shed == 1
    # The robot is told: its last status is terminal with the reason.
    last = [s for s in lis.statuses if s.task_id == "late"][-1]
    assert last.state == "rejected" and "overload" in last.reason
    assert_no_leaks(sch, eng)


def test_serve_instead_of_shed_serves_the_hopeless_task_with_its_negative_utility():
    sch, eng, lis = make("timelyllm-wc-serve")
    eng.advance_idle(10.0)
    late = sch.submit(dataclasses.replace(spec("late", 1, eng), arrival_s=eng.now() - 5.0))
    drive(sch, eng, lis)
    assert late.state == "done" and late.utility < 0 and sch.shed == 0


def test_a_suspended_generation_is_never_shed():
    # Only first segments are shed: a resumed plan already has its response (and utility).
    sch, eng, lis = make(WC, batch_cap=1)
    a = sch.submit(spec("a", 1, eng))
    sch.tick()
    sch.submit(spec("b", 2, eng))
    drive(sch, eng, lis)
    assert a.state == "done" and sch.shed == 0


def test_policy_rules_are_checked_by_name():
    with pytest.raises(ValueError, match="suspend_when"):
        get_policy("timelyllm", suspend_when="sometimes")
    with pytest.raises(ValueError, match="hopeless"):
        get_policy("timelyllm", hopeless="drop")
    with pytest.raises(ValueError, match="step_factor"):
        ResponseFirstAdmission(step_factor=0.5)


# ------------------------------------------------------------------ the policy's parts

def test_responses_rank_above_every_resume():
    policy = get_policy(WC)
    now = 10.0
    urgent = LEVELS.get("urgent")
    rows = [
        # A late resume of an urgent task, whose robot is waiting right now ...
        suspended_row(urgent, 0.0, now - 1.0, 3, enqueued_s=now - 1.0, is_urgent=True),
        # ... and a fresh first segment of a best-effort task due in a minute.
        initial_row(TUF(60.0, 0.05, 1.0), now),
    ]
    p = policy.priorities(QueueView.from_rows(rows), now)
    assert p[1] > p[0]
    # Within responses, PUD's order: the urgent one first.
    both = QueueView.from_rows([initial_row(NORMAL, now - 0.1), initial_row(urgent, now - 0.1)])
    q = policy.priorities(both, now)
    assert q[1] > q[0]


def _gen(key, segment_index, deadline, tokens=0, bound=10):
    return RunningGen(key, 100, tokens, bound, deadline, False, "drone", 0, segment_index)


def _cand(segment_index, blocks=1):
    return Candidate("c", 9, 100, 10, 10, blocks, 5.0, False, segment_index)


def _admission(steps, **kwargs):
    """A ResponseFirstAdmission that has seen `steps` (batch size, seconds) from the engine."""
    adm = ResponseFirstAdmission(speed_model=BatchSpeedModel(), **kwargs)
    for batch, seconds in steps:
        adm.note_step(seconds, batch)
    return adm


def _pass(running, now=0.0, rate=40.0):
    view = QueueView.from_rows([])
    return AdmissionPass(now, view, np.array([], dtype=int), [], list(running), 100, 16, rate)


def test_resumes_are_refused_while_responses_run_on_a_slow_batch():
    # 20 ms at batch 1, +1 ms per sequence: fastest 20 ms, cap 1.5 x 20 = 30 ms -> batch <= 11.
    steps = [(b, 0.020 + 0.001 * (b - 1)) for b in (1, 4, 8, 16, 1, 4, 8, 16)]
    adm = _admission(steps, step_factor=1.5)
    response = _gen("r", 0, deadline=1.0)
    small = [response] + [_gen(f"s{i}", 2, 9.0) for i in range(5)]
    large = [response] + [_gen(f"s{i}", 2, 9.0) for i in range(14)]
    adm.begin_pass(_pass(small))
    assert adm.may_admit_candidate(small, _cand(1), 100)[0]
    adm.begin_pass(_pass(large))
    ok, why = adm.may_admit_candidate(large, _cand(1), 100)
    assert not ok and "resume refused" in why
    # A response is admitted whenever it fits, however large the batch.
    assert adm.may_admit_candidate(large, _cand(0), 100)[0]
    assert not adm.may_admit_candidate(large, _cand(0, blocks=101), 100)[0]
    # No response running (or only one due in a minute): resumes run as fast as the batch allows.
    resumes = [_gen(f"s{i}", 2, 9.0) for i in range(14)] + [_gen("be", 0, deadline=60.0)]
    adm.begin_pass(_pass(resumes))
    assert adm.may_admit_candidate(resumes, _cand(1), 100)[0]
    # Holding the cap between responses: the next response will join this batch.
    held = _admission(steps, step_factor=1.5, cap_between_responses=True)
    held.begin_pass(_pass(resumes))
    ok, why = held.may_admit_candidate(resumes, _cand(1), 100)
    assert not ok and "resume refused" in why
    held.begin_pass(_pass(resumes[:5]))
    assert held.may_admit_candidate(resumes[:5], _cand(1), 100)[0]


def test_running_resumes_are_asked_to_yield_only_while_the_step_is_over_the_cap():
    adm = _admission([(b, 0.020 + 0.001 * (b - 1)) for b in (1, 4, 8, 16)], step_factor=1.5)
    batch = [_gen("r", 0, deadline=1.0), _gen("s", 2, 9.0)]
    # Measured step 50 ms > 30 ms cap: everything ranked below a response yields.
    bar = adm.yield_below(batch, 0.0, rate=1 / 0.050)
    assert bar is not None
    policy = get_policy(WC)
    resume = policy.priorities(QueueView.from_rows([suspended_row(NORMAL, 0.0, 0.5, 1, enqueued_s=0.0)]), 0.0)
    response = policy.priorities(QueueView.from_rows([initial_row(NORMAL, 0.0)]), 0.0)
    assert resume[0] < bar <= response[0]
    assert adm.yield_below(batch, 0.0, rate=1 / 0.025) is None
    assert adm.yield_below([_gen("s", 2, 9.0)], 0.0, rate=1 / 0.050) is None


def test_pauses_preserve_until_the_share_of_kv_is_spent():
    ctx = SchedulerContext("sim", 16, 100, 10)
    policy = WorkConservingTimelyPolicy(preserve_kv_share=0.5)

    def pause(tokens, pinned):
        return PauseInfo(task_id="t", context_tokens=tokens, other_tokens=0, pause_s=1.0,
                         eligible_in_s=1.0, segment_index=1, is_urgent=False, context=ctx,
                         pinned_blocks=pinned)

    assert policy.pause_handling(pause(16 * 50, 0)) == PRESERVE   # 50 of 100 blocks
    assert policy.pause_handling(pause(16 * 50, 10)) == DISCARD   # 60 > 50
    assert policy.pause_handling(pause(16 * 40, 10)) == PRESERVE
    assert policy.pause_handling(pause(16, None)) == DISCARD      # no engine to ask


def test_the_default_policy_keeps_preserved_kv_and_frees_it_at_the_end():
    sch, eng, lis = make(WC, batch_cap=1)
    tasks = [sch.submit(spec(f"t{i}", 1 + i % 3, eng)) for i in range(4)]
    drive(sch, eng, lis)
    assert all(t.state == "done" for t in tasks)
    assert sch.pause_counts[PRESERVE] >= 1
    assert eng.pinned_blocks() == 0
    assert_no_leaks(sch, eng)


def test_the_step_cap_stays_anchored_at_the_fastest_step_in_overload():
    """In overload the batch never gets small. The cap's reference is the fastest step measured
    so far, not the recent steps' line extrapolated to a batch of one: that swung with every
    noisy window (to zero at times, which lifted the cap and let every queued resume in)."""
    rng = np.random.default_rng(3)
    light = [(b, 0.021 + 0.0004 * b) for b in (1, 2, 3)]
    # Overloaded steps: batch 80-100, 50-110 ms, prefill bursts making the slope steep.
    heavy = [(int(b), 0.050 + 0.003 * (b - 80) + float(rng.uniform(0, 0.03)))
             for b in rng.integers(80, 101, size=200)]
    adm = _admission(light + heavy, step_factor=1.5)
    response = _gen("r", 0, deadline=1.0)
    batch = [response] + [_gen(f"s{i}", 2, 9.0) for i in range(90)]
    adm.begin_pass(_pass(batch))
    ok, why = adm.may_admit_candidate(batch, _cand(1), 1000)
    assert not ok and why.endswith(f"over {1.5 * 21.4:.1f} ms while responses run"), why
    # Running resumes yield while the measured step is over it.
    assert adm.yield_below(batch, 0.0, rate=1 / 0.040) is not None
    assert adm.yield_below(batch, 0.0, rate=1 / 0.030) is None
    # The extrapolation the cap used to take does fall to zero on such a window.
    assert adm.speed_model.step_time_s(1) == 0.0
    # Before the engine has run a step there is nothing to cap against.
    fresh = _admission([], step_factor=1.5)
    fresh.begin_pass(_pass([response]))
    assert fresh.may_admit_candidate([response], _cand(1), 1000)[0]


def test_resumes_do_not_yield_for_the_cap_while_a_response_waits_for_kv():
    """A resume that yields while a response waits for KV blocks hands its blocks to that
    response, and its prefix leaves the cache: its resume would recompute its whole context."""
    adm = _admission([(b, 0.020 + 0.001 * (b - 1)) for b in (1, 4, 8, 16)], step_factor=1.5)
    batch = [_gen("r", 0, deadline=1.0), _gen("s", 2, 9.0)]
    slow = 1 / 0.050  # measured step 50 ms, over the 30 ms cap
    adm.begin_pass(_pass(batch, now=1.0))
    ok, why = adm.may_admit_candidate(batch, _cand(0, blocks=8), 4)
    assert not ok and why.startswith("kv blocks")
    assert adm.yield_below(batch, 1.0, rate=slow) is None
    # A resume refused for KV does not lift the cap: only a waiting response does.
    adm.begin_pass(_pass(batch, now=2.0))
    assert not adm.may_admit_candidate(batch, _cand(1, blocks=8), 4)[0]
    assert adm.yield_below(batch, 2.0, rate=slow) is not None
    # Nor does a refusal in an earlier pass.
    assert adm.yield_below(batch, 3.0, rate=slow) is not None


def _holding(now=10.0, **kwargs):
    """An admission controller that has seen 25 ms steps and prices a prefill at 0.1 ms/token
    (first segments: 8 tokens until measured)."""
    hold = PrefillHold(lambda tokens: 1e-4 * tokens, **kwargs)
    adm = _admission([(4, 0.025)] * 4, prefill_hold=hold)
    adm.begin_pass(_pass([], now=now, rate=1 / 0.025))
    return adm


def _response(deadline, prefill_tokens, skill_set=""):
    return Candidate("c", 9, prefill_tokens, 10, prefill_tokens, 1, deadline, False, 0, skill_set)


def test_a_response_due_later_waits_while_one_due_earlier_is_on_its_first_segment():
    adm = _holding()
    urgent = _gen("u", 0, deadline=10.2)
    # 2,000 tokens = 200 ms of prefill: all of the urgent response's 200 ms of slack. The
    # candidate is due in 1 s and needs 0.2 + 8 x 0.025 s alone: it can wait until 10.2 s.
    ok, why = adm.may_admit_candidate([urgent], _response(11.0, 2000), 100)
    assert not ok and why.startswith("response held") and "make u late" in why
    # Held only for a response still on its first segment, due earlier, not yet late.
    assert adm.may_admit_candidate([_gen("u", 1, deadline=10.2)], _response(11.0, 2000), 100)[0]
    assert adm.may_admit_candidate([_gen("u", 0, deadline=11.5)], _response(11.0, 2000), 100)[0]
    assert adm.may_admit_candidate([_gen("u", 0, deadline=9.9)], _response(11.0, 2000), 100)[0]
    # Half-way through its first segment (4 of 8 tokens: done at 10.1 s), a prefill under a
    # tenth of its slack that leaves it on time cannot be what makes it late: no hold.
    halfway = _gen("u", 0, deadline=10.2, tokens=4)
    assert adm.may_admit_candidate([halfway], _response(11.0, 150), 100)[0]
    # A candidate that could not make its own deadline after waiting goes now, if it does not
    # make the earlier one late (done at 10.1 + 0.09 s, due 10.2 s).
    assert adm.may_admit_candidate([halfway], _response(10.45, 900), 100)[0]
    # Switched off, or without a cost profile to price the prefill: nothing is held.
    blind = _admission([(4, 0.025)] * 4)
    blind.begin_pass(_pass([], now=10.0, rate=1 / 0.025))
    assert blind.may_admit_candidate([urgent], _response(11.0, 2000), 100)[0]
    priced = SchedulerContext("sim", 16, 100, 10, profile=EngineProfile())
    assert get_policy(WC).make_admission(priced).prefill_hold is not None
    assert get_policy(WC, prefill_hold_share=None).make_admission(
        priced).prefill_hold is None
    unpriced = SchedulerContext("vllm", 16, 100, 10)
    assert get_policy(WC).make_admission(unpriced).prefill_hold is None
    with pytest.raises(ValueError, match="hold_share"):
        PrefillHold(lambda tokens: 0.0, hold_share=-1.0)
    with pytest.raises(ValueError, match="default_tokens"):
        FirstSegmentLengths(default_tokens=0)


def test_a_response_due_at_the_same_time_waits_if_its_prefill_would_make_the_first_late():
    adm = _holding()
    first = _gen("u1", 0, deadline=10.2, tokens=4)  # 4 more tokens: done at 10.1 s
    # Both fit: 10.1 + 0.06 s. Admitted, and its prefill now shares the coming steps.
    assert adm.may_admit_candidate([first], _response(10.2, 600), 100)[0]
    # A second one would finish the first at 10.1 + 0.06 + 0.06 s, past 10.2 s: it waits.
    ok, why = adm.may_admit_candidate([first], _response(10.2, 600), 100)
    assert not ok and "make u1 late" in why
    # A prefill under a tenth of its slack is within the error of the finish estimate: even a
    # response due exactly when its estimate ends does not hold it.
    assert _holding().may_admit_candidate([_gen("u", 0, deadline=10.2)],
                                          _response(10.2, 150), 100)[0]
    # A response that is late anyway is not protected by holding others.
    assert _holding().may_admit_candidate([_gen("u", 0, deadline=10.15)],
                                          _response(10.15, 600), 100)[0]


def test_first_segments_are_measured_per_skill_set():
    lengths = FirstSegmentLengths(default_tokens=8, smoothing=0.5)
    assert lengths.tokens("drone") == 8
    a = RunningGen("a", 100, 3, 10, 1.0, True, "drone", 0, 0)
    lengths.observe([a])
    lengths.observe([dataclasses.replace(a, tokens_this_run=4, segment_index=1)])
    assert lengths.tokens("drone") == 3  # last seen on its first segment with 3 tokens
    b = RunningGen("b", 100, 5, 10, 1.0, True, "drone", 0, 0)
    lengths.observe([b])
    lengths.observe([])  # gone: paused at a boundary, or done
    assert lengths.tokens("drone") == pytest.approx(4.0)  # 3 + 0.5 x (5 - 3)
    assert lengths.tokens("chat") == 8


def test_holding_long_prefills_gets_an_urgent_task_that_arrives_with_them_out_sooner():
    """Three tasks of one event arrive together: an urgent drone and two normal tasks, each with
    a long scene of its own. Prefilled together, the urgent one waits for all three prompts."""
    def run(**params):
        return urgent_beside_two_scenes(get_policy(WC, **params))

    held_urgent, held_normal = run()
    together_urgent, together_normal = run(prefill_hold_share=None)
    assert held_urgent < 0.75 * together_urgent, (held_urgent, together_urgent)
    # The normal tasks pay for it, within their own deadline (ERT 1 s).
    assert max(held_normal) > max(together_normal) and max(held_normal) < NORMAL.ert_s
