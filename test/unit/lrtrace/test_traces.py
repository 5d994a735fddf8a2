import pytest
import yaml

from timelyllm_ros.core.engine.sim.tokenizer import PieceTokenizer
from timelyllm_ros.lrtrace import Trace, TraceError, load_traces, lrtrace_dir

TABLE2 = {
    1: "Look for the cat",
    2: "Check for keys or wallets",
    3: "Check the book on the cabinet",
    4: "Find a toy under the bed",
    5: "Find a tool for cutting paper",
    6: "Avoiding human injury",
    7: "Preventing potential collision",
    8: "Evading animal pursuit",
    9: "Object stacking",
    10: "Desk cleaning",
    11: "Fruit and vegetable classification",
}


def test_repository_traces_match_table2():
    traces = load_traces()
    # Table 2 is traces 1-11; the traces after it serve the mixed-traffic workloads.
    assert list(traces)[:11] == list(range(1, 12))
    for tid, trace in ((t, traces[t]) for t in TABLE2):
        assert isinstance(trace, Trace)
        assert trace.trace_id == tid
        assert trace.instruction == TABLE2[tid]
    assert {traces[t].tuf_level for t in range(1, 6)} == {"normal"}
    assert {traces[t].tuf_level for t in range(6, 9)} == {"urgent"}
    assert {traces[t].tuf_level for t in range(9, 12)} == {"normal"}
    assert {traces[t].category for t in range(1, 9)} == {"drone"}
    assert {traces[t].category for t in range(9, 12)} == {"arm"}
    assert {traces[t].skill_set for t in range(1, 9)} == {"drone"}
    assert {traces[t].skill_set for t in range(9, 12)} == {"arm"}


def test_plan_lengths_follow_the_paper():
    traces = load_traces()
    tok = PieceTokenizer()
    for tid, trace in traces.items():
        n = len(tok.tokenize(trace.plan))
        if trace.category == "drone":
            assert 15 <= n <= 30, (tid, n)  # "about 20 tokens"
            assert trace.plan.endswith(";")
            assert trace.plan.count("{") == trace.plan.count("}")
        elif trace.category in ("chat", "batch"):  # mixed traffic: spoken replies, reports
            assert trace.skill_set == "chat"
            assert 30 <= n <= 200, (tid, n)  # within the chat skill set's max_plan_tokens
        else:
            assert 80 <= n <= 120, (tid, n)  # "around 100 tokens"
            steps = trace.plan.split("->")
            assert sum(s.startswith("pick(") for s in steps) >= 3
            assert sum(s.startswith("place(") for s in steps) >= 3


def test_skill_timings_file_is_well_formed():
    data = yaml.safe_load((lrtrace_dir() / "skill_timings.yaml").read_text())
    for robot in data["robots"].values():
        assert robot["source"]
        for name, skill in robot["skills"].items():
            kinds = {"samples", "scenarios", "seconds"} & set(skill)
            assert len(kinds) == 1, name
            if "samples" in skill:
                assert all(len(s) == 2 and s[1] > 0 for s in skill["samples"]), name
            if "scenarios" in skill:
                assert all(v and min(v) > 0 for v in skill["scenarios"].values()), name


def _write(tmp_path, traces):
    path = tmp_path / "traces.yaml"
    path.write_text(yaml.safe_dump({"traces": traces}))
    return path


GOOD = {"id": 1, "instruction": "x", "category": "drone", "tuf_level": "normal",
        "skill_set": "drone", "plan": "mf,50;"}


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"category": "boat"}, "trace 1: category"),
        ({"plan": ""}, "trace 1: plan"),
        ({"tuf_level": 3}, "trace 1: tuf_level"),
        ({"colour": "red"}, "trace 1: colour"),
        ({"id": 0}, "id"),
    ],
)
def test_bad_trace_field_named(tmp_path, change, needle):
    path = _write(tmp_path, [dict(GOOD, **change)])
    with pytest.raises(TraceError, match=needle) as info:
        load_traces(path)
    assert str(path) in str(info.value)


def test_missing_field_and_duplicates(tmp_path):
    entry = dict(GOOD)
    del entry["plan"]
    with pytest.raises(TraceError, match="trace 1: plan: missing"):
        load_traces(_write(tmp_path, [entry]))
    with pytest.raises(TraceError, match="trace 1: id: duplicate"):
        load_traces(_write(tmp_path, [GOOD, GOOD]))
    (tmp_path / "bad.yaml").write_text("[1, 2]")
    with pytest.raises(TraceError, match="traces"):
        load_traces(tmp_path / "bad.yaml")
    with pytest.raises(TraceError, match="cannot read"):
        load_traces(tmp_path / "nope.yaml")


def test_lrtrace_dir_override(tmp_path, monkeypatch):
    _write(tmp_path, [GOOD])
    monkeypatch.setenv("TIMELYLLM_LRTRACE_DIR", str(tmp_path))
    assert list(load_traces()) == [1]
