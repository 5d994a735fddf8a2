import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.engine.base import EngineAdapter, EngineRequest
from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.engine.sim.tokenizer import PieceTokenizer

SYSTEM = "You are a drone planner. Skills: mf move_forward, tc turn_cw, s sweeping. " * 20


def _req(engine, rid, prompt, script, max_tokens=64, prompt_ids=None):
    ids = list(prompt_ids) if prompt_ids is not None else engine.tokenize(prompt)
    return EngineRequest(rid, ids, max_tokens, scripted_text=script)


def _run(engine):
    """Step until idle; returns per-request text, finish reasons, and first num_cached_tokens."""
    text, reasons, cached = {}, {}, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            text[out.request_id] = text.get(out.request_id, "") + out.new_text
            if out.num_cached_tokens is not None:
                assert out.request_id not in cached, "num_cached_tokens reported twice"
                cached[out.request_id] = out.num_cached_tokens
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    return text, reasons, cached


# ---- tokenizer ----

@settings(max_examples=200, deadline=None)
@given(st.text())
def test_tokenizer_is_lossless(s):
    tok = PieceTokenizer()
    assert tok.decode(tok.tokenize(s)) == s


def test_tokenizer_pieces_and_stable_ids():
    tok = PieceTokenizer()
    assert tok.pieces("_1=s,bottle;  mf,1200") == ["_", "1", "=", "s", ",", "bottle", ";", "  ",
                                                    "mf", ",", "120", "0"]
    assert tok.pieces("pick up the box") == ["pick", " up", " the", " box"]
    a = tok.tokenize("hello world")
    assert tok.tokenize("hello world") == a
    assert tok.tokenize("world hello")[0] != a[0]
    with pytest.raises(ValueError, match="unknown token id"):
        tok.decode([len(tok) + 5])


def test_engine_satisfies_adapter_protocol():
    engine = SimulatedEngine()
    for member in ("name", "now", "tokenize", "decode", "max_model_len", "add_request",
                   "abort_request", "step", "has_unfinished_requests", "num_running", "kv_usage",
                   "last_step_timing", "advance_idle", "shutdown"):
        assert hasattr(engine, member), member
    assert set(EngineAdapter.__annotations__) <= {"name"}
    assert engine.name == "sim"
    assert engine.max_model_len() == 8192


# ---- generation ----

def test_emits_scripted_text_exactly_one_token_per_step():
    engine = SimulatedEngine()
    script = "_1=s,bottle;?_1==True{o,bottle;a};"
    engine.add_request(_req(engine, "r", SYSTEM + "Find a bottle.", script))
    steps = []
    while engine.has_unfinished_requests():
        steps.append(engine.step())
    outs = [o for step in steps for o in step]
    assert "".join(o.new_text for o in outs) == script
    assert all(len(o.new_token_ids) == 1 for o in outs)
    assert len(steps) == len(engine.tokenize(script))
    assert outs[-1].finished and outs[-1].finish_reason == "stop"
    assert not any(o.finished for o in outs[:-1])
    assert engine.num_running() == 0


def test_max_tokens_finishes_with_length():
    engine = SimulatedEngine()
    engine.add_request(_req(engine, "r", "plan:", "mf,50;tc,90;mf,20;", max_tokens=4))
    text, reasons, _ = _run(engine)
    assert reasons["r"] == "length"
    assert text["r"] == "mf,50;"  # pieces: mf , 50 ;


def test_empty_script_stops_immediately():
    engine = SimulatedEngine()
    engine.add_request(_req(engine, "r", "plan:", None))
    outs = engine.step()
    assert outs[0].finished and outs[0].finish_reason == "stop" and outs[0].new_token_ids == []


def test_virtual_time_advances_by_modelled_costs():
    profile = EngineProfile()
    engine = SimulatedEngine(profile, start_time=10.0)
    prompt = engine.tokenize(SYSTEM)
    p = len(prompt)
    engine.add_request(EngineRequest("a", prompt, 16, scripted_text="mf,50;"))
    engine.step()
    assert engine.now() == pytest.approx(10.0 + profile.step_s(p, 1, p))
    timing = engine.last_step_timing()
    assert timing.batch_size == 1 and timing.prefill_tokens == p
    t1 = engine.now()
    engine.step()
    assert engine.now() - t1 == pytest.approx(profile.decode_step_s(1, p + 1))
    # A second request joins: its prefill is fused with the first request's decode.
    other = engine.tokenize("Another robot, another prompt entirely.")
    engine.add_request(EngineRequest("b", other, 16, scripted_text="tc,90;"))
    t2 = engine.now()
    engine.step()
    expected = profile.prefill_s(len(other)) + profile.decode_step_s(2, (p + 2) + len(other))
    assert engine.now() - t2 == pytest.approx(expected)
    assert engine.last_step_timing().duration_s == pytest.approx(expected)


