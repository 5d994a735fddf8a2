"""The default policy never keeps the engine idle while work waits: a resume held for the
responses expected to arrive is still run when nothing else would run (family seed 1 member 31
with a 10 s arrival window once held every resume for an hour of virtual time, until the
arrival rates had expired at the next event; the replay then stopped as stuck)."""

from __future__ import annotations

from dataclasses import replace

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.family import draw_member
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.lrtrace.workload import compose


def test_resumes_held_for_arrivals_run_once_the_engine_would_be_idle():
    member = draw_member(1, 31)
    events = compose(member.workload)
    config = BenchConfig(profile=member.profile,
                         policy_params={"timelyllm-pred": {"arrival_window_s": 10.0}})
    config = replace(config, max_stall_s=120.0)
    run = run_policy(events, "timelyllm-pred", member.workload, config)
    assert all(t.state in ("done", "failed", "cancelled") for t in run.tasks)
    assert len(run.tasks) == sum(len(e.tasks) for e in events)
    # Nothing waited for an expired arrival window: the last task ends within minutes of the
    # last arrival, not at the next far-off timer.
    assert run.last_step_s - run.last_arrival_s < 120.0, (run.last_arrival_s, run.last_step_s)
