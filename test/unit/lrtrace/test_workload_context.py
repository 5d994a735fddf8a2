"""Workloads where memory and slots bind (issue 11, point 5): per-task context
(`context_tokens`), mixed traffic (`streams`), and the mixed-fleet presets."""

from __future__ import annotations

import dataclasses
import inspect
import statistics

import numpy as np
import pytest

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.engine.sim.tokenizer import PieceTokenizer
from timelyllm_ros.core.skills.skillset import load_skillsets
from timelyllm_ros.core.tuf import TUF, TufLevels, default_config_dir, load_tuf_levels
from timelyllm_ros.lrtrace.event_lists import load_events, save_events
from timelyllm_ros.lrtrace.traces import CONTEXT_LABEL, context_text, load_traces
from timelyllm_ros.lrtrace.workload import (Stream, TaskSpec, Workload, WorkloadError, compose,
                                            load_workload)

TOK = PieceTokenizer()


def _wl(**kw):
    base = dict(name="t", eps=0.5, max_tpe=4, traces=(1, 6, 9), agents=10, duration_s=200.0,
                seed=7)
    base.update(kw)
    return Workload(**base)


def _shape(events):
    """Events without their contexts."""
    return [(e.time_s, e.event_id, e.after_event,
             [(t.task_id, t.robot_id, t.trace_id, t.tuf_level) for t in e.tasks]) for e in events]


# ---- context text ----

@pytest.mark.parametrize("n", [6, 7, 16, 333, 4000])
def test_context_has_exactly_n_tokens(n):
    text = context_text(12345, n, np.random.default_rng(0))
    assert text.startswith(CONTEXT_LABEL)
    assert len(TOK.tokenize(text)) == n


def test_context_is_distinct_per_task_and_reproducible():
    texts = [context_text(i, 10, np.random.default_rng(1)) for i in range(5000)]
    assert len(set(texts)) == len(texts)
    # Consecutive tasks differ at the first word after the label: a prefix cache shares only
    # the label (3 tokens), which never fills a block.
    a, b = (TOK.pieces(context_text(i, 10, np.random.default_rng(1))) for i in (41, 42))
    assert a[:3] == b[:3] and a[3] != b[3]
    assert context_text(3, 50, np.random.default_rng(9)) == \
        context_text(3, 50, np.random.default_rng(9))
    with pytest.raises(ValueError):
        context_text(0, 5, np.random.default_rng(0))


# ---- compose with context_tokens ----

def test_context_tokens_are_drawn_per_task_within_the_range():
    plain = compose(_wl(duration_s=2000.0))
    events = compose(_wl(duration_s=2000.0, context_tokens=(50, 150)))
    assert _shape(events) == _shape(plain)  # the events themselves do not change
    assert all(t.context == "" for e in plain for t in e.tasks)
    sizes = [len(TOK.tokenize(t.context)) for e in events for t in e.tasks]
    assert min(sizes) >= 50 and max(sizes) <= 150
    assert statistics.mean(sizes) == pytest.approx(100, abs=5)  # uniform integer in [50, 150]
    assert len(set(sizes)) > 80
    contexts = [t.context for e in events for t in e.tasks]
    assert len(set(contexts)) == len(contexts)
    assert compose(_wl(context_tokens=(50, 150))) == compose(_wl(context_tokens=(50, 150)))
    assert compose(_wl(context_tokens=(50, 150))) != compose(_wl(context_tokens=(50, 150), seed=8))


def test_a_shorter_duration_keeps_the_contexts_of_the_prefix():
    full = compose(_wl(context_tokens=(20, 40)))
    short = compose(_wl(context_tokens=(20, 40), duration_s=80.0))
    assert short == full[:len(short)]


