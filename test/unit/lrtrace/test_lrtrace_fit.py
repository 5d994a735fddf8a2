"""`lrtrace fit`: recovering known execution-time parameters from synthetic recordings.

Synthetic truth: move_forward = 1.0 s + 0.02 s/cm, turn_cw = 0.8 s + 1/90 s/deg, both with a
lognormal factor exp(N(0, 0.03)); sweeping drawn from {1.5, 3.0, ..., 12.0} s; is_visible
~0.3 s. The data go through a real bag (rosbags writer, no ROS needed), the timing table, the
fit and the written YAML, which must load with ExecutionTimeModel.from_yaml.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.lrtrace import bag as bagmod
from timelyllm_ros.lrtrace import fit as fitmod
from timelyllm_ros.lrtrace import fit_output
from timelyllm_ros.lrtrace import message_types as msgtypes
from timelyllm_ros.lrtrace.timing_table import TimingRow, build_rows, read_csv, table_from_bag, write_csv

TRUE = {
    "move_forward": (1.0, 0.02, [20, 50, 80, 100, 150, 200, 300, 400, 500]),
    "turn_cw": (0.8, 1 / 90, [15, 30, 45, 90, 135, 180, 270, 360]),
}
SWEEP = [1.5 * k for k in range(1, 9)]
SIGMA = 0.03


def _time(store, seconds: float):
    sec = math.floor(seconds)
    return store.types["builtin_interfaces/msg/Time"](sec=int(sec), nanosec=int(round((seconds - sec) * 1e9)) % 10**9)


def synthetic_bag(path, *, seed: int = 7, n_linear: int = 40, n_sweep: int = 30, extra_calls=()):
    """Write a bag of (segment, report) pairs drawn from the synthetic truth; returns its dir."""
    rng = np.random.default_rng(seed)
    store = msgtypes.typestore()
    Seg = store.types[msgtypes.SEGMENT_TYPE]
    Rep = store.types[msgtypes.REPORT_TYPE]
    t = 1000.0
    plan: list[tuple[list[str], float]] = []
    for skill, (fixed, per, xs) in TRUE.items():
        for _ in range(n_linear):
            x = int(rng.choice(xs))
            plan.append(([f"{skill}({x})"], (fixed + per * x) * math.exp(rng.normal(0, SIGMA))))
    for _ in range(n_sweep):
        plan.append((["sweeping(bottle)"], float(rng.choice(SWEEP)) + float(rng.uniform(0, 0.01))))
        plan.append((["is_visible(cat)"], 0.3 + float(rng.uniform(0, 0.05))))
    for _ in range(10):  # multi-call segments: not used per skill, checked against the fit
        plan.append((["move_forward(100)", "turn_cw(90)"], (3.0 + 1.8) * math.exp(rng.normal(0, SIGMA))))
    plan.extend(extra_calls)
    with bagmod.BagWriter(path) as w:
        for i, (calls, dur) in enumerate(plan):
            task, robot = f"task{i // 3}", f"drone_{i % 4}"
            seq = i % 3
            w.write(f"/{robot}/skill_segments", Seg(
                task_id=task, robot_id=robot, sequence=seq, text=";".join(calls), calls=calls,
                is_last=False, estimated_execution_s=1.0, stamp=_time(store, t)), int(t * 1e9))
            w.write(f"/{robot}/execution_reports", Rep(
                task_id=task, robot_id=robot, sequence=seq, started=_time(store, t + 0.01),
                finished=_time(store, t + 0.01 + dur), success=True, message=""),
                int((t + dur + 0.02) * 1e9))
            t += dur + 0.1
    return w.bag_dir


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("fit")
    bag_dir = synthetic_bag(d / "synthetic.mcap")
    build, _ = table_from_bag(bag_dir)
    result = fitmod.fit_rows(build.rows, source="synthetic")
    out = fit_output.write_model(result, d / "model.yaml")
    return result, out, build


def test_linear_parameters_are_recovered(fitted):
    result, _, _ = fitted
    for skill, (fixed, per, _) in TRUE.items():
        f = result.fits[skill]
        assert f.kind == "linear" and f.n == 40
        assert abs(f.fixed_s - fixed) < 0.08, (skill, f.fixed_s)
        assert abs(f.per_unit_s - per) / per < 0.04, (skill, f.per_unit_s)
        assert f.r2 > 0.98 and f.rmse < 0.3
        # jitter_sigma estimates the lognormal noise the data were drawn with
        assert abs(f.jitter_sigma - SIGMA) < 0.012, (skill, f.jitter_sigma)


def test_empirical_distributions_are_recovered(fitted):
    result, _, _ = fitted
    sweep = result.fits["sweeping"]
    assert sweep.kind == "empirical" and sweep.n == 30
    assert abs(sweep.minimum_s - 1.5) < 0.02 and max(sweep.samples) <= 12.01
    assert sorted(sweep.samples) == list(sweep.samples)
    vis = result.fits["is_visible"]  # non-numeric argument -> empirical
    assert vis.kind == "empirical" and 0.29 < vis.minimum_s < 0.36


def test_written_model_loads_and_drives_scheduler_and_sampler(fitted):
    result, path, _ = fitted
    model = ExecutionTimeModel.from_yaml(path)
    mf = SkillCall("move_forward", ("100",))
    assert abs(model.estimate_min(mf) - 3.0) < 0.1  # fitted line, no jitter
    sw = SkillCall("sweeping", ("bottle",))
    assert abs(model.estimate_min(sw) - 1.5) < 0.02  # fastest observed sample
    rng = np.random.default_rng(0)
    draws = np.array([model.sample(mf, rng) for _ in range(2000)])
    assert abs(np.median(draws) - 3.0) < 0.1
    assert abs(np.std(np.log(draws)) - SIGMA) < 0.015
    # skills not recorded keep the base entries; the default model is there
    base = ExecutionTimeModel.from_yaml(fitmod.default_base_path())
    pick = SkillCall("pick", ("cube",))
    assert model.estimate_min(pick) == base.estimate_min(pick)
    text = path.read_text()
    assert text.startswith("# Execution-time model fitted by `timelyllm lrtrace fit`")
    assert "&id" not in text and "*id" not in text  # no YAML aliases
    spec = yaml.safe_load(text)["skills"]["move_forward"]
    assert spec["kind"] == "linear" and "RMSE" in spec["note"] and "n=40" in spec["note"]


def test_multi_call_segments_check_the_fit(fitted):
    result, _, _ = fitted
    assert result.rows_multi == 10
    n, ratio = result.multi_check
    assert n == 10 and abs(ratio - 1.0) < 0.05


def test_summary_and_plots(fitted, tmp_path):
    result, _, _ = fitted
    text = fit_output.format_summary(result)
    for word in ("move_forward", "turn_cw", "sweeping", "RMSE", "R2", "linear", "empirical",
                 "multi-call check"):
        assert word in text
    paths = fit_output.plot_fits(result, tmp_path / "plots")
    names = {p.name for p in paths}
    assert {"move_forward.png", "turn_cw.png", "sweeping.png", "is_visible.png"} <= names
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000 for p in paths)


def test_table_csv_round_trip_gives_the_same_fit(fitted, tmp_path):
    result, _, build = fitted
    csv_path = write_csv(build.rows, tmp_path / "t.csv")
    again = fitmod.fit_rows(read_csv(csv_path), source="csv")
    for skill, f in result.fits.items():
        g = again.fits[skill]
        assert g.kind == f.kind and g.n == f.n
        assert math.isclose(g.fixed_s, f.fixed_s, abs_tol=1e-6)
        assert math.isclose(g.per_unit_s, f.per_unit_s, abs_tol=1e-8)


# --- too few samples -----------------------------------------------------------------------------

def _rows(skill: str, args_durations) -> list[TimingRow]:
    return [TimingRow(skill=skill, arguments=str(a), robot="r", task_id=f"{skill}{i}", sequence=0,
                      start=10.0 * i, finish=10.0 * i + d, duration=d, success=True)
            for i, (a, d) in enumerate(args_durations)]


def test_too_few_samples_names_each_skill_and_count():
    rows = (_rows("move_left", [(50, 2.0), (100, 3.0)])
            + _rows("query", [("what", 1.0)])
            + _rows("turn_cw", [(90, 1.8), (180, 2.8), (45, 1.3)]))
    with pytest.raises(fitmod.SparseSkillsError) as exc:
        fitmod.fit_rows(rows)
    msg = str(exc.value)
    assert "move_left: 2 samples, a linear fit needs at least 3 (MIN_LINEAR_SAMPLES)" in msg
    assert "query: 1 sample, an empirical fit needs at least 2 (MIN_EMPIRICAL_SAMPLES)" in msg
    assert "turn_cw" not in msg and "--allow-sparse" in msg
    assert fitmod.MIN_LINEAR_SAMPLES == 3 and fitmod.MIN_EMPIRICAL_SAMPLES == 2


def test_allow_sparse_keeps_the_base_entries(tmp_path):
    rows = _rows("move_left", [(50, 2.0), (100, 3.0)]) + _rows("turn_cw", [(90, 1.8), (180, 2.8), (45, 1.3)])
    result = fitmod.fit_rows(rows, allow_sparse=True)
    base = fitmod.load_base(None)["skills"]
    assert result.config["skills"]["move_left"] == base["move_left"]
    assert "move_left" in result.kept and "sparse" in result.kept["move_left"]
    assert result.fits["turn_cw"].n == 3
    fit_output.write_model(result, tmp_path / "m.yaml")
    ExecutionTimeModel.from_yaml(tmp_path / "m.yaml")


def test_linear_skill_at_one_argument_value_is_sparse():
    rows = _rows("move_up", [(100, 3.0), (100, 3.1), (100, 2.9), (100, 3.05)])
    with pytest.raises(fitmod.SparseSkillsError, match=r"move_up: 4 samples but all at argument 100"):
        fitmod.fit_rows(rows)


def test_non_numeric_arguments_of_a_linear_skill_are_skipped_and_counted():
    rows = _rows("move_forward", [(50, 2.0), (100, 3.0), (200, 5.0), ("_1", 9.9)])
    result = fitmod.fit_rows(rows)
    f = result.fits["move_forward"]
    assert f.n == 3 and f.dropped == 1
    assert math.isclose(f.fixed_s, 1.0, abs_tol=1e-9) and math.isclose(f.per_unit_s, 0.02, abs_tol=1e-9)


def test_failed_executions_and_no_data():
    rows = [r.__class__(**{**r.__dict__, "success": False}) for r in _rows("turn_cw", [(90, 1.8)] * 5)]
    with pytest.raises(fitmod.FitError, match="no successful executions"):
        fitmod.fit_rows(rows)


# --- properties ----------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fixed=st.floats(0.0, 3.0), per=st.floats(0.0, 0.1),
       xs=st.lists(st.integers(1, 1000), min_size=3, max_size=30, unique=True))
def test_noise_free_lines_are_recovered_exactly(fixed, per, xs):
    ys = [fixed + per * x for x in xs]
    lf = fitmod.fit_linear(xs, ys)
    assert math.isclose(lf["fixed_s"], fixed, abs_tol=1e-6)
    assert math.isclose(lf["per_unit_s"], per, abs_tol=1e-8)
    assert lf["rmse"] < 1e-6 and lf["jitter_sigma"] < 1e-6


@settings(max_examples=30, deadline=None)
@given(xs=st.lists(st.integers(1, 500), min_size=3, max_size=20, unique=True),
       ys=st.lists(st.floats(0.0, 20.0), min_size=20, max_size=20))
def test_fitted_coefficients_are_never_negative(xs, ys):
    lf = fitmod.fit_linear(xs, ys[: len(xs)])
    assert lf["fixed_s"] >= 0 and lf["per_unit_s"] >= 0


def test_empirical_samples_are_thinned_keeping_extremes():
    ys = np.linspace(1.0, 9.0, 1001)
    s = fitmod.empirical_samples(ys)
    assert len(s) == fitmod.MAX_EMPIRICAL_SAMPLES and s[0] == 1.0 and s[-1] == 9.0


def test_table_join_ignores_closing_and_unreported_segments():
    seg = {"task_id": "a", "robot_id": "r", "sequence": 0, "calls": ["move_forward(50)"],
           "estimated_execution_s": 2.0}
    closing = {**seg, "sequence": 1, "calls": []}
    unreported = {**seg, "sequence": 2}
    rep = {"task_id": "a", "robot_id": "r", "sequence": 0, "success": True, "message": "",
           "started": {"sec": 10, "nanosec": 0}, "finished": {"sec": 12, "nanosec": 500_000_000}}
    backwards = {**rep, "sequence": 3, "finished": {"sec": 9, "nanosec": 0}}
    orphan = {**rep, "task_id": "zzz"}
    build = build_rows([(msgtypes.SEGMENT_TYPE, s) for s in (seg, closing, unreported, {**seg, "sequence": 3})]
                       + [(msgtypes.REPORT_TYPE, r) for r in (rep, backwards, orphan, rep)])
    assert [(r.skill, r.arguments, r.duration) for r in build.rows] == [("move_forward", "50", 2.5)]
    assert build.empty_segments == 1 and build.unreported == [("a", 2)]
    assert build.orphan_reports == [("zzz", 0)] and len(build.bad_reports) == 1
    assert build.duplicates == 1
    assert "never reported" in build.summary()
