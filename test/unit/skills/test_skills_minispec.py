import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.skills.base import SkillCall, SkillSyntaxError
from timelyllm_ros.core.skills.minispec import MINISPEC, SKILLS, closes_quote

TYPEFLY_EXAMPLE = "_1=s,bottle;?_1==True{o,bottle;_2=oh,bottle;l,_2}"


def segments_of(lang, text):
    """Cut `text` the way the scheduler does: boundaries while generating, then the tail."""
    segments, pos = [], 0
    while (end := lang.next_boundary(text, pos)) is not None:
        assert end > pos
        segments.append(text[pos:end])
        pos = end
    end = lang.final_segment_end(text, pos)
    if end is not None:
        segments.append(text[pos:end])
        pos = end
    return segments, text[pos:]


def brace_depths_ok(segment):
    """Braces balance outside strings (a quote ends a string only before a delimiter)."""
    depth, quote = 0, None
    for i, c in enumerate(segment):
        if quote:
            quote = None if c == quote and closes_quote(segment, i) else quote
        elif c in "'\"":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0 and quote is None


# ---------------------------------------------------------------------------------------------
# Hand-written segmentation cases


def test_typefly_example_splits_into_two_segments():
    segments, rest = segments_of(MINISPEC, TYPEFLY_EXAMPLE)
    assert segments == ["_1=s,bottle;", "?_1==True{o,bottle;_2=oh,bottle;l,_2}"]
    assert rest == ""


def test_incomplete_statement_has_no_boundary_but_is_final():
    assert MINISPEC.next_boundary("mf,5", 0) is None
    assert MINISPEC.final_segment_end("mf,5", 0) == 4
    assert MINISPEC.next_boundary("mf,5;", 0) == 5


def test_open_block_is_never_a_segment():
    text = "8{mf,5;tc,45;"
    assert MINISPEC.next_boundary(text, 0) is None
    assert MINISPEC.final_segment_end(text, 0) is None


def test_nested_braces_stay_in_one_top_level_segment():
    text = "3{?_1==True{mf,5;tc,90};d,100};l,'done';p"
    segments, rest = segments_of(MINISPEC, text)
    assert segments == ["3{?_1==True{mf,5;tc,90};d,100};", "l,'done';", "p"]
    assert rest == ""
    assert [c.name for c in MINISPEC.parse(segments[0]).calls] == [
        "move_forward",
        "turn_cw",
        "delay",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8{mf,5}", None),  # a `;` may still follow and would belong to the block
        ("8{mf,5}  ", None),
        ("8{mf,5};", 8),
        ("8{mf,5} ;", 9),
        ("8{mf,5}p;", 7),
        ("8{mf,5} p;", 7),
    ],
)
def test_block_end_waits_for_the_next_visible_character(text, expected):
    assert MINISPEC.next_boundary(text, 0) == expected


def test_block_at_end_of_generation_is_final():
    assert MINISPEC.final_segment_end("tk;8{mf,5}", 3) == 10
    assert MINISPEC.final_segment_end("tk;8{mf,5}  ", 3) == 12


def test_semicolon_inside_quotes_is_not_a_boundary():
    text = "l,'a;b{';p;"
    assert MINISPEC.next_boundary(text, 0) == 9
    assert MINISPEC.parse(text[:9]).calls == (SkillCall("log", ("'a;b{'",), "l,'a;b{'"),)


def test_boundary_search_starts_at_start():
    text = "mf,5;tc,90;"
    assert MINISPEC.next_boundary(text, 5) == 11


def test_stray_semicolons_ride_with_the_next_statement():
    assert MINISPEC.next_boundary(";mf,5;", 0) == 6
    assert MINISPEC.final_segment_end(" ; ", 0) is None
    assert MINISPEC.parse(";;mf,5;").calls == (SkillCall("move_forward", ("5",), "mf,5"),)


# ---------------------------------------------------------------------------------------------
# Parser


def test_parse_collects_calls_in_textual_order():
    parsed = MINISPEC.parse(TYPEFLY_EXAMPLE)
    assert parsed.text == TYPEFLY_EXAMPLE
    assert parsed.calls == (
        SkillCall("sweeping", ("bottle",), "s,bottle"),
        SkillCall("orienting", ("bottle",), "o,bottle"),
        SkillCall("object_height", ("bottle",), "oh,bottle"),
        SkillCall("log", ("_2",), "l,_2"),
    )