@pytest.mark.parametrize("skill_set", ["drone", "arm", "chat"])
def test_context_makes_the_prompt_exactly_n_tokens_longer(skill_set):
    """On the simulated engine's tokenizer, as the scheduler renders a prompt."""
    sets = load_skillsets(default_config_dir() / "skillsets")
    engine = SimulatedEngine(EngineProfile())
    trace = next(t for t in load_traces().values() if t.skill_set == skill_set)
    base = engine.render_chat(sets[skill_set].render_messages(trace.instruction))
    prompts = []
    for task_id, n in ((0, 6), (1, 97), (2, 97), (64, 500)):
        spec = TaskSpec(task_id, "r_00", trace.trace_id, trace.tuf_level,
                        context_text(task_id, n, np.random.default_rng(task_id)))
        ids = engine.render_chat(sets[skill_set].render_messages(spec.instruction_for(trace)))
        assert len(ids) == len(base) + n
        prompts.append(ids)
    # Two tasks of the same trace share their prompt up to the context label at most.
    shared = next(i for i, (a, b) in enumerate(zip(prompts[1], prompts[2])) if a != b)
    assert shared <= len(base) + 3


def test_instruction_without_context_is_the_traces():
    trace = load_traces()[1]
    assert TaskSpec(0, "drone_00", 1, "normal").instruction_for(trace) == trace.instruction


def test_events_with_context_round_trip(tmp_path):
    events = compose(_wl(context_tokens=(6, 30), duration_s=40.0))
    path = tmp_path / "ev.yaml"
    save_events(path, events)
    assert load_events(path) == events
    assert "context:" in path.read_text()
    plain = compose(_wl(duration_s=40.0))
    save_events(path, plain)
    assert "context" not in path.read_text().split("events:", 1)[1]
    assert load_events(path) == plain


# ---- validation ----

BASE = ("eps: 0.2\nmax_tpe: 2\ntraces: [\"1-3\"]\nagents: 4\nduration_s: 10\n")
STREAMS = ("duration_s: 10\nstreams:\n"
           "  - {name: a, eps: 0.2, max_tpe: 2, traces: [1, 2], agents: 4}\n"
           "  - {name: b, eps: 0.1, max_tpe: 1, traces: [9], agents: 2}\n")


@pytest.mark.parametrize("body,key,reason", [
    (BASE + "context_tokens: [5, 10]\n", "context_tokens", "min must be >= 6"),
    (BASE + "context_tokens: [100, 10]\n", "context_tokens", "max must be >= min"),
    (BASE + "context_tokens: 100\n", "context_tokens", "two integers"),
    (BASE + "context_tokens: [10, 20, 30]\n", "context_tokens", "two integers"),
    (BASE + "context_tokens: [true, 20]\n", "context_tokens", "two integers"),
    (BASE + "context_tokens: [10.5, 20]\n", "context_tokens", "two integers"),
    (BASE + "context_tokens: [10, 2000000]\n", "context_tokens", "max must be <="),
    (BASE + STREAMS.replace("duration_s: 10\n", ""), "eps", "not allowed beside `streams`"),
    ("duration_s: 10\nstreams: []\n", "streams", "non-empty list"),
    ("duration_s: 10\nstreams: [3]\n", "streams[0]", "expected a mapping"),
    (STREAMS.replace("agents: 2}", "agents: 2, colour: red}"), "streams[1].colour",
     "unknown key"),
    (STREAMS.replace(", traces: [9]", ""), "streams[1].traces", "missing"),
    (STREAMS.replace("traces: [9]", "traces: [99]"), "streams[1].traces", "unknown trace id 99"),
    (STREAMS.replace("eps: 0.1", "eps: -1"), "streams[1].eps", "must be >= 0"),
    (STREAMS.replace("max_tpe: 1, traces: [9], agents: 2", "max_tpe: 3, traces: [9], agents: 2"),
     "streams[1].max_tpe", "need at least as many agents"),
    (STREAMS.replace("name: b", "name: a"), "streams", "duplicate stream name"),
    (STREAMS.replace("agents: 2}", "agents: 2, context_tokens: [3, 4]}"),
     "streams[1].context_tokens", "min must be >= 6"),
    ("streams:\n  - {eps: 0.2, max_tpe: 2, traces: [1], agents: 4}\n", "duration_s", "missing"),
])
def test_bad_context_and_streams_name_file_key_and_reason(tmp_path, body, key, reason):
    path = tmp_path / "w.yaml"
    path.write_text(body)
    with pytest.raises(WorkloadError) as err:
        load_workload(path)
    message = str(err.value)
    assert message.startswith(str(path)), message
    assert f": {key}" in message and reason in message, message


