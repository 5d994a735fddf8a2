"""What the scheduler takes from the engine's outputs and capabilities: an error ends the task
with the engine's reason; the engine's own pause path applies when a policy has no opinion; the
recompute count of a resume is recorded."""

from __future__ import annotations

import dataclasses

from timelyllm_ros.core.engine.base import DISCARD, PRESERVE
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine

from fakes import assert_no_leaks, drive, make, spec


class SessionLikeEngine(SimulatedEngine):
    """The simulated engine declaring what the vLLM engine with sessions declares."""

    def capabilities(self):
        return dataclasses.replace(super().capabilities(), default_pause_handling=PRESERVE)

    def step(self):
        outputs = super().step()
        for out in outputs:
            if out.num_cached_tokens is not None:
                out.recomputed_tokens = 1
        return outputs


class DyingEngine(SimulatedEngine):
    def step(self):
        outputs = super().step()
        for out in outputs:
            out.error = "server http://gpu-2:8000 went away"
            out.finished = True
            out.finish_reason = "error"
        return outputs


def test_a_policy_without_an_opinion_gets_the_engines_own_pause_path():
    sch, eng, lis = make("timelyllm", engine=SessionLikeEngine())
    task = sch.submit(spec("a", 1, eng))
    drive(sch, eng, lis)
    assert task.state == "done" and task.resumes >= 1
    assert sch.pause_counts[PRESERVE] == task.resumes and sch.pause_counts[DISCARD] == 0
    assert task.recomputed_tokens_total == task.resumes  # one per resume, as reported
    assert_no_leaks(sch, eng)


def test_the_plain_simulated_engine_still_discards():
    sch, eng, lis = make("timelyllm")
    task = sch.submit(spec("a", 1, eng))
    drive(sch, eng, lis)
    assert sch.pause_counts[PRESERVE] == 0 and sch.pause_counts[DISCARD] == task.resumes >= 1


def test_an_engine_error_fails_the_task_with_its_reason_and_frees_it():
    sch, eng, lis = make("timelyllm", engine=DyingEngine())
    task = sch.submit(spec("a", 1, eng))
    drive(sch, eng, lis)
    assert task.state == "failed" and "went away" in task.lifecycle.reason
    last = [s for s in lis.statuses if s.task_id == "a"][-1]
    assert last.state == "failed" and "engine:" in last.reason
    assert_no_leaks(sch, eng)
