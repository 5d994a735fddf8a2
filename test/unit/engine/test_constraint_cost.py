"""The grammar and session cost per step (core/engine/constraint_cost.py): the timers, the fit,
and the simulated engine charging it (cost_model.constrained_s)."""

from __future__ import annotations

import sys
import types

import pytest

from timelyllm_ros.core.engine import constraint_cost as cc
from timelyllm_ros.core.engine.base import EngineRequest
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine


class _Slow:
    def work(self, x):
        return x + 1


@pytest.fixture
def fake_module(monkeypatch):
    module = types.ModuleType("fake_constrained")
    module.Slow = _Slow
    module.helper = lambda: 7
    monkeypatch.setitem(sys.modules, "fake_constrained", module)
    return module


def test_timers_add_each_call_to_its_kind_and_restore(fake_module):
    original_work, original_helper = _Slow.__dict__["work"], fake_module.helper
    targets = (("fake_constrained", "Slow", "work", "mask"),
               ("fake_constrained", None, "helper", "session"))
    with cc.timers(targets) as spent:
        assert _Slow().work(1) == 2 and fake_module.helper() == 7
        assert spent["mask"] > 0 and spent["session"] > 0
    assert _Slow.__dict__["work"] is original_work and fake_module.helper is original_helper


class _Scripted(SimulatedEngine):
    """Generates a fixed plan per request and calls the timed helper in every step."""

    PLAN = "a b c d e f"

    def add_request(self, request):
        from dataclasses import replace
        super().add_request(replace(request, scripted_text=self.PLAN))

    def step(self):
        sys.modules["fake_constrained"].helper()
        return super().step()


def test_generate_times_the_steps_where_every_plan_samples(fake_module):
    engine = _Scripted()
    prompts = [engine.tokenize("plan one"), engine.tokenize("plan two"),
               engine.tokenize("plan three")]
    gen = cc.generate(engine, prompts, "x", max_tokens=20,
                      targets=(("fake_constrained", None, "helper", "logits"),))
    # Six tokens each: the first with the prefill step (not timed), then five decodes.
    assert gen.steps == 5
    assert all(engine.decode(p) == _Scripted.PLAN for p in gen.plans)
    assert gen.seconds["logits"] > 0 and gen.seconds["session"] == 0
    assert gen.per_seq_step("logits") == pytest.approx(gen.seconds["logits"] / 15)
    assert not engine.has_unfinished_requests()


def _tiny_grammar():
    xgr = pytest.importorskip("xgrammar")
    info = xgr.TokenizerInfo(["a", "b", ";", "</s>"], stop_token_ids=[3])
    return xgr.GrammarCompiler(info).compile_regex("(ab;)+")


def test_walk_times_every_state_of_every_plan():
    grammar = _tiny_grammar()
    states = cc.walk(grammar, [[0, 1, 2, 3], [0, 1, 2, 0, 1, 2, 3]], vocab_size=4, repeats=2)
    assert len(states) == 11 and all(s > 0 for s in states)
    # A token the grammar refuses ends the walk of its plan.
    assert len(cc.walk(grammar, [[0, 0, 1]], vocab_size=4, repeats=1)) == 2


def _fixed_generation():
    gen = cc.Generation([[1, 2], [3, 4]], steps=4)
    gen.seconds.update(logits=0.004, session=0.002)  # over 4 steps x 2 plans
    return gen


def test_measure_skill_set_adds_the_parts(monkeypatch):
    monkeypatch.setattr(cc, "walk", lambda grammar, plans, vocab, repeats: [0.001, 0.003])
    monkeypatch.setattr(cc, "generate", lambda *a, **k: _fixed_generation())
    cost = cc.measure_skill_set(None, lambda regex: None, 4, "drone", [[1]], "x", 10)
    assert cost.mask_and_matcher_s == pytest.approx(0.002)
    assert cost.logits_s == pytest.approx(0.0005) and cost.session_s == pytest.approx(0.00025)
    assert cost.per_seq_s == pytest.approx(0.00275)
    assert (cost.states, cost.plans, cost.slowest_state_s) == (2, 2, 0.003)


def test_profile_charges_constrained_sequences_by_grammar():
    p = EngineProfile(constrained_per_seq_s=0.0005,
                      constrained_grammar_s={"(ld|tk": 0.004, "pick\\(": 0.001})
    assert p.constrained_grammar_s == (("(ld|tk", 0.004), ("pick\\(", 0.001))
    assert p.constrained_seq_s(None) == 0.0 and p.constrained_seq_s("") == 0.0
    assert p.constrained_seq_s("((((ld|tk|a|p)|x);)+") == 0.004
    assert p.constrained_seq_s("tc,30;(?:pick\\(a\\))") == 0.001  # a resume's regex
    assert p.constrained_seq_s("[a-z]+") == 0.0005  # any other grammar
    assert p.charges_constraints and not EngineProfile().charges_constraints
    again = EngineProfile.from_dict(p.to_dict())
    assert again == p


def test_profile_yaml_round_trip(tmp_path):
    p = EngineProfile(constrained_per_seq_s=0.0005, constrained_grammar_s={"(ld|tk": 0.004})
    path = tmp_path / "p.yaml"
    p.to_yaml(path)
    assert EngineProfile.from_yaml(path) == p
    assert EngineProfile.from_yaml(path).constrained_seq_s("((ld|tk)") == 0.004


@pytest.mark.parametrize("bad, message", [
    ({"constrained_per_seq_s": -1.0}, "constrained_per_seq_s"),
    ({"constrained_grammar_s": {"": 0.1}}, "non-empty substring"),
    ({"constrained_grammar_s": {"x": -0.1}}, "finite and >= 0"),
    ({"constrained_grammar_s": 3}, "pairs"),
])
def test_profile_refuses_bad_constraint_costs(bad, message):
    with pytest.raises(ValueError, match=message):
        EngineProfile(**bad)


def _step_durations(profile: EngineProfile, regex: str | None) -> list[float]:
    """Step durations of three requests decoding the same plan together."""
    engine = SimulatedEngine(profile)
    for i in range(3):
        engine.add_request(EngineRequest(f"r{i}", engine.tokenize(f"prompt {i}"), 10,
                                         output_regex=regex, scripted_text="tc,30;mf,50;"))
    durations = []
    while engine.has_unfinished_requests():
        engine.step()
        durations.append(engine.last_step_timing().duration_s)
    return durations


def test_simulated_engine_charges_grammar_work_per_sampling_sequence():
    base = EngineProfile()
    charged = EngineProfile(constrained_per_seq_s=0.001, constrained_grammar_s={"tk": 0.003})
    plain = _step_durations(base, "x")
    constrained = _step_durations(charged, "x")
    assert len(plain) == len(constrained)
    # Every step samples all three sequences (the first with their prefill): 3 x 1 ms more.
    assert [c - p for p, c in zip(plain, constrained)] == pytest.approx([0.003] * len(plain))
    # Their grammar has its own cost: 3 x 3 ms.
    listed = _step_durations(charged, "(tk|x)")
    assert [c - p for p, c in zip(plain, listed)] == pytest.approx([0.009] * len(plain))
    # Unconstrained requests pay nothing, whatever the profile says.
    assert _step_durations(charged, None) == pytest.approx(plain)