def test_context_tokens_load_from_yaml(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(BASE + "context_tokens: [40, 60]\n")
    w = load_workload(path)
    assert w.context_tokens == (40, 60)
    assert w.to_dict()["context_tokens"] == [40, 60]


# ---- streams ----

def test_streams_derive_the_workload_fields(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(STREAMS + "context_tokens: [10, 20]\n")
    w = load_workload(path)
    assert (w.eps, w.max_tpe, w.traces, w.agents) == (pytest.approx(0.3), 2, (1, 2, 9), 6)
    assert w.streams == (Stream("a", 0.2, 2, (1, 2), 4), Stream("b", 0.1, 1, (9,), 2))
    assert w.context_tokens == (10, 20)
    assert w.to_dict()["streams"][1] == {"name": "b", "eps": 0.1, "max_tpe": 1, "traces": [9],
                                         "agents": 2}


def _mixed(**kw):
    streams = (Stream("drones", 0.4, 3, (1, 6), 8, (10, 20)),
               Stream("arms", 0.1, 2, (9, 10), 4),
               Stream("chat", 0.5, 1, (12,), 5, (30, 40)))
    base = dict(name="m", eps=1.0, max_tpe=3, traces=(1, 6, 9, 10, 12), agents=17,
                duration_s=2000.0, seed=3, streams=streams)
    base.update(kw)
    return Workload(**base)


def test_streams_compose_each_at_its_rate_on_its_own_robots():
    events = compose(_mixed())
    assert [e.event_id for e in events] == list(range(len(events)))
    assert [e.time_s for e in events] == sorted(e.time_s for e in events)
    tasks = [t for e in events for t in e.tasks]
    assert [t.task_id for t in tasks] == list(range(len(tasks)))
    traces = load_traces()
    by_stream = {"drones": [], "arms": [], "chat": []}
    for e in events:
        cats = {traces[t.trace_id].category for t in e.tasks}
        assert len(cats) == 1  # an event belongs to one stream
        by_stream[{"drone": "drones", "arm": "arms", "chat": "chat"}[cats.pop()]].append(e)
    for name, rate in (("drones", 0.4), ("arms", 0.1), ("chat", 0.5)):
        n = len(by_stream[name])
        assert abs(n - rate * 2000) < 4 * (rate * 2000) ** 0.5, name
    # Robot slots: drones 0-7, arms 8-11, chat users 12-16.
    slots = {"drone": range(0, 8), "arm": range(8, 12), "chat": range(12, 17)}
    for t in tasks:
        category, index = t.robot_id.split("_")
        assert int(index) in slots[category]
        tokens = len(TOK.tokenize(t.context))
        if category == "drone":
            assert 10 <= tokens <= 20
        elif category == "chat":
            assert 30 <= tokens <= 40
        else:
            assert t.context == ""


def test_scaling_eps_scales_every_stream():
    base = compose(_mixed())
    doubled = compose(dataclasses.replace(_mixed(), eps=2.0))
    assert len(doubled) == pytest.approx(2 * len(base), rel=0.1)
    traces = load_traces()
    for category in ("drone", "arm", "chat"):
        n1 = sum(1 for e in base if traces[e.tasks[0].trace_id].category == category)
        n2 = sum(1 for e in doubled if traces[e.tasks[0].trace_id].category == category)
        assert n2 == pytest.approx(2 * n1, rel=0.25), category
    assert compose(dataclasses.replace(_mixed(), eps=0.0)) == []


def test_a_stream_keeps_its_events_when_another_stream_changes():
    """Each stream draws from its own seed sequence (seed, index)."""
    a = compose(_mixed())
    streams = _mixed().streams
    changed = _mixed(streams=streams[:2] + (dataclasses.replace(streams[2], traces=(13,)),))
    b = compose(changed)
    traces = load_traces()

    def drone_times(events):
        return [e.time_s for e in events if traces[e.tasks[0].trace_id].category == "drone"]
    assert drone_times(a) == drone_times(b)


def test_plain_workloads_describe_themselves_as_before():
    assert set(load_workload("WID1").to_dict()) == {
        "name", "eps", "max_tpe", "traces", "agents", "duration_s", "seed", "network_latency_s",
        "description"}


# ---- the mixed-fleet presets ----

def test_mixed_fleet_presets():
    traces = load_traces()
    plain, long = load_workload("mixed-fleet"), load_workload("mixed-fleet-long")
    assert [s.name for s in plain.streams] == ["drones", "arms", "chat", "batch"]
    assert [dataclasses.replace(s, context_tokens=None) for s in long.streams] == \
        list(plain.streams)
    assert plain.context_tokens is None and all(s.context_tokens is None for s in plain.streams)
    assert all(s.context_tokens for s in long.streams)
    events, events_long = compose(plain), compose(long)
    assert _shape(events) == _shape(events_long)  # the same traffic, with context
    tasks = [t for e in events_long for t in e.tasks]
    kinds = {(traces[t.trace_id].category, t.tuf_level) for t in tasks}
    assert kinds == {("drone", "normal"), ("drone", "urgent"), ("arm", "normal"),
                     ("chat", "chat"), ("batch", "best_effort")}
    ranges = {s.traces: s.context_tokens for s in long.streams}
    for t in tasks:
        lo, hi = next(r for ids, r in ranges.items() if t.trace_id in ids)
        assert lo <= len(TOK.tokenize(t.context)) <= hi
    assert all(t.context == "" for e in events for t in e.tasks)
    assert 1.5 < len(tasks) / plain.duration_s < 2.5  # ~1.9 tasks/s (the preset's comment)


def test_mixed_traffic_traces():
    traces = load_traces()
    chat = [t for t in traces.values() if t.category == "chat"]
    batch = [t for t in traces.values() if t.category == "batch"]
    assert chat and batch
    assert {t.tuf_level for t in chat} == {"chat"}
    assert {t.tuf_level for t in batch} == {"best_effort"}
    assert {t.skill_set for t in chat + batch} == {"chat"}
    assert min(len(TOK.tokenize(t.plan)) for t in batch) > max(
        len(TOK.tokenize(t.plan)) for t in chat)


# ---- replay (bench) ----

def _levels() -> TufLevels:
    """config/tuf_levels.yaml, plus `best_effort` if the config does not define it yet."""
    levels = load_tuf_levels()
    if "best_effort" in levels:
        return levels
    return TufLevels({**levels.as_dict(), "best_effort": TUF(60.0, 0.05, 1.0)}, source="test")


def _replay(workload_name: str, duration_s: float, policy: str):
    from timelyllm_ros.bench.config import BenchConfig
    from timelyllm_ros.bench.replay import run_policy
    from timelyllm_ros.bench.workloads import load_workload_events
    workload, events = load_workload_events(workload_name, None, duration_s)
    config = BenchConfig(prompt_tokens=None, baseline_prefix_cache=True)
    return events, run_policy(events, policy, workload, config, tuf_levels=_levels())


@pytest.mark.parametrize("policy", ["vllm-stream", "timelyllm"])
def test_mixed_fleet_replays(policy):
    events, run = _replay("mixed-fleet", 40.0, policy)
    assert len(run.tasks) == sum(len(e.tasks) for e in events) > 40
    assert {t.state for t in run.tasks} == {"done"}
    assert {t.task_type for t in run.tasks} >= {"drone-normal", "chat", "batch-best_effort"}


def _replay_carries_context() -> bool:
    from timelyllm_ros.bench import replay
    return "instruction_for(" in inspect.getsource(replay)


@pytest.mark.skipif(not _replay_carries_context(),
                    reason="bench/replay.py does not pass spec.instruction_for(trace) yet")
def test_replay_prompts_carry_each_tasks_context():
    _, plain = _replay("mixed-fleet", 30.0, "vllm-stream")
    events, long = _replay("mixed-fleet-long", 30.0, "vllm-stream")
    shortest = min(len(TOK.tokenize(t.context)) for e in events for t in e.tasks)
    assert long.config["prompt_tokens_min"] >= plain.config["prompt_tokens_min"] + shortest
