"""GeneratedText (token/text alignment, cuts inside a token) and resume_regex; plus a segment
boundary that falls inside a token, end to end through the scheduler."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.engine.sim.tokenizer import PieceTokenizer
from timelyllm_ros.core.exec_model import ExecutionTimeModel
from timelyllm_ros.core.generation import GeneratedText, resume_regex
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.sched.scheduler import SchedulerConfig, SegmentScheduler
from timelyllm_ros.core.skills.minispec import minispec_regex
from timelyllm_ros.core.skills.arm import arm_regex
from timelyllm_ros.core.skills.skillset import load_skillsets
from timelyllm_ros.core.task import TaskSpec
from timelyllm_ros.core.tuf import load_tuf_levels

REPO = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------ GeneratedText

def test_append_tracks_token_ends():
    g = GeneratedText()
    g.append([1], "mf")
    g.append([2], ",50")
    g.append([3], ";m")
    assert g.text == "mf,50;m" and g.token_ids == [1, 2, 3] and g.token_ends == [2, 5, 7]
    g.append([], "")
    assert g.token_ends == [2, 5, 7]


def test_cut_inside_a_token_owes_the_boundary_characters():
    g = GeneratedText()
    for i, piece in enumerate(["mf", ",", "50", ";m"]):
        g.append([i], piece)
    g.consumed = 6  # boundary right after ';', inside the token ';m'
    owed = g.cut_for_resume()
    assert owed == ";"
    assert g.text == "mf,50" and g.token_ids == [0, 1, 2] and g.token_ends == [2, 3, 5]
    assert g.consumed == 6
    # The resumed generation re-produces the owed ';' (as part of ';m' again).
    g.append([3], ";m")
    g.append([4], "f")
    assert g.text == "mf,50;mf" and g.pending_text == "mf"
    assert g.token_ends == [2, 3, 5, 7, 8]


def test_keep_pending_keeps_the_statement_in_progress():
    g = GeneratedText()
    for i, piece in enumerate(["Hello", " there", ".", " How", " are"]):
        g.append([i], piece)
    g.consumed = 12  # after "Hello there."; " How are" is the sentence in progress
    assert g.cut_for_resume(keep_pending=True) == ""
    assert g.text == "Hello there. How are" and g.token_ids == [0, 1, 2, 3, 4]
    assert g.pending_text == " How are"


def test_keep_pending_still_drops_tokens_whose_text_has_not_shown():
    g = GeneratedText()
    g.append([0], "Hi.")
    g.append([1], " Ok")
    g.append([2], "")  # held back by the detokenizer
    g.consumed = 3
    assert g.cut_for_resume(keep_pending=True) == ""
    # The step before the silent token may have shown only part of its text: both go.
    assert g.text == "Hi." and g.token_ids == [0]


def test_cut_on_a_token_boundary_owes_nothing():
    g = GeneratedText()
    for i, piece in enumerate(["tk", ";", "mf"]):
        g.append([i], piece)
    g.consumed = 3
    assert g.cut_for_resume() == ""
    assert g.text == "tk;" and g.token_ids == [0, 1]


def test_cut_before_any_token():
    g = GeneratedText()
    g.append([7], ";mf")
    g.consumed = 1
    assert g.cut_for_resume() == ";"
    assert g.text == "" and g.token_ids == [] and g.token_ends == []


def test_no_cut_between_tokens_of_one_step():
    # Two tokens delivered with one text: where the first one ends is unknown, so a boundary
    # between them drops both (keeping the first would keep a token without its text).
    g = GeneratedText()
    g.append([1], "tk")
    g.append([2, 3], ";mf")  # true split: ';' + 'mf'
    assert g.token_ends == [2, 5, 5]
    g.consumed = 3
    assert g.cut_for_resume() == ";"
    assert g.token_ids == [1] and g.text == "tk"


def test_late_text_is_credited_to_the_tokens_that_showed_none():
    g = GeneratedText()
    g.append([1], "tk")
    g.append([2], "")        # held back by the detokenizer
    g.append([3], ";mf")     # ';' belongs to token 2 (or partly to token 1), 'mf' to token 3
    # Token 1 may have shown only part of its text (an incomplete UTF-8 sequence is held back
    # the same way), so no cut may fall after it either.
    assert g.token_ends == [5, 5, 5]
    g.consumed = 3
    assert g.cut_for_resume() == "tk;"
    assert g.token_ids == [] and g.text == ""
    # Text that arrives with no token at all belongs to the tokens before it.
    g = GeneratedText()
    g.append([1], "mf")
    g.append([2], ",")
    g.append([3], "")
    g.append([], "5")
    assert g.token_ends == [2, 4, 4]
    # A token that showed its text normally is not affected.
    g.append([4], "0")
    assert g.token_ends == [2, 4, 4, 5]
    g.append([5], ";")
    g.consumed = 6
    assert g.cut_for_resume() == ""
    assert g.token_ids == [1, 2, 3, 4, 5]


def test_cut_drops_tokens_whose_text_has_not_shown():
    g = GeneratedText()
    g.append([1], "tk;")
    g.append([2], "m")
    g.append([3], "")  # still held back
    g.consumed = 3
    # Token 3's text is unknown, and token 2 may have shown only part of its text.
    assert g.cut_for_resume() == ""
    assert g.token_ids == [1] and g.text == "tk;" and g.silent_tokens == 0


# Property: a vocabulary of small strings (boundaries can fall anywhere inside them), streamed
# in steps of 0..3 tokens; a step may show no text, its text arriving with a later step (what an
# incremental detokenizer does with an incomplete character), and held-back text may or may not
# be flushed before the cut.
_vocab = st.lists(st.text(alphabet="ab;{}_1 ", min_size=0, max_size=4), min_size=1, max_size=12)


@st.composite
def _streams(draw):
    vocab = draw(_vocab)
    steps = draw(st.lists(
        st.tuples(st.lists(st.integers(0, len(vocab) - 1), min_size=0, max_size=3), st.booleans()),
        min_size=1, max_size=25))
    return vocab, steps


def _feed(g, vocab, steps, flush=True):
    pending = ""
    truth: list[str] = []
    for ids, hold_back in steps:
        texts = [vocab[i] for i in ids]
        if hold_back and ids:
            g.append(ids, "")
            pending += "".join(texts)
        else:
            g.append(ids, pending + "".join(texts))
            pending = ""
        truth.extend(texts)
    if flush:
        g.append([], pending)
    return truth


@settings(max_examples=300, deadline=None)
@given(_streams(), st.booleans(), st.data())
def test_cut_for_resume_property(stream, flush, data):
    vocab, steps = stream
    g = GeneratedText()
    truth = _feed(g, vocab, steps, flush)
    original = g.text
    assert "".join(truth).startswith(original)
    if flush:
        assert original == "".join(truth)
    assert len(g.token_ends) == len(g.token_ids)
    assert all(a <= b for a, b in zip(g.token_ends, g.token_ends[1:]))
    assert all(0 <= e <= len(g.text) for e in g.token_ends)

    g.consumed = data.draw(st.integers(0, len(original)))
    keep_pending = data.draw(st.booleans())
    owed = g.cut_for_resume(keep_pending=keep_pending)
    if keep_pending:
        # Kept text reaches the boundary or beyond it (the statement in progress), never less
        # unless a silent token forced an earlier cut, whose text is then owed.
        assert g.text + owed == original[:max(g.consumed, len(g.text))]

    assert len(g.token_ends) == len(g.token_ids)
    assert all(e <= len(g.text) for e in g.token_ends)
    if g.token_ends:
        assert g.token_ends[-1] == len(g.text)
    # Kept tokens keep exactly their own text...
    assert g.text == "".join(vocab[i] for i in g.token_ids)
    assert g.token_ids == [i for ids, _ in steps for i in ids][:len(g.token_ids)]
    # ...and kept text + owed text is the original text up to the boundary.
    if not keep_pending:
        assert g.text + owed == original[:g.consumed]
    assert original.startswith(g.text + owed)

    # Resuming: the owed text comes back first, then more; nothing before `consumed` is
    # offered for segmentation again (a kept statement in progress is still pending).
    in_progress = (g.text + owed)[g.consumed:]
    g.append([99], owed + "x")
    assert g.text[:g.consumed] == original[:g.consumed]
    assert g.pending_text == in_progress + "x"
    if not keep_pending:
        assert in_progress == ""


# ------------------------------------------------------------------ resume_regex

def test_resume_regex_forms():
    program = minispec_regex(3)
    assert resume_regex("", None) is None
    assert resume_regex(";", None) is None
    assert resume_regex("", program) == program
    r = resume_regex(";", program)
    assert re.fullmatch(r, ";mf,60;") and not re.fullmatch(r, ";") and not re.fullmatch(r, "mf,60;")
    # A plan suspended after a complete program may end right away.
    r = resume_regex(";", program, may_end=True)
    assert re.fullmatch(r, ";") and re.fullmatch(r, ";mf,60;") and not re.fullmatch(r, "")
    r = resume_regex("", program, may_end=True)
    assert re.fullmatch(r, "") and re.fullmatch(r, "tk;")
    # Owed text is literal, even when it holds regex syntax.
    r = resume_regex("?_1==True{", program)
    assert r.startswith(re.escape("?_1==True{"))
    assert not re.fullmatch(r, "x_1==True{mf,60;")


def test_arm_resume_after_arrow_must_continue():
    program = arm_regex(5)
    r = resume_regex(">", program)  # boundary fell inside the token "->"
    assert re.fullmatch(r, ">pick(cup)") and not re.fullmatch(r, ">")


# ------------------------------------------------------------------ through the scheduler

class SemicolonGlueTokenizer(PieceTokenizer):
    """Glues ';' to the character after it, so tokens like ';m' straddle statement boundaries."""

    _PIECE = re.compile(r";[^;\s]|" + PieceTokenizer._PIECE.pattern, re.DOTALL)


class RecordingEngine(SimulatedEngine):
    def __init__(self, **kw):
        super().__init__(tokenizer=SemicolonGlueTokenizer(), **kw)
        self.requests = []

    def add_request(self, request):
        self.requests.append(request)
        super().add_request(request)


class Listener:
    def __init__(self):
        self.segments = []

    def on_segment(self, segment):
        self.segments.append(segment)

    def on_status(self, snapshot):
        pass


def _run(policy, plan):
    eng = RecordingEngine()
    lis = Listener()
    sch = SegmentScheduler(eng, get_policy(policy), load_skillsets(REPO / "config" / "skillsets"),
                           ExecutionTimeModel.from_yaml(REPO / "config" / "exec_model.yaml"), lis,
                           SchedulerConfig())
    levels = load_tuf_levels(REPO / "config" / "tuf_levels.yaml")
    task = sch.submit(TaskSpec("t", "drone_1", "drone", "fly", levels.get("normal"), eng.now(),
                               "normal", scripted_plan=plan))
    reported = 0
    while sch.active_tasks():
        if not sch.tick():
            eng.advance_idle(eng.now() + 0.01)
        for seg in task.segments[reported:]:
            sch.on_report("t", seg.sequence, eng.now(), eng.now(), True)
            reported += 1
    return sch, eng, lis, task


def test_glue_tokenizer_makes_tokens_straddle_boundaries():
    assert SemicolonGlueTokenizer().pieces("mf,50;mf,60;") == ["mf", ",", "50", ";m", "f", ",",
                                                                "60", ";"]


@pytest.mark.parametrize("policy", ["timelyllm", "fcfs-seg"])
def test_boundary_inside_a_token_gives_no_duplicate_segment(policy):
    plan = "mf,50;mf,60;tc,90;_1=iv,cup;?_1==True{a};ld;"
    sch, eng, lis, task = _run(policy, plan)
    assert task.state == "done", task.lifecycle.reason
    texts = [s.text for s in lis.segments]
    assert texts == ["mf,50;", "mf,60;", "tc,90;", "_1=iv,cup;", "?_1==True{a};", "ld;"]
    assert [s.is_last for s in lis.segments] == [False] * 5 + [True]
    assert "".join(texts) == plan
    # The final token ids are exactly the plan: nothing was lost or generated twice.
    assert eng.decode(task.generated.token_ids) == plan == task.generated.text
    resumed = [r for r in eng.requests if not r.request_id.startswith("__warmup__")][1:]
    assert len(resumed) == task.resumes == 5
    first = resumed[0]
    # The resumed prompt holds the kept tokens only ("mf,50" without the ';m' token) ...
    kept = first.prompt_token_ids[len(task.prompt_ids):]
    assert eng.decode(kept) == "mf,50"
    # ... the owed ';' comes first, and the plan may end there ("mf,50;" is a whole program).
    assert first.output_regex.startswith(re.escape(";"))
    assert re.fullmatch(first.output_regex, ";") and re.fullmatch(first.output_regex, ";mf,60;")
    assert not re.fullmatch(first.output_regex, "mf,60;")
    assert task.cached_tokens_total > 0


def test_resume_inside_an_open_block_must_continue():
    # The '{' of a conditional is not a boundary; but after "_1=iv,cup;" the plan is complete,
    # while a resumed arm plan after "->" is not (checked with arm_regex above).
    sch, eng, lis, task = _run("timelyllm", "_1=iv,cup;?_1==True{a};")
    resumed = [r for r in eng.requests if not r.request_id.startswith("__warmup__")][1:]
    assert re.fullmatch(resumed[0].output_regex, ";")
    assert [s.text for s in lis.segments] == ["_1=iv,cup;", "?_1==True{a};"]
