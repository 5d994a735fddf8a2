"""Robot results flow into the resumed plan (skill-set option `observations`, on for the drone;
core/sched/observations.py): a generation stops after a segment that stores a skill result,
waits for the robot's report out of the queue, and resumes with the report in its context, so
what comes next can depend on what the robot saw."""

from __future__ import annotations

import dataclasses

from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.policies.registry import DEFAULT_POLICY
from timelyllm_ros.core.sched.observations import observation_text
from timelyllm_ros.core.skills import MINISPEC

from fakes import SKILL_SETS, Robots, assert_no_leaks, drive, make, spec, states

FOUND, NOT_FOUND = "o,cat;a;", "l,'no cat';ld;"


class SeeingEngine(SimulatedEngine):
    """A scripted engine that, like a model, continues from what its context says: after
    `_1=s,cat;` it writes FOUND if the robot reported `_1=True`, else NOT_FOUND."""

    def _script(self, request: EngineRequest) -> EngineRequest:
        context = self.decode(request.prompt_token_ids).rstrip()
        if context.endswith("_1=True"):
            return dataclasses.replace(request, scripted_text=FOUND)
        if context.endswith("_1=False"):
            return dataclasses.replace(request, scripted_text=NOT_FOUND)
        return request

    def add_request(self, request: EngineRequest) -> None:
        super().add_request(self._script(request))

    def resume_request(self, request_id: str, request: EngineRequest) -> None:
        super().resume_request(request_id, self._script(request))


def _run(seen: bool):
    engine = SeeingEngine()
    sch, eng, lis = make(DEFAULT_POLICY, engine=engine, skill_sets=SKILL_SETS)
    task = sch.submit(dataclasses.replace(spec("cat", 1, eng),
                                          scripted_plan="_1=s,cat;" + NOT_FOUND))
    robots = Robots(values=lambda tid, seg: {"_1": seen} if seg.sequence == 0 else None)
    drive(sch, eng, lis, robots)
    return sch, eng, lis, task


def test_the_option_is_on_for_the_drone_and_segments_know_what_they_store():
    assert SKILL_SETS["drone"].observations and not SKILL_SETS["arm"].observations
    assert MINISPEC.parse("_1=s,cat;?_1==True{_2=ox,cat};").binds == ("_1", "_2")
    assert MINISPEC.parse("mf,10;tc,90;").binds == ()
    assert observation_text({"_1": False, "_2": 0.42, "returned": None}) == "\n# ok _1=False _2=0.42\n"


def test_the_continuation_depends_on_what_the_robot_saw():
    plans = {}
    for seen in (True, False):
        sch, eng, lis, task = _run(seen)
        assert task.state == "done", task.lifecycle.reason
        plans[seen] = "".join(lis.texts("cat"))
        # The report is in the context the generation resumed with, right after `_1=s,cat;`.
        assert task.observations and task.observation_tokens > 0
        context = eng.decode(task.context_ids())
        assert f"_1=s,cat;\n# ok _1={seen}\n" in context
        assert task.resumes == 1
        assert_no_leaks(sch, eng)
    assert plans[True] == "_1=s,cat;" + FOUND and plans[False] == "_1=s,cat;" + NOT_FOUND


def test_the_generation_waits_out_of_the_queue_for_the_report():
    engine = SeeingEngine()
    sch, eng, lis = make(DEFAULT_POLICY, engine=engine, skill_sets=SKILL_SETS)
    task = sch.submit(dataclasses.replace(spec("cat", 1, eng),
                                          scripted_plan="_1=s,cat;" + NOT_FOUND))
    # Never report: the generation must not resume on its own.
    drive(sch, eng, lis, Robots(lambda tid, seg: None),
          until=lambda s: len(task.segments) == 1 and task.state == "suspended")
    for _ in range(50):
        sch.tick()
    assert task.state == "suspended" and task.awaiting_report == 0 and len(task.segments) == 1
    assert sch.queue_length() == 0 and sch.running_request_ids() == []
    # The work-conserving default would not have suspended a lone generation: this one waits
    # because the next statement depends on the report.
    assert "suspended" in states(task)


def test_a_report_without_values_resumes_without_an_observation():
    sch, eng, lis = make(DEFAULT_POLICY, skill_sets=SKILL_SETS)
    task = sch.submit(spec("plain", 1, eng))
    drive(sch, eng, lis)
    assert task.state == "done" and task.observations == [] and task.resumes >= 1
    assert_no_leaks(sch, eng)


def test_without_the_option_nothing_waits():
    sch, eng, lis = make(DEFAULT_POLICY)   # the scheduling tests' skill sets: option off
    task = sch.submit(spec("plain", 1, eng))
    drive(sch, eng, lis, Robots(values=lambda tid, seg: {"_1": True}))
    assert task.state == "done" and task.observations == [] and task.resumes == 0
