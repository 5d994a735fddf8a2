"""Preemption by recompute from outside the engine (BROS's "yield BE blocks to RT" on a paged KV):
the scheduler aborts a running best-effort generation so that a real-time one gets its KV, queues
it again, and resumes it from its token ids."""

from __future__ import annotations

import dataclasses

import pytest

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.lifecycle import IllegalTransition, TaskLifecycle
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.task import TaskSpec
from timelyllm_ros.core.tuf import TUF

from fakes import LEVELS, assert_no_leaks, drive, make, spec, states

# Best-effort chat: nobody waits on it (BROS classifies it BE while its slack exceeds 5 s).
BACKGROUND = TUF(60.0, 0.05, 1.0)


def _word(i: int) -> str:
    # Letters only: one token each for the simulated engine's tokenizer (digits split in 3s).
    out = ""
    while True:
        i, r = divmod(i, 26)
        out += "abcdefghijklmnopqrstuvwxyz"[r]
        if i == 0:
            return "q" + out


def _words(n: int, offset: int) -> str:
    return " ".join(_word(offset + i) for i in range(n))


def _sentences(count: int, words: int, offset: int) -> str:
    return " ".join(_words(words, offset + k * words).capitalize() + "." for k in range(count))


def _chat(task_id: str, engine, *, tuf=BACKGROUND, urgency="", prompt_words=200, offset=0,
          sentences=4, words=40):
    return TaskSpec(task_id, f"speaker_{task_id}", "chat", _words(prompt_words, offset), tuf,
                    engine.now(), urgency, scripted_plan=_sentences(sentences, words, offset))


def _tight_engine(blocks: int = 36) -> SimulatedEngine:
    profile = dataclasses.replace(EngineProfile(), kv_total_blocks=blocks)
    return SimulatedEngine(profile, scheduling_policy="priority")


def _run(displace: bool):
    """Two long best-effort chats fill the KV; an urgent reply arrives while they decode."""
    policy = "bros-recompute"
    engine = _tight_engine()
    sch, eng, lis = make(policy, engine=engine)
    sch.policy.displace_be = displace
    sch.admission.controller.displaces = displace  # the controller read it when it was built
    for i in range(2):
        sch.submit(_chat(f"be{i}", eng, offset=1000 * (i + 1)))
    drive(sch, eng, lis, until=lambda s: all(
        len(s.tasks[f"be{i}"].generated.token_ids) >= 20 for i in range(2)))
    urgent = sch.submit(_chat("rt", eng, tuf=LEVELS.get("urgent"), urgency="urgent",
                              prompt_words=60, offset=9000, sentences=1, words=12))
    drive(sch, eng, lis)
    return sch, eng, lis, urgent


def test_urgent_work_preempts_best_effort_and_everything_completes_intact():
    sch, eng, lis, urgent = _run(displace=True)
    be = [sch.tasks["be0"], sch.tasks["be1"]]
    assert sch.preemptions >= 1 and sum(t.preemptions for t in be) == sch.preemptions
    victim = next(t for t in be if t.preemptions)
    # generating -> queued (preempt) -> generating (admitted again), mid-segment.
    history = states(victim)
    i = history.index("queued", 2)
    assert history[i - 1] == "generating" and history[i + 1] == "generating"
    for t in [*be, urgent]:
        assert t.state == "done"
        # Chat has no output grammar: the preempted run kept every token, so the spoken text
        # is exactly the plan, nothing lost or said twice.
        assert " ".join(lis.texts(t.task_id)).split() == t.spec.scripted_plan.split()
    # Resumed from its token ids: the prefix cache served the blocks it had computed.
    assert victim.cached_tokens_total > 0
    assert_no_leaks(sch, eng)


def _alone() -> float:
    """The urgent reply's response time on an idle engine: the best any policy can do."""
    sch, eng, lis = make("bros-recompute", engine=_tight_engine())
    task = sch.submit(_chat("rt", eng, tuf=LEVELS.get("urgent"), urgency="urgent",
                            prompt_words=60, offset=9000, sentences=1, words=12))
    drive(sch, eng, lis)
    return task.response_time_s


def test_preemption_shortens_the_urgent_response():
    with_preemption = _run(displace=True)[3].response_time_s
    without = _run(displace=False)[3].response_time_s
    alone = _alone()
    # With it the urgent reply is served about as fast as on an idle engine; without it, it
    # waits for a best-effort chat to reach a sentence boundary and give up its blocks.
    assert with_preemption < 1.5 * alone
    assert without > 2 * alone


def test_grammar_language_restarts_the_statement_in_progress():
    sch, eng, lis = make("timelyllm")
    task = sch.submit(spec("d1", 1, eng))
    plan = task.spec.scripted_plan
    # Run until the generation is mid-statement: text past the last boundary, not suspended.
    drive(sch, eng, lis, until=lambda s: task.state == "generating"
          and len(task.generated.pending_text) >= 2)
    kept_before = task.generated.consumed
    sch.book.preempt(task, eng.now())
    assert task.state == "queued" and task.engine_request_id is None
    # A grammar can only be entered at a statement boundary: the partial statement is gone.
    assert task.generated.text + task.owed_text == plan[:kept_before]
    assert task.generated.pending_text == ""
    drive(sch, eng, lis)
    assert task.state == "done" and "".join(lis.texts("d1")) == plan
    assert_no_leaks(sch, eng)


def test_displacement_names_only_best_effort_work_and_only_what_is_needed():
    sch, eng, lis, _ = _run(displace=True)
    # The urgent task itself was never preempted, and one victim made enough room.
    assert sch.tasks["rt"].preemptions == 0
    assert sum(sch.tasks[f"be{i}"].preemptions for i in range(2)) == 1


def test_preempt_is_legal_only_while_generating():
    life = TaskLifecycle(0.0, "t")
    with pytest.raises(IllegalTransition):
        life.preempt(0.1)
    life.accept(0.1)
    life.admit(0.2)
    assert life.preempt(0.3) == "queued"
    assert life.admit(0.4) == "generating"
    life.suspend(0.5)
    with pytest.raises(IllegalTransition):
        life.preempt(0.6)


def test_bros_picks_priority_engine_scheduling_and_others_keep_fcfs():
    assert get_policy("bros-recompute").engine_scheduling == "priority"
    assert get_policy("timelyllm-bros").engine_scheduling == "priority"
    assert get_policy("timelyllm").engine_scheduling == "fcfs"
    with pytest.raises(ValueError, match="engine_scheduling"):
        get_policy("timelyllm", engine_scheduling="random")