def test_parse_accepts_every_statement_kind():
    text = (
        "tk; mf,120;tc,45;_1=iv,bottle;_2=True;->_1;4{tu,90;d,500};"
        "?_1==True&_2>0.5|_3!=False{a;p};q,'what is it?';sa,'something red';ld"
    )
    names = [c.name for c in MINISPEC.parse(text).calls]
    assert names == [
        "takeoff",
        "move_forward",
        "turn_cw",
        "is_visible",
        "turn_ccw",
        "delay",
        "approach",
        "picture",
        "query",
        "sweeping_abstract",
        "land",
    ]


def test_block_may_be_followed_directly_by_a_statement():
    assert len(MINISPEC.parse("2{mf,5}tc,90").calls) == 2


def test_every_skill_in_the_table_parses():
    sample = {"int": "10", "obj": "cup", "text": "'hi'"}
    for abbrev, spec in SKILLS.items():
        text = ",".join([abbrev, *(sample[k] for k in spec.args)])
        (call,) = MINISPEC.parse(text).calls
        assert call.name == spec.name
        assert call.source == text


@pytest.mark.parametrize(
    ("text", "position", "fragment"),
    [
        ("mf,5;zz,3", 5, "'zz'"),
        ("mf;", 0, "takes 1 argument"),
        ("mf,5,6;", 0, "takes 1 argument"),
        ("mf,abc", 3, "must be int"),
        ("iv,3", 3, "must be obj"),
        ("8{mf,5", 6, "unclosed"),
        ("mf,5}", 4, "unmatched"),
        ("8{}", 1, "empty loop"),
        ("?_1=True{p}", 3, "comparator"),
        ("0{p}", 0, "positive"),
        ("l,'abc", 2, "unterminated"),
        ("mf,5 tc,9", 5, "expected ';'"),
        ("_1 iv,cup", 3, "'='"),
        ("mf,5;#", 5, "unexpected character"),
        ("mf,", 3, "argument"),
    ],
)
def test_syntax_errors_carry_positions(text, position, fragment):
    with pytest.raises(SkillSyntaxError) as info:
        MINISPEC.parse(text)
    assert info.value.position == position
    assert fragment in str(info.value)


def test_truncated_tail_is_returned_and_reported_by_parse():
    end = MINISPEC.final_segment_end("mf,5;tc,", 5)
    assert end == 8
    with pytest.raises(SkillSyntaxError):
        MINISPEC.parse("tc,")


# ---------------------------------------------------------------------------------------------
# Output regex


@pytest.mark.parametrize(
    "plan",
    [
        TYPEFLY_EXAMPLE,
        TYPEFLY_EXAMPLE + ";",
        "tk;mf,120;tc,45;ld",
        "4{mf,100;tc,90};",
        "_1=iv,chair;?_1==True{o,chair;a};?_1==False{ld};",
        "_1=ox,person;?_1>0.6{tc,15};?_1<0.4{tu,15}",
        "_1=q,'what color is it?';l,_1",
        "->True",
    ],
)
def test_regex_accepts_typical_plans(plan):
    assert re.fullmatch(MINISPEC.output_regex(8), plan)
    MINISPEC.parse(plan)


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "hello world",
        "mf,5000",
        "zz,5",
        "mf,5;;",
        "mf 5",
        "8{8{8{mf,5}}}",  # blocks nest two levels deep in the regex, not three
        "8{}",
        "l,'a;b'",
        "iv,Bottle",
        "mf,5;" * 9,
        "Plan: mf,5",
    ],
)
def test_regex_rejects_garbage(garbage):
    assert re.fullmatch(MINISPEC.output_regex(8), garbage) is None


def test_regex_counts_top_level_statements():
    regex = MINISPEC.output_regex(3)
    assert re.fullmatch(regex, "p;p;4{p;p;p}")
    assert re.fullmatch(regex, "p;p;p;")
    assert re.fullmatch(regex, "p;p;p;p") is None


def test_regex_is_a_plain_regular_language():
    regex = MINISPEC.output_regex(8)
    for construct in ("(?=", "(?!", "(?<", "(?P", "\\1", "\\b"):
        assert construct not in regex
    with pytest.raises(ValueError):
        MINISPEC.output_regex(0)


# ---------------------------------------------------------------------------------------------
# Property tests: plans from the grammar

_ints = st.integers(1, 999).map(str)
_vars = st.integers(1, 9).map(lambda n: f"_{n}")
_objs = st.tuples(st.sampled_from("abcxyz"), st.text("abop_", max_size=15)).map("".join)
_operands = st.one_of(_vars, st.sampled_from(["True", "False", "0.5", "0.25", "3", "120"]))


