import math

import pytest

from timelyllm_ros.lrtrace import (
    Event,
    TaskSpec,
    Workload,
    WorkloadError,
    compose,
    load_events,
    load_traces,
    load_workload,
    parse_event_notation,
    save_events,
)

TABLE3 = {
    "WID1": (0.25, 8, tuple(range(1, 9)), 25, 260),
    "WID2": (0.25, 16, tuple(range(1, 9)), 42, 300),
    "WID3": (0.10, 8, (9, 10, 11), 40, 900),
}


@pytest.mark.parametrize("wid", sorted(TABLE3))
def test_presets_match_table3(wid):
    w = load_workload(wid)
    assert (w.eps, w.max_tpe, w.traces, w.agents, w.duration_s) == TABLE3[wid]
    assert w.network_latency_s == 0.008
    assert w.name == wid
    assert load_workload(wid.lower()) == w


def test_preset_events_are_plausible():
    traces = load_traces()
    for wid in TABLE3:
        w = load_workload(wid)
        events = compose(w)
        assert events and all(0 < e.time_s < w.duration_s for e in events)
        assert [e.event_id for e in events] == list(range(len(events)))
        assert [t.task_id for e in events for t in e.tasks] == list(
            range(sum(len(e.tasks) for e in events)))
        for e in events:
            assert 1 <= len(e.tasks) <= w.max_tpe
            robots = [t.robot_id for t in e.tasks]
            assert len(set(robots)) == len(robots)
            for t in e.tasks:
                trace = traces[t.trace_id]
                assert t.trace_id in w.traces
                assert t.tuf_level == trace.tuf_level
                assert t.robot_id.startswith(trace.category + "_")
                assert 0 <= int(t.robot_id.split("_")[1]) < w.agents


def _wl(**kw):
    base = dict(name="t", eps=0.5, max_tpe=4, traces=(1, 2, 6), agents=10, duration_s=200.0,
                seed=7)
    base.update(kw)
    return Workload(**base)


def test_compose_is_deterministic_per_seed():
    assert compose(_wl()) == compose(_wl())
    assert compose(_wl()) != compose(_wl(seed=8))


def test_poisson_rate_and_task_counts():
    eps, duration, max_tpe = 0.5, 20000.0, 6
    events = compose(_wl(eps=eps, duration_s=duration, max_tpe=max_tpe))
    expected = eps * duration  # 10000 events, sd 100
    assert abs(len(events) - expected) < 4 * math.sqrt(expected)
    times = [e.time_s for e in events]
    assert times == sorted(times)
    gaps = [b - a for a, b in zip([0.0] + times, times)]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / eps, rel=0.05)
    sizes = [len(e.tasks) for e in events]
    assert set(sizes) == set(range(1, max_tpe + 1))
    assert sum(sizes) / len(sizes) == pytest.approx((1 + max_tpe) / 2, rel=0.05)
    drawn = [t.trace_id for e in events for t in e.tasks]
    for tid in (1, 2, 6):
        assert drawn.count(tid) / len(drawn) == pytest.approx(1 / 3, abs=0.03)


def test_zero_rate_gives_no_events():
    assert compose(_wl(eps=0.0)) == []


def test_arm_robot_ids():
    events = compose(load_workload("WID3"))
    assert all(t.robot_id.startswith("arm_") for e in events for t in e.tasks)


def test_save_load_round_trip(tmp_path):
    events = compose(load_workload("WID1"))
    path = tmp_path / "events.yaml"
    save_events(path, events, comment="WID1\nseed 1")
    text = path.read_text()
    assert text.startswith("# WID1\n# seed 1\n")
    assert "robot: drone_" in text
    assert load_events(path) == events


def test_load_events_hand_written(tmp_path):
    path = tmp_path / "events.yaml"
    path.write_text(
        "events:\n"
        "- time_s: 5\n"
        "  tasks:\n"
        "  - {robot: drone_01, trace: 7}\n"
        "- time_s: 1.5\n"
        "  tasks:\n"
        "  - {robot: drone_02, trace: 1, tuf_level: urgent}\n"
        "  - {robot: drone_03, trace: 2}\n"
    )
    events = load_events(path)
    assert [e.time_s for e in events] == [1.5, 5.0]  # sorted by time and renumbered
    assert events[0] == Event(1.5, 0, (TaskSpec(0, "drone_02", 1, "urgent"),
                                       TaskSpec(1, "drone_03", 2, "normal")))
    assert events[1].tasks == (TaskSpec(2, "drone_01", 7, "urgent"),)