def test_step_with_nothing_to_do_costs_nothing():
    engine = SimulatedEngine()
    assert engine.step() == []
    assert engine.now() == 0.0
    assert engine.last_step_timing().duration_s == 0.0


def test_advance_idle_never_goes_back():
    engine = SimulatedEngine()
    engine.advance_idle(5.0)
    assert engine.now() == 5.0
    engine.advance_idle(3.0)
    assert engine.now() == 5.0


def test_calibrated_first_token_latency():
    engine = SimulatedEngine()
    prompt = list(range(2884))  # raw ids need not come from the tokenizer
    engine.add_request(EngineRequest("r", prompt, 8, scripted_text="mf,50;"))
    engine.step()
    assert engine.now() == pytest.approx(0.32845, abs=1e-3)


# ---- prefix cache and resumption ----

def test_resumed_request_reuses_prefix_cache():
    profile = EngineProfile()
    engine = SimulatedEngine(profile)
    prompt = engine.tokenize(SYSTEM + "Find the cat.")
    script = "_1=s,cat;?_1==True{o,cat;a};p;"
    engine.add_request(EngineRequest("seg0", prompt, 64, scripted_text=script))
    generated: list[int] = []
    first = engine.step()[0]
    assert first.num_cached_tokens == 0
    generated += first.new_token_ids
    while not engine.decode(generated).endswith(";"):
        generated += engine.step()[0].new_token_ids
    engine.abort_request("seg0")  # segment complete: suspend
    assert engine.kv_usage().free_blocks == profile.kv_total_blocks

    done = engine.decode(generated)
    resumed = EngineRequest("seg1", prompt + generated, 64, scripted_text=script[len(done):])
    engine.add_request(resumed)
    t0 = engine.now()
    out = engine.step()[0]
    total = len(prompt) + len(generated)
    assert out.num_cached_tokens > 0
    assert out.num_cached_tokens == (total - 1) // profile.kv_block_size * profile.kv_block_size
    assert engine.last_step_timing().prefill_tokens == total - out.num_cached_tokens
    uncached = total - out.num_cached_tokens
    assert engine.now() - t0 == pytest.approx(profile.step_s(uncached, 1, total))
    assert engine.now() - t0 < 0.5 * profile.first_token_s(total)
    rest, reasons, _ = _run(engine)
    assert done + out.new_text + rest["seg1"] == script
    assert reasons["seg1"] == "stop"


def test_shared_system_prompt_is_cached_across_requests():
    engine = SimulatedEngine()
    engine.add_request(_req(engine, "a", SYSTEM + "Find the cat.", "mf,50;"))
    engine.add_request(_req(engine, "b", SYSTEM + "Check the book.", "tc,90;"))
    _, _, cached = _run(engine)
    assert cached["a"] == 0  # both were admitted in the same step, before any block was cached
    engine.add_request(_req(engine, "c", SYSTEM + "Find a toy.", "mu,20;"))
    _, _, cached = _run(engine)
    system_blocks = len(engine.tokenize(SYSTEM)) // 16
    assert cached["c"] >= (system_blocks - 1) * 16


def test_fully_cached_prompt_still_recomputes_last_token():
    engine = SimulatedEngine(EngineProfile(kv_block_size=4))
    prompt = list(range(8))
    engine.add_request(EngineRequest("a", prompt, 4, scripted_text="x"))
    _run(engine)
    engine.add_request(EngineRequest("b", prompt, 4, scripted_text="y"))
    _, _, cached = _run(engine)
    assert cached["b"] == 4
    assert engine.last_step_timing().prefill_tokens == 4


# ---- KV budget ----

def test_abort_frees_blocks():
    profile = EngineProfile()
    engine = SimulatedEngine(profile)
    engine.add_request(_req(engine, "r", SYSTEM, "mf,50;tc,90;"))
    engine.step()
    usage = engine.kv_usage()
    assert usage.free_blocks < usage.total_blocks == profile.kv_total_blocks
    assert usage.block_size == profile.kv_block_size
    engine.abort_request("r")
    assert engine.kv_usage().free_blocks == profile.kv_total_blocks
    assert not engine.has_unfinished_requests()
    engine.abort_request("r")  # already gone: ignored
    engine.abort_request("never-seen")


def test_abort_waiting_request():
    engine = SimulatedEngine()
    engine.add_request(_req(engine, "r", "hello", "x"))
    engine.abort_request("r")
    assert engine.step() == [] and not engine.has_unfinished_requests()