def _calls(texts):
    args = {
        "int": st.one_of(_ints, _vars),
        "obj": st.one_of(_objs, _vars),
        "text": st.one_of(texts, _vars),
    }
    specs = sorted(SKILLS.values(), key=lambda s: s.abbrev)
    return st.sampled_from(specs).flatmap(
        lambda spec: st.tuples(*(args[k] for k in spec.args)).map(
            lambda values: ",".join([spec.abbrev, *values])
        )
    )


def _simples(texts):
    calls = _calls(texts)
    return st.one_of(
        calls,
        st.tuples(_vars, calls).map("=".join),
        st.one_of(_vars, st.just("True")).map(lambda v: f"->{v}"),
    )


_comparison = st.tuples(_vars, st.sampled_from(["==", "!=", "<", ">"]), _operands).map("".join)
_condition = st.lists(st.tuples(st.sampled_from("&|"), _comparison), min_size=1, max_size=3).map(
    lambda parts: "".join(op + c for op, c in parts)[1:]
)


def _blocks(body):
    heads = st.one_of(st.integers(2, 12).map(str), _condition.map(lambda c: "?" + c))
    bodies = st.tuples(st.lists(body, min_size=1, max_size=3), st.booleans())
    return st.tuples(heads, bodies).map(
        lambda t: t[0] + "{" + ";".join(t[1][0]) + (";" if t[1][1] else "") + "}"
    )


# Quoted text hostile to a naive segmenter, for the parser and segmenter tests.
_wild_simple = _simples(st.text("ab ;{}", max_size=6).map(lambda t: f"'{t}'"))
# (text, is_block); blocks nest up to three levels deep.
_statement = st.recursive(
    _wild_simple.map(lambda s: (s, False)),
    lambda inner: _blocks(inner.map(lambda t: t[0])).map(lambda s: (s, True)),
    max_leaves=6,
)


@st.composite
def plans(draw):
    """A plan and its expected segments: statement + terminator, whitespace leading the next."""
    statements = draw(st.lists(_statement, min_size=1, max_size=6))
    segments, lead = [], ""
    for index, (text, is_block) in enumerate(statements):
        last = index == len(statements) - 1
        term = draw(st.sampled_from(["", ";"])) if last or is_block else ";"
        segments.append(lead + text + term)
        lead = "" if last else draw(st.sampled_from(["", "", " ", "\n"]))
    return "".join(segments), segments


@settings(max_examples=60, deadline=None)
@given(plans())
def test_segments_rejoin_parse_and_respect_braces(plan_and_segments):
    plan, expected = plan_and_segments
    segments, rest = segments_of(MINISPEC, plan)
    assert "".join(segments) + rest == plan
    assert rest == ""
    assert segments == expected
    calls = []
    for segment in segments:
        assert brace_depths_ok(segment)
        calls.extend(MINISPEC.parse(segment).calls)
    assert tuple(calls) == MINISPEC.parse(plan).calls


@settings(max_examples=25, deadline=None)
@given(plans())
def test_boundaries_do_not_depend_on_how_text_streams_in(plan_and_segments):
    plan, _ = plan_and_segments
    pos = 0
    while (end := MINISPEC.next_boundary(plan, pos)) is not None:
        for k in range(pos, min(len(plan), end + 3) + 1):
            assert MINISPEC.next_boundary(plan[:k], pos) in (None, end)
        pos = end


_regex_simple = _simples(st.text("aZ0 ,.?", min_size=1, max_size=12).map(lambda t: f"'{t}'"))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.one_of(_regex_simple, _blocks(_regex_simple)), min_size=1, max_size=8),
    st.booleans(),
)
def test_grammar_plans_with_one_nesting_level_match_the_regex(statements, trailing):
    plan = ";".join(statements) + (";" if trailing else "")
    assert re.fullmatch(MINISPEC.output_regex(8), plan), plan
    MINISPEC.parse(plan)


@settings(max_examples=30, deadline=None)
@given(st.from_regex(MINISPEC.output_regex(4), fullmatch=True))
def test_every_string_the_regex_admits_parses_and_segments(plan):
    parsed = MINISPEC.parse(plan)
    segments, rest = segments_of(MINISPEC, plan)
    assert "".join(segments) == plan
    assert rest == ""
    calls = []
    for segment in segments:
        assert brace_depths_ok(segment)
        calls.extend(MINISPEC.parse(segment).calls)
    assert tuple(calls) == parsed.calls
