import math

import numpy as np
import pytest

from timelyllm_ros.core.exec_model import (ExecModelConfigError, ExecutionTimeModel)
from timelyllm_ros.core.skills.base import SkillCall


@pytest.fixture(scope="module")
def model():
    return ExecutionTimeModel.from_yaml()


def C(name, *args):
    return SkillCall(name, tuple(str(a) for a in args))


def test_tello_linear(model):
    assert model.estimate_min(C("move_forward", 50)) == pytest.approx(1.0 + 50 / 50)
    assert model.estimate_min(C("move_backward", -100)) == pytest.approx(3.0)  # |arg|
    assert model.estimate_min(C("turn_cw", 90)) == pytest.approx(1.0 + 90 * 0.0111)
    assert model.estimate_min(C("delay", 500)) == pytest.approx(0.5)


def test_non_numeric_arg_falls_back_to_fixed(model):
    assert model.estimate_min(C("move_forward", "_1")) == pytest.approx(1.0)
    assert model.estimate_min(C("move_forward")) == pytest.approx(1.0)


def test_constants_empirical_reading_default(model):
    assert model.estimate_min(C("is_visible", "bottle")) == pytest.approx(0.3)
    assert model.estimate_min(C("pick", "cyan_box")) == pytest.approx(4.0)
    assert model.estimate_min(C("place", "a", "b")) == pytest.approx(4.0)
    assert model.estimate_min(C("sweeping", "bottle")) == pytest.approx(1.5)  # fastest case
    # 10 words at 300 words/min = 2 s
    assert model.estimate_min(C("say", "one two three four five six seven eight nine ten")) == \
        pytest.approx(2.0)
    assert model.estimate_min(C("teleport", "moon")) == pytest.approx(1.0)  # default entry


def test_samples(model):
    rng = np.random.default_rng(1)
    xs = [model.sample(C("move_forward", 50), rng) for _ in range(2000)]
    assert np.median(xs) == pytest.approx(2.0, rel=0.03)  # lognormal jitter, median 1
    assert min(xs) != max(xs)
    sweeps = {model.sample(C("sweeping", "x"), rng) for _ in range(500)}
    assert sweeps <= {1.5, 3.0, 4.5, 6.0, 7.5, 9.0, 10.5, 12.0} and len(sweeps) > 4
    assert model.sample(C("log", "hi"), rng) == 0.05  # no jitter configured


def test_segments(model):
    calls = [C("move_forward", 50), C("turn_cw", 90), C("is_visible", "x")]
    assert model.estimate_segment_min(calls) == pytest.approx(2.0 + 1.999 + 0.3)
    rng = np.random.default_rng(0)
    assert model.sample_segment(calls, rng) > 0
    assert model.estimate_segment_min([]) == 0


def test_observe_overrides_minimum_for_exact_call():
    m = ExecutionTimeModel.from_yaml()
    call = C("move_forward", 50)
    m.observe(call, 2.5)
    assert m.estimate_min(call) == 2.5
    m.observe(call, 1.7)
    m.observe(call, 3.0)
    assert m.estimate_min(call) == 1.7 and m.observed_min(call) == 1.7
    assert m.estimate_min(C("move_forward", 60)) == pytest.approx(2.2)  # other args unaffected
    with pytest.raises(ValueError):
        m.observe(call, -1)
    seg = [C("pick", "a"), C("place", "a", "b")]
    m.observe_segment(seg, 6.5)
    assert m.estimate_segment_min(seg) == 6.5
    m.observe_segment([C("check", "a")], 0.4)
    assert m.estimate_min(C("check", "a")) == 0.4


def _load(tmp_path, text):
    p = tmp_path / "em.yaml"
    p.write_text(text)
    return ExecutionTimeModel.from_yaml(p), str(p)


@pytest.mark.parametrize("text,key", [
    ("skills:\n  x: {kind: constant, seconds: 1}\n", "skills.default"),
    ("skills:\n  default: {kind: warp, seconds: 1}\n", "skills.default.kind"),
    ("skills:\n  default: {kind: constant}\n", "skills.default.seconds"),
    ("skills:\n  default: {kind: constant, seconds: -1}\n", "skills.default.seconds"),
    ("skills:\n  default: {kind: constant, seconds: 1}\n  mf: {kind: linear, fixed_s: 1, per_unit_s: x}\n",
     "skills.mf.per_unit_s"),
    ("skills:\n  default: {kind: constant, seconds: 1, speed: 2}\n", "skills.default.speed"),
    ("skills:\n  default: {kind: empirical, samples: []}\n", "skills.default.samples"),
    ("skills:\n  default: {kind: linear, fixed_s: 1, per_unit_s: 1, arg: -1}\n", "skills.default.arg"),
    ("skills:\n  default: {kind: reading, words_per_minute: 0}\n", "skills.default.words_per_minute"),
    ("skills:\n  default: {kind: constant, seconds: .nan}\n", "skills.default.seconds"),
    ("skills: [1]\n", "skills"),
    ("version: 2\nskills: {}\n", "version"),
    ("colours: 1\nskills: {}\n", "colours"),
    ("skills: {default: [unclosed\n", "<yaml>"),
])
def test_config_errors_name_file_and_key(tmp_path, text, key):
    with pytest.raises(ExecModelConfigError) as info:
        _load(tmp_path, text)
    assert info.value.key == key
    assert "em.yaml" in str(info.value) and key in str(info.value)


def test_shipped_config_covers_skill_families(model):
    names = set(model.names())
    assert {"move_forward", "move_backward", "move_left", "move_right", "move_up", "move_down",
            "turn_cw", "turn_ccw", "delay", "is_visible", "sweeping", "pick", "place", "move",
            "check", "say"} <= names
    assert all(math.isfinite(model.estimate_min(C(n, 10))) for n in names)


def test_longest_estimate_covers_a_full_sweep_and_every_sample(model):
    sweep = [C("sweeping", "cat")]
    assert model.estimate_segment_min(sweep) == pytest.approx(1.5)   # found at the first step
    # A full turn, as the simulated drone runs TypeFly's definition (config max_s).
    assert model.estimate_segment_max(sweep) == pytest.approx(14.4)
    assert model.estimate_segment_max([C("sweeping_abstract", "a tool")]) == pytest.approx(24.0)
    # Without jitter longest == minimum; jitter (sigma 0.1) stretches it by e^(3 sigma).
    assert model.estimate_segment_max([C("log", "hi")]) == pytest.approx(0.05)
    assert model.estimate_segment_max([C("move_forward", 50)]) == pytest.approx(2.0 * math.exp(0.3))
    rng = np.random.default_rng(0)
    for call in (C("sweeping", "cat"), C("move_forward", 100), C("turn_cw", 45)):
        upper = model.estimate_segment_max([call])
        assert upper >= model.estimate_segment_min([call])
        assert all(model.sample(call, rng) <= upper + 1e-9 for _ in range(500)), call


def test_longest_estimate_bounds_the_simulated_drones_full_sweeps(model):
    """What the planner waits for covers what the drone-sim takes when the object is absent."""
    from timelyllm_ros.robots.factory import make_backend

    for segment, call in (("_1=s,unicorn;", C("sweeping", "unicorn")),
                          ("_1=sa,'a unicorn';", C("sweeping_abstract", "a unicorn"))):
        outcome = make_backend("drone-sim", time_scale=0.0).interpreter().run_segment(segment)
        assert outcome.success and outcome.duration_s > 12.0, (segment, outcome.message)
        assert model.estimate_segment_max([call]) >= outcome.duration_s - 1e-9