def test_finish_frees_blocks():
    profile = EngineProfile()
    engine = SimulatedEngine(profile)
    engine.add_request(_req(engine, "r", SYSTEM, "mf,50;"))
    _run(engine)
    assert engine.kv_usage().free_blocks == profile.kv_total_blocks


def test_waiting_request_admitted_when_blocks_free_up():
    profile = EngineProfile(kv_block_size=4, kv_total_blocks=6)
    engine = SimulatedEngine(profile)
    engine.add_request(EngineRequest("a", list(range(100, 116)), 3, scripted_text="a b c d"))
    engine.add_request(EngineRequest("b", list(range(200, 216)), 3, scripted_text="e f"))
    first = engine.step()
    assert [o.request_id for o in first] == ["a"]  # b needs 4 blocks, only 2 free
    assert engine.num_running() == 1
    text, reasons, _ = _run(engine)
    assert reasons == {"a": "length", "b": "stop"}
    assert text["b"] == "e f"


def test_preemption_recomputes_newest_and_output_is_intact():
    profile = EngineProfile(kv_block_size=4, kv_total_blocks=4)
    engine = SimulatedEngine(profile)
    script_a = "one two three four five six seven eight"
    script_b = "alpha beta gamma delta epsilon zeta eta theta"
    engine.add_request(EngineRequest("a", [1, 2, 3], 64, scripted_text=script_a))
    engine.add_request(EngineRequest("b", [4, 5, 6], 64, scripted_text=script_b))
    preempted = []
    text, reasons = {}, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            text[out.request_id] = text.get(out.request_id, "") + out.new_text
            if out.finished:
                reasons[out.request_id] = out.finish_reason
        preempted += engine.last_step_timing().extra["preempted"]
        usage = engine.kv_usage()
        assert 0 <= usage.free_blocks <= usage.total_blocks
    assert preempted and set(preempted) == {"b"}  # the newest request is the victim
    assert text == {"a": script_a, "b": script_b}
    assert reasons == {"a": "stop", "b": "stop"}
    assert engine.kv_usage().free_blocks == profile.kv_total_blocks


def test_max_num_seqs_limits_batch():
    engine = SimulatedEngine(max_num_seqs=2)
    for i in range(3):
        engine.add_request(_req(engine, f"r{i}", f"prompt {i}", "a b c"))
    engine.step()
    assert engine.num_running() == 2
    _, reasons, _ = _run(engine)
    assert len(reasons) == 3


# ---- validation and determinism ----

def test_bad_requests_rejected():
    engine = SimulatedEngine(EngineProfile(max_model_len=64))
    engine.add_request(EngineRequest("r", [1, 2], 4, scripted_text="x"))
    with pytest.raises(ValueError, match="already"):
        engine.add_request(EngineRequest("r", [1, 2], 4, scripted_text="x"))
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(EngineRequest("long", list(range(64)), 4))
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request(EngineRequest("empty", [], 4))
    with pytest.raises(ValueError, match="max_tokens"):
        engine.add_request(EngineRequest("zero", [1], 0))


def test_max_model_len_stops_generation():
    engine = SimulatedEngine(EngineProfile(max_model_len=10))
    engine.add_request(EngineRequest("r", list(range(7)), 100, scripted_text="a b c d e f"))
    text, reasons, _ = _run(engine)
    # 7 prompt + 3 generated tokens reach the 10-token context
    assert reasons["r"] == "length" and text["r"] == "a b c"


def test_replay_is_deterministic():
    def replay():
        engine = SimulatedEngine(EngineProfile(kv_block_size=4, kv_total_blocks=20))
        log = []
        for i in range(6):
            engine.add_request(_req(engine, f"r{i}", SYSTEM[: 40 + 7 * i], f"mf,{i}0;tc,{i};"))
            for out in engine.step():
                log.append((engine.now(), out.request_id, out.new_text, out.num_cached_tokens))
        while engine.has_unfinished_requests():
            for out in engine.step():
                log.append((engine.now(), out.request_id, out.new_text, out.num_cached_tokens))
        return log

    assert replay() == replay()


def test_shutdown_drops_everything():
    engine = SimulatedEngine()
    engine.add_request(_req(engine, "r", SYSTEM, "mf,50;"))
    engine.step()
    engine.add_request(_req(engine, "s", SYSTEM, "mf,50;"))
    engine.shutdown()
    assert not engine.has_unfinished_requests()
    assert engine.kv_usage().free_blocks == engine.kv_usage().total_blocks


# ---- token budget: chunked prefill (vLLM V1) ----

def _budget_engine(budget, **kw):
    from dataclasses import replace
    return SimulatedEngine(replace(EngineProfile(), max_num_batched_tokens=budget), **kw)


