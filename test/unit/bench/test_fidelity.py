"""`timelyllm bench --fidelity`: pairing, statistics, rankings and outputs on synthetic runs;
the orchestration on a stand-in for the real engine; the CLI flags."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from timelyllm_ros.bench import fidelity as fid
from timelyllm_ros.bench import fidelity_engines as fid_engines
from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.engines import EnginePool
from timelyllm_ros.bench.fidelity_stats import (Figures, PolicyFidelity, compare, format_fidelity,
                                                pair_tasks, pairs_csv, rankings, ranking)
from timelyllm_ros.bench.results import RunResult, SegmentResult, TaskResult
from timelyllm_ros.cli import bench as cli
from timelyllm_ros.cli.bench_args import build_parser
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.engine.sim.tokenizer import PieceTokenizer
from timelyllm_ros.core.policies.registry import DEFAULT_POLICY
from timelyllm_ros.lrtrace.traces import load_traces
from timelyllm_ros.lrtrace.workload import Event, TaskSpec, Workload

NAN = float("nan")


def _task(i: int, response_s: float, utility: float | None = None, kind: str = "drone-normal",
          segments: tuple[str, ...] = ()) -> TaskResult:
    if utility is None:
        utility = NAN if math.isnan(response_s) else 1.0 - max(0.0, response_s - 1.0) * 2.0
    segs = [SegmentResult(n, text, n == len(segments) - 1, 0.0, 0.0, 0.0)
            for n, text in enumerate(segments)]
    return TaskResult(task_id=f"t{i:05d}", trace_id=1, category="drone", tuf_level="normal",
                      task_type=kind, robot_id="drone_1", arrival_s=float(i), ert_s=1.0,
                      response_time_s=response_s, utility=utility, segments=segs)


def _run(policy: str, responses, utilities=None) -> RunResult:
    utilities = utilities or [None] * len(responses)
    tasks = [_task(i, r, u) for i, (r, u) in enumerate(zip(responses, utilities))]
    return RunResult(policy=policy, tasks=tasks, fetch_overhead_s=[], steps=1, clock_s=1.0,
                     wall_s=1.0)


# ---- pairing and figures ----------------------------------------------------------------------

def test_pairs_follow_task_ids_across_runs():
    real = [_run("p", [0.1, 0.2, 0.3]), _run("p", [0.3, 0.2, 0.1])]
    sim = _run("p", [0.2, NAN, 0.4])
    sim.tasks.reverse()  # pairing goes by id, not position
    pairs = pair_tasks(real, sim)
    assert [p.task_id for p in pairs] == ["t00000", "t00001", "t00002"]
    assert pairs[0].real_s == (0.1, 0.3) and pairs[0].sim_s == 0.2
    assert pairs[0].real_mean_s == pytest.approx(0.2) and pairs[0].error == pytest.approx(0.0)
    assert math.isnan(pairs[1].error)  # no simulated response
    assert pairs[2].error == pytest.approx(1.0)  # 0.4 against a mean of 0.2


def test_pairs_refuse_runs_of_different_tasks():
    real = [_run("p", [0.1, 0.2])]
    with pytest.raises(ValueError, match="only real: \\['t00001'\\]"):
        pair_tasks(real, _run("p", [0.1]))
    with pytest.raises(ValueError, match="no real run"):
        pair_tasks([], _run("p", [0.1]))


def test_figures_leave_out_tasks_without_response():
    run = _run("p", [0.1, 0.2, 0.3, 0.4, NAN], utilities=[1, 1, 1, 0, None])
    f = Figures.of(run)
    assert f.p50_s == pytest.approx(0.25)  # numpy's linear percentile of the four responses
    assert f.p90_s == pytest.approx(0.37)
    assert f.utility == pytest.approx(0.75)
    assert (f.tasks, f.without_response) == (5, 1)


def test_errors_spread_and_goal():
    real = [_run("p", [0.1, 0.2, 0.3]), _run("p", [0.1, 0.4, 0.5])]
    # Real p50: 0.2 and 0.4 (mean 0.3, spread 0.2).
    close = compare({"p": real}, {"p": _run("p", [0.1, 0.33, 0.45])})[0]
    assert close.real_mean("p50_s") == pytest.approx(0.3)
    assert close.real_spread("p50_s") == pytest.approx(0.2)
    assert close.error("p50_s") == pytest.approx(0.1)
    assert close.meets_goal()
    far = compare({"p": real}, {"p": _run("p", [0.1, 0.36, 0.45])})[0]
    assert far.error("p50_s") == pytest.approx(0.2)
    assert not far.meets_goal()
    doc = far.to_dict()
    assert doc["p50_s"]["real"] == pytest.approx([0.2, 0.4]) and doc["meets_goal"] is False


def test_compare_needs_a_real_run_per_policy():
    with pytest.raises(ValueError, match="no real run of b"):
        compare({"a": [_run("a", [0.1])]}, {"a": _run("a", [0.1]), "b": _run("b", [0.1])})


# ---- rankings ------------------------------------------------------------------------------

def test_ranking_orders_by_figure_with_nan_last():
    assert ranking({"a": 1.0, "b": 2.0, "c": NAN}, higher_is_better=True) == ["b", "a", "c"]
    assert ranking({"a": 1.0, "b": 2.0, "c": NAN}, higher_is_better=False) == ["a", "b", "c"]


def test_rankings_agree_and_disagree():
    fast, slow = [0.1, 0.2, 0.3], [0.5, 0.6, 0.7]
    real = {"a": [_run("a", fast), _run("a", fast)], "b": [_run("b", slow), _run("b", slow)]}
    same = rankings(compare(real, {"a": _run("a", fast), "b": _run("b", slow)}))
    by = {r.figure: r for r in same}
    assert by["p50_s"].sim == ["a", "b"] and by["p50_s"].agree and by["p50_s"].real_runs_agree
    flipped = rankings(compare(real, {"a": _run("a", slow), "b": _run("b", fast)}))
    assert not {r.figure: r for r in flipped}["p50_s"].agree
    # Real runs that disagree with each other are reported as such.
    noisy = {"a": [_run("a", fast), _run("a", slow)], "b": [_run("b", slow), _run("b", fast)]}
    r = {x.figure: x for x in rankings(compare(noisy, {"a": _run("a", fast),
                                                       "b": _run("b", slow)}))}
    assert not r["p50_s"].real_runs_agree
    text = format_fidelity(compare(real, {"a": _run("a", slow), "b": _run("b", fast)}), flipped)
    assert "DIFFERENT" in text and "not met" in text


def test_pairs_csv_has_every_pair():
    pf = compare({"p": [_run("p", [0.1, NAN]), _run("p", [0.2, 0.3])]},
                 {"p": _run("p", [0.15, 0.3])})
    rows = list(csv.DictReader(io.StringIO(pairs_csv(pf))))
    assert [r["task_id"] for r in rows] == ["t00000", "t00001"]
    assert rows[0]["real_1_s"] == "0.100000" and rows[1]["real_1_s"] == ""
    assert float(rows[0]["error"]) == pytest.approx(0.0)


# ---- plans and geometry ----------------------------------------------------------------------

def test_plans_of_joins_segments_in_order():
    task = _task(0, 0.1, segments=("a;", "b;", "c"))
    task.segments.reverse()
    run = RunResult("p", [task, _task(1, NAN)], [], 1, 1.0, 1.0)
    assert fid.plans_of(run) == {"t00000": "a;b;c"}  # t00001 generated nothing


def test_with_plans_gives_each_planned_task_its_own_trace():
    traces = load_traces()
    events = [Event(0.0, 0, (TaskSpec(3, "drone_1", 1, "normal"), TaskSpec(4, "drone_2", 6,
                                                                            "urgent")))]
    out_events, out_traces = fid.with_plans(events, traces, {"t00003": "tc,30;"}, fid._task_id)
    first, second = out_events[0].tasks
    assert first.trace_id == fid.PLAN_TRACE_BASE + 3 and second.trace_id == 6
    own = out_traces[first.trace_id]
    assert own.plan == "tc,30;" and own.instruction == traces[1].instruction
    assert own.max_plan_tokens == traces[1].max_plan_tokens and traces[1].plan != "tc,30;"


def test_geometry_replaces_the_profile_kv_and_budget():
    geometry = fid.RealGeometry(182, 128, 2048, 2048, 32)
    real = BenchConfig(engine="vllm", model="m", profile=EngineProfile(kv_total_blocks=999))
    sim = fid.sim_config(real, EngineProfile(kv_total_blocks=999), geometry)
    profile = sim.load_profile()
    assert sim.engine == "sim" and sim.max_num_seqs == 32
    assert (profile.kv_total_blocks, profile.kv_block_size) == (182, 128)
    assert profile.max_num_batched_tokens == 2048


class _FakeHf:
    """Enough of a Hugging Face tokenizer for ModelTokenizer: a chat template that wraps."""

    def __init__(self, pieces: PieceTokenizer | None = None):
        self.pieces = pieces if pieces is not None else PieceTokenizer()

    def encode(self, text, add_special_tokens=False):
        return self.pieces.tokenize(text)

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return self.pieces.decode(ids)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_model_tokenizer_renders_with_the_chat_template():
    tok = fid.ModelTokenizer(_FakeHf())
    engine = tok.use_in(SimulatedEngine())
    ids = engine.render_chat([{"role": "user", "content": "hi"}])
    assert engine.decode(ids) == "<user>hi<assistant>"
    assert engine.tokenize("tc,30;") == tok.tokenize("tc,30;")


def test_model_tokenizer_keeps_the_tokens_the_engine_generated():
    hf = _FakeHf()
    tok = fid.ModelTokenizer(hf)
    assert len(tok.tokenize("tc,30;")) == 4  # the tokenizer's own split: tc , 30 ;
    t, c = hf.pieces.tokenize("t")[0], hf.pieces.tokenize("c")[0]
    rest = hf.pieces.tokenize(",30;")
    generated = [(t, "t"), (c, "c")] + [(i, hf.pieces.decode([i])) for i in rest]
    tok.remember(generated)
    assert tok.tokenize("tc,30;") == [t, c, *rest]  # as generated: five steps, not four
    assert tok.tokenize("c,30;") == [c, *rest]  # a tail at a token boundary (a resume)
    assert tok.tokenize(",30;") == rest
    assert len(tok.fresh().tokenize("tc,30;")) == 4  # a fresh one remembers nothing


def test_plan_tokens_skip_tokens_handed_out_again_and_keep_the_end():
    outputs = [(1, "tc"), (2, ",30"), (3, "};"), (3, "};"), (4, "p;"), (0, "")]
    assert fid_engines.plan_tokens(outputs, "tc,30};p;") == [(1, "tc"), (2, ",30"), (3, "};"),
                                                             (4, "p;"), (0, "")]
    assert fid_engines.plan_tokens(outputs, "tc,30};x;") is None  # cannot spell the plan
    assert fid_engines.plan_tokens([], "") == []


def test_task_plans_name_the_tasks_whose_tokens_are_missing():
    found, missed = fid_engines.task_plans({"t1": [(1, "a;")], "t2": [(1, "a;")]},
                                           {"t1": "a;", "t2": "b;", "t3": "c;"})
    assert found == {"t1": [(1, "a;")]} and missed == ["t2", "t3"]


def test_step_recorder_keeps_outputs_by_task():
    from timelyllm_ros.core.engine.base import EngineRequest
    engine = SimulatedEngine()
    recorder = fid_engines.StepRecorder()
    recorder.wrap(engine)
    engine.add_request(EngineRequest("t00007#0", engine.tokenize("hello"), 3,
                                     scripted_text="tc,30;"))
    engine.add_request(EngineRequest("__warmup__drone", engine.tokenize("hello"), 1,
                                     scripted_text=" "))
    while engine.has_unfinished_requests():
        engine.step()
    got = recorder.take()
    assert list(got) == ["t00007"]
    assert "".join(text for _, text in got["t00007"]) == "tc,30"  # max_tokens 3
    assert recorder.take() == {}


def test_load_meter_measures_an_interval():
    load = fid_engines.LoadMeter().stop()
    assert len(load.loadavg) == 3 and all(x >= 0 for x in load.loadavg)
    assert math.isnan(load.cpu_waiting_share) or 0 <= load.cpu_waiting_share <= 4


# ---- orchestration on a stand-in for the real engine -------------------------------------------

REAL_PLAN = "tc,30;"  # one segment: a stand-in cannot resume a plan


class _StandInEngine(SimulatedEngine):
    """Plays the real engine: its own KV geometry and one plan of its own for every task."""

    def add_request(self, request):
        from dataclasses import replace
        if not request.request_id.startswith("__"):
            request = replace(request, scripted_text=REAL_PLAN)
        super().add_request(request)


def test_run_fidelity_runs_real_twice_sim_once_with_the_real_plans_and_geometry():
    vocabulary = PieceTokenizer()  # the stand-in's and the "model's" tokenizer

    def build(config, prefix_cache=True, policy=None):
        return _StandInEngine(EngineProfile(kv_total_blocks=300, kv_block_size=16,
                                            max_num_batched_tokens=4096), max_num_seqs=8,
                              tokenizer=vocabulary)

    config = BenchConfig(engine="vllm", model="stand-in")
    pool = fid.RecordingPool(config, build)
    workload = Workload(name="w", eps=0.1, max_tpe=2, traces=(1, 6), agents=2, duration_s=10.0)
    events = [Event(0.5, 0, (TaskSpec(0, "drone_1", 1, "normal"),
                             TaskSpec(1, "drone_2", 6, "urgent"))),
              Event(4.0, 1, (TaskSpec(2, "drone_1", 2, "normal"),))]
    order = []
    result = fid.run_fidelity(events, workload, ["vllm-stream", "timelyllm-wc"], config,
                              EngineProfile(), runs=2, pool=pool,
                              model_tokenizer=fid.ModelTokenizer(_FakeHf(vocabulary)),
                              log=order.append)
    pool.shutdown()
    assert [line for line in order if line.startswith("real")] == [
        "real run 1/2: vllm-stream", "real run 1/2: timelyllm-wc",
        "real run 2/2: timelyllm-wc", "real run 2/2: vllm-stream"]
    assert {p: len(r) for p, r in result.real.items()} == {"vllm-stream": 2, "timelyllm-wc": 2}
    assert result.geometry == fid.RealGeometry(300, 16, 4096, 8192, 8)
    assert result.profile.kv_total_blocks == 300 and result.profile.kv_block_size == 16
    for name, run in result.sim.items():
        # The simulated engine generated what the stand-in generated, task by task...
        assert fid.plans_of(run) == fid.plans_of(result.real[name][0])
        assert set(fid.plans_of(run).values()) == {REAL_PLAN}
        assert [t.generated_tokens for t in run.tasks] == \
            [t.generated_tokens for t in result.real[name][0].tasks]
        # ... while the plain simulated run generated the traces' own plans.
        assert REAL_PLAN not in set(fid.plans_of(result.sim_trace_plans[name]).values())
    assert all(len(p.pairs) == 3 and len(p.pairs[0].real_s) == 2 for p in result.policies)
    doc = json.loads(json.dumps(result.to_dict(), default=str))
    assert doc["geometry"]["kv_total_blocks"] == 300
    assert doc["policies"]["vllm-stream"]["plans_differ_between_real_runs"] == 0


def test_write_outputs(tmp_path):
    pf = compare({"p": [_run("p", [0.1, 0.2, 0.3]), _run("p", [0.2, 0.2, 0.4])]},
                 {"p": _run("p", [0.15, 0.25, 0.3])})
    result = fid.FidelityResult(pf, rankings(pf), fid.RealGeometry(1, 1, 1, 1, 1),
                                EngineProfile(), {"p": []}, {"p": _run("p", [0.1])},
                                {"p": _run("p", [0.1])}, {"p": 0}, {"p": []}, {"p": []})
    paths = fid.write_outputs(result, tmp_path, {"command": "x"})
    assert [p.name for p in paths] == ["fidelity.json", "pairs.csv", "fidelity.png"]
    doc = json.loads(paths[0].read_text())
    assert doc["command"] == "x" and doc["policies"]["p"]["p50_s"]["sim"] == pytest.approx(0.25)
    assert paths[2].stat().st_size > 1000


# ---- CLI --------------------------------------------------------------------------------------

def test_cli_parses_fidelity_flags():
    args = build_parser().parse_args(["--fidelity", "w.yaml", "--fidelity-runs", "3",
                                      "--out", "d"])
    assert (args.fidelity, args.fidelity_runs, args.out) == ("w.yaml", 3, "d")
    plain = build_parser().parse_args(["--workload", "WID1"])
    assert plain.fidelity is None and plain.fidelity_runs == 2


@pytest.mark.parametrize("extra, message", [
    (["--kv-blocks", "10"], "--kv-blocks: not with --fidelity"),
    (["--fidelity-runs", "0"], "--fidelity-runs: must be >= 1"),
    (["--policies", "vllm-stream,nope"], "unknown policy 'nope'"),
    (["--model", "/nonexistent"], "is not a model directory"),
])
def test_cli_refuses_bad_fidelity_arguments(capsys, extra, message):
    assert cli.main(["--fidelity", "fidelity-cpu", *extra]) == 2
    assert message in capsys.readouterr().err


def test_cli_default_policies_are_stream_and_default(monkeypatch, tmp_path):
    seen = {}

    def fake_run(events, workload, policies, config, profile, **kw):
        seen.update(policies=policies, model=config.model, engine=config.engine,
                    kv=profile.kv_total_blocks, runs=kw["runs"], tasks=sum(len(e.tasks)
                                                                           for e in events))
        raise RuntimeError("stop here")

    monkeypatch.setattr(fid, "run_fidelity", fake_run)
    assert cli.main(["--fidelity", "fidelity-cpu", "--duration-s", "20", "--model",
                     str(tmp_path)]) == 1
    assert seen["policies"] == ["vllm-stream", DEFAULT_POLICY]
    assert seen["engine"] == "vllm" and seen["model"] == str(tmp_path) and seen["runs"] == 2
    assert seen["kv"] == EngineProfile.from_yaml(fid.DEFAULT_PROFILE).kv_total_blocks
    assert seen["tasks"] > 0


def test_counts_lists_each_value_with_how_often_it_occurs():
    from timelyllm_ros.bench.fidelity_engines import _counts
    assert _counts([1, 1, 0, 1]) == "3 x 1, 1 x 0"
    assert _counts([(0, 0, 1), (0, 1, 1), (0, 0, 1)]) == "2 x (0, 0, 1), 1 x (0, 1, 1)"