@pytest.mark.parametrize(
    "body, needle",
    [
        ("- time_s: 1\n  tasks: [{robot: d, trace: 1}]\n"
         "- time_s: 2\n  tasks: [{robot: d, trace: 99}]\n",
         "event 1: tasks\\[0\\]: trace: unknown trace id 99"),
        ("- time_s: -1\n  tasks: [{robot: d, trace: 1}]\n", "event 0: time_s"),
        ("- time_s: 1\n  tasks: []\n", "event 0: tasks"),
        ("- time_s: 1\n  tasks: [{robot: d, trace: 1}, {robot: d, trace: 2}]\n",
         "event 0: tasks\\[1\\]: robot"),
        ("- time_s: 1\n  when: now\n  tasks: [{robot: d, trace: 1}]\n", "event 0: when"),
    ],
)
def test_load_events_errors_name_the_event(tmp_path, body, needle):
    path = tmp_path / "events.yaml"
    path.write_text("events:\n" + body)
    with pytest.raises(WorkloadError, match=needle):
        load_events(path)


def test_parse_event_notation():
    events = parse_event_notation("{(1,2), 3, 4}", interval_s=2.0)
    assert [e.time_s for e in events] == [0.0, 2.0, 4.0]
    assert [[t.trace_id for t in e.tasks] for e in events] == [[1, 2], [3], [4]]
    robots = [t.robot_id for e in events for t in e.tasks]
    assert robots == ["drone_00", "drone_01", "drone_02", "drone_03"]
    assert [t.task_id for e in events for t in e.tasks] == [0, 1, 2, 3]
    mixed = parse_event_notation("(T6, T9), t1", start_s=10.0)
    assert [t.robot_id for t in mixed[0].tasks] == ["drone_00", "arm_00"]
    assert mixed[0].tasks[0].tuf_level == "urgent"
    assert mixed[1].time_s == 11.0


@pytest.mark.parametrize(
    "text, needle",
    [
        ("{(1,2), 3, 42}", "event 2: unknown trace id 42"),
        ("{(1,2, 3}", "expected '\\)'"),
        ("{1 2}", "expected '}'"),
        ("{1, x}", "unexpected 'x' at character 4"),
        ("", "empty"),
        ("{1,}", "expected a trace id"),
    ],
)
def test_parse_event_notation_errors(text, needle):
    with pytest.raises(WorkloadError, match=needle):
        parse_event_notation(text)


def _write(tmp_path, text, name="w.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = "eps: 0.2\nmax_tpe: 3\ntraces: [1, 2]\nagents: 5\nduration_s: 60\n"


def test_load_workload_file_defaults(tmp_path):
    w = load_workload(_write(tmp_path, GOOD, "mine.yaml"))
    assert w.name == "mine" and w.seed == 0 and w.network_latency_s == 0.008
    assert w.traces == (1, 2)


@pytest.mark.parametrize(
    "extra, key, reason",
    [
        ("speed: 3\n", "speed", "unknown key"),
        ("seed: -1\n", "seed", ">= 0"),
        ("seed: abc\n", "seed", "integer"),
        ("network_latency_s: -0.1\n", "network_latency_s", ">= 0"),
    ],
)
def test_bad_workload_extra_keys(tmp_path, extra, key, reason):
    path = _write(tmp_path, GOOD + extra)
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    msg = str(info.value)
    assert str(path) in msg and f": {key}: " in msg and reason in msg


@pytest.mark.parametrize(
    "old, new, key, reason",
    [
        ("eps: 0.2", "eps: -0.2", "eps", ">= 0"),
        ("eps: 0.2", "eps: fast", "eps", "number"),
        ("max_tpe: 3", "max_tpe: 2.5", "max_tpe", "integer"),
        ("max_tpe: 3", "max_tpe: 9", "max_tpe", "agents"),
        ("agents: 5", "agents: 0", "agents", ">= 1"),
        ("duration_s: 60", "duration_s: 0", "duration_s", "> 0"),
        ("traces: [1, 2]", "traces: [1, 99]", "traces", "unknown trace id 99"),
        ("traces: [1, 2]", "traces: [1, 1]", "traces", "duplicate"),
        ("traces: [1, 2]", "traces: [one]", "traces", "bad trace id"),
        ("eps: 0.2\n", "", "eps", "missing"),
    ],
)
def test_bad_workload_values(tmp_path, old, new, key, reason):
    path = _write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    msg = str(info.value)
    assert str(path) in msg and f": {key}: " in msg and reason in msg


def test_unknown_preset_and_missing_file(tmp_path):
    with pytest.raises(WorkloadError, match="WID1"):
        load_workload("WID99")
    with pytest.raises(WorkloadError, match="no such workload file"):
        load_workload(tmp_path / "nope.yaml")
    with pytest.raises(WorkloadError, match="mapping"):
        load_workload(_write(tmp_path, "- 1\n"))