def test_long_prompt_is_prefilled_in_chunks_of_the_step_budget():
    engine = _budget_engine(64, max_num_seqs=8)
    engine.add_request(EngineRequest("long", list(range(1000, 1150)), 8, scripted_text="a b"))
    engine.add_request(EngineRequest("short", list(range(2000, 2010)), 8, scripted_text="c"))
    steps = []
    while engine.has_unfinished_requests():
        before = engine.now()
        outs = engine.step()
        t = engine.last_step_timing()
        steps.append((t.prefill_tokens, t.batch_size, sorted(o.request_id for o in outs),
                      t.extra["scheduled_tokens"]))
        # Every step is priced by the cost model on what it computed, and never exceeds the budget.
        assert t.extra["scheduled_tokens"] <= 64
        assert engine.now() - before == pytest.approx(engine.profile.step_s(
            t.prefill_tokens, t.batch_size, t.extra["context_tokens"]))
    # 150 prompt tokens: chunks of 64 and 64 (nothing emitted yet, the short one waits for
    # budget), then the last 22 with its first token, while the short prompt gets 10 tokens.
    assert steps[0] == (64, 1, [], 64)
    assert steps[1] == (64, 1, [], 64)
    assert steps[2] == (22 + 10, 2, ["long", "short"], 32)
    assert sum(s[0] for s in steps) == 150 + 10


def test_decodes_are_scheduled_before_new_prefills():
    engine = _budget_engine(16, max_num_seqs=4)
    for i in range(3):
        engine.add_request(EngineRequest(f"r{i}", list(range(100 * i, 100 * i + 5)), 8,
                                         scripted_text="x y z w"))
    engine.step()  # 3 prompts of 5 tokens: 15 of the 16 tokens
    engine.add_request(EngineRequest("late", list(range(900, 940)), 8, scripted_text="q"))
    engine.step()
    t = engine.last_step_timing()
    # Three decodes first (3 tokens), then a 13-token chunk of the late prompt.
    assert t.extra["scheduled_tokens"] == 16 and t.prefill_tokens == 13
    assert t.extra["partial_prefills"] == 1


def test_cached_tokens_are_reported_with_the_first_token_of_a_chunked_prompt():
    engine = _budget_engine(32, max_num_seqs=4)
    prompt = engine.tokenize(SYSTEM)
    engine.add_request(EngineRequest("a", prompt, 4, scripted_text="x"))
    _run(engine)
    engine.add_request(EngineRequest("b", prompt + engine.tokenize(" and more words" * 20), 4,
                                     scripted_text="y"))
    text, _, cached = _run(engine)
    assert text == {"b": "y"}
    assert cached["b"] == (len(prompt) - 1) // 16 * 16 > 0


def test_budget_smaller_than_a_full_decode_batch_is_refused():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        _budget_engine(8, max_num_seqs=16)


# ---- engine scheduling: fcfs or priority (vLLM's scheduling_policy) ----

def _classed(rid, base, n, cls, script="a b c d e f g h"):
    return EngineRequest(rid, list(range(base, base + n)), 16, scripted_text=script,
                         service_class=cls)


@pytest.mark.parametrize("policy, first", [("fcfs", "be"), ("priority", "rt")])
def test_waiting_requests_are_admitted_by_class_under_priority_scheduling(policy, first):
    from dataclasses import replace
    engine = SimulatedEngine(replace(EngineProfile(), kv_total_blocks=3),
                             scheduling_policy=policy)
    engine.add_request(_classed("be", 1000, 30, "be"))  # 2 blocks each: only one fits
    engine.add_request(_classed("rt", 2000, 30, "rt"))
    engine.step()
    assert engine.last_step_timing().extra["admitted"] == [first]


@pytest.mark.parametrize("policy, victim", [("fcfs", "rt"), ("priority", "be")])
def test_preemption_victim_follows_the_scheduling_policy(policy, victim):
    from dataclasses import replace
    engine = SimulatedEngine(replace(EngineProfile(), kv_total_blocks=4),
                             scheduling_policy=policy)
    engine.add_request(_classed("be", 1000, 32, "be"))  # two full blocks each, admitted together
    engine.add_request(_classed("rt", 2000, 32, "rt"))
    engine.step()
    engine.step()  # both need a third block for their next token; one is preempted
    assert engine.last_step_timing().extra["preempted"] == [victim]
    text, _, _ = _run(engine)
    assert engine.kv_usage().free_blocks == 4


def test_unknown_scheduling_policy_is_refused():
    with pytest.raises(ValueError, match="scheduling_policy"):
        SimulatedEngine(scheduling_policy="lottery")
