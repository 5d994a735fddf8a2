"""The wait for a request's grammar (EngineProfile.grammar_init_s): the simulated engine admits a
constrained request no earlier than its grammar is ready (sim/requests.py), as vLLM does, and
`constraint_cost.measure_grammar_wait` measures it on any engine."""

from __future__ import annotations

import pytest

from timelyllm_ros.core.engine import constraint_cost as cc
from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.cost_model import EngineProfile, EngineProfileError
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine

WAIT = 0.005  # shorter than a step of the default profile (~23 ms)
REGEX = "(a|b)+"


def _engine(wait: float = WAIT) -> SimulatedEngine:
    return SimulatedEngine(EngineProfile(grammar_init_s=wait), start_time=1.0)


def _add(engine, rid, constrained=True, text="one two three four"):
    engine.add_request(EngineRequest(rid, engine.tokenize(f"prompt of {rid}"), 8,
                                     output_regex=REGEX if constrained else None,
                                     scripted_text=text))


def _first_output_step(engine, rid, limit=20):
    for i in range(limit):
        if any(o.request_id == rid and o.new_token_ids for o in engine.step()):
            return i
    raise AssertionError(f"{rid} produced nothing in {limit} steps")


def test_profile_field_defaults_to_zero_and_rejects_negative():
    assert EngineProfile().grammar_init_s == 0.0
    assert EngineProfile.from_dict({"grammar_init_s": 0.01}).grammar_init_s == 0.01
    with pytest.raises(EngineProfileError, match="grammar_init_s"):
        EngineProfile.from_dict({"grammar_init_s": -1})


def test_idle_engine_waits_for_the_grammar_then_prefills():
    plain, waiting = _engine(0.0), _engine()
    for engine in (plain, waiting):
        _add(engine, "a")
        engine.step()
    # The same step, started WAIT later.
    assert waiting.now() - plain.now() == pytest.approx(WAIT)


def test_plain_request_does_not_wait():
    plain, waiting = _engine(0.0), _engine()
    for engine in (plain, waiting):
        _add(engine, "a", constrained=False)
        engine.step()
    assert waiting.now() == pytest.approx(plain.now())


def test_constrained_request_added_to_a_busy_engine_misses_the_next_step():
    for constrained, missed in ((True, 1), (False, 0)):
        engine = _engine()
        _add(engine, "runner", constrained=False, text="x " * 30)
        engine.step()
        _add(engine, "late", constrained=constrained)
        assert _first_output_step(engine, "late") == missed


def test_grammars_are_ready_one_after_another():
    # Three added at once to an idle engine: the first one's grammar is ready after WAIT, the
    # next two after 2 and 3 WAIT, so the first step (which starts at WAIT) computes only the
    # first; the others join in the next step (which starts after 3 WAIT: the first step is
    # longer than 2 WAIT).
    engine = _engine()
    for rid in ("a", "b", "c"):
        _add(engine, rid)
    first = engine.step()
    assert [o.request_id for o in first] == ["a"]
    assert {o.request_id for o in engine.step()} == {"a", "b", "c"}


def _resumed_after(handling: str):
    """An engine whose constrained request "a" ran three steps, was suspended with `handling`
    and resumed; returns (engine, clock before the resumed request's first step)."""
    engine = _engine()
    _add(engine, "a", text="one two three four five six")
    for _ in range(3):
        engine.step()
    engine.suspend_request("a", handling)
    prompt = engine.tokenize("prompt of a") + engine.tokenize("one two three")
    engine.resume_request("a", EngineRequest("a#1", prompt, 8, output_regex=REGEX,
                                             scripted_text=" four five six"))
    return engine, engine.now()


def test_preserved_resume_keeps_its_grammar():
    engine, before = _resumed_after("preserve")
    engine.step()
    assert engine.last_step_timing().batch_size == 1
    assert engine.now() - before == pytest.approx(engine.last_step_timing().duration_s)


def test_measure_grammar_wait_on_a_simulated_engine():
    engine = _engine()
    prompts = [engine.tokenize("first prompt"), engine.tokenize("second prompt")]
    got = cc.measure_grammar_wait(engine, prompts, REGEX, repeats=2, together=3,
                                  clock=engine.now, sleep=lambda s: engine.advance_idle(engine.now() + s))
    assert got.idle_s == pytest.approx([WAIT] * 4)
    assert got.plain_idle_s == pytest.approx([0.0] * 4)
    assert got.busy_missed == [1] * 4 and got.plain_busy_missed == [0] * 4
    assert got.together_missed == [[0, 1, 1]] * 2
    assert got.median_idle_s == pytest.approx(WAIT)


def test_discarded_resume_waits_for_a_new_grammar():
    engine, before = _resumed_after("discard")
    engine.step()
    assert engine.now() - before == pytest.approx(WAIT + engine.last_step_timing().duration_s)
