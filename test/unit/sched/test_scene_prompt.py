"""A robot's scene goes into its task's prompt (TypeFly's scene description), after the shared
system prompt, so the prefix cache still serves every task the same prefix."""

from __future__ import annotations

from dataclasses import replace

from fakes import EXEC_MODEL_PATH, SKILL_SETS, Listener, spec
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.sched.scheduler import SegmentScheduler
from timelyllm_ros.core.skills.skillset import SkillSet

SCENE = "[chair_13 x:0.48 y:0.44 width:0.07 height:0.15]"


def test_scene_line_comes_before_the_task_in_the_user_message():
    drone: SkillSet = SKILL_SETS["drone"]
    plain = drone.render_messages("find the chair")
    with_scene = drone.render_messages("find the chair", SCENE)
    assert with_scene[0] == plain[0]   # the system prompt: the shared prefix
    assert with_scene[1]["content"] == f"Scene: {SCENE}\n" + plain[1]["content"]
    templated = replace(drone, user_template="Objects: {scene}\nTask: {instruction}")
    assert templated.render_messages("go", SCENE)[1]["content"] == f"Objects: {SCENE}\nTask: go"
    assert templated.render_messages("go")[1]["content"] == "Objects: \nTask: go"


def test_a_task_with_a_scene_is_prompted_with_it_and_shares_the_system_prefix():
    engine = SimulatedEngine()
    sch = SegmentScheduler(engine, get_policy("timelyllm"), SKILL_SETS,
                           ExecutionTimeModel.from_yaml(EXEC_MODEL_PATH), Listener())
    base = spec("plain", 1, engine)
    sch.submit(base)
    sch.submit(replace(base, task_id="seen", scene=SCENE))
    plain, seen = sch.tasks["plain"].prompt_ids, sch.tasks["seen"].prompt_ids
    assert SCENE in engine.decode(seen) and SCENE not in engine.decode(plain)
    system = engine.render_chat([{"role": "system",
                                  "content": SKILL_SETS["drone"].system_prompt}])[:-1]
    assert seen[:len(system)] == plain[:len(system)] == system
