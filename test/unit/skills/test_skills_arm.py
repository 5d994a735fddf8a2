import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.skills.arm import ARM
from timelyllm_ros.core.skills.base import SkillCall, SkillSyntaxError

PLAN = "pick(red_block)->place(red_block, blue_block)->check(red_block)"


def segments_of(text):
    segments, pos = [], 0
    while (end := ARM.next_boundary(text, pos)) is not None:
        segments.append(text[pos:end])
        pos = end
    end = ARM.final_segment_end(text, pos)
    if end is not None:
        segments.append(text[pos:end])
        pos = end
    return segments, text[pos:]


def test_each_call_is_a_segment_with_its_arrow():
    segments, rest = segments_of(PLAN)
    assert segments == ["pick(red_block)->", "place(red_block, blue_block)->", "check(red_block)"]
    assert rest == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pick(a", None),
        ("pick(a)", None),  # the arrow may still come
        ("pick(a)-", None),
        ("pick(a) ", None),
        ("pick(a)->", 9),
        ("pick(a) -> place(a,b)", 10),
        ("pick(a)\nplace(a,b)", 7),
        ("pick(a)-x", 7),
    ],
)
def test_boundaries(text, expected):
    assert ARM.next_boundary(text, 0) == expected


def test_final_segment():
    assert ARM.final_segment_end("pick(a)", 0) == 7
    assert ARM.final_segment_end("pick(a)->place(a,", 9) is None
    assert ARM.final_segment_end("pick(a)->  ", 9) is None


def test_parse():
    parsed = ARM.parse(PLAN)
    assert parsed.calls == (
        SkillCall("pick", ("red_block",), "pick(red_block)"),
        SkillCall("place", ("red_block", "blue_block"), "place(red_block, blue_block)"),
        SkillCall("check", ("red_block",), "check(red_block)"),
    )
    assert ARM.parse("move(10, -5.5, 20)->").calls == (
        SkillCall("move", ("10", "-5.5", "20"), "move(10, -5.5, 20)"),
    )
    assert len(ARM.parse("pick(a)\nplace(a,b)").calls) == 2
    assert ARM.parse("pick(a)->").calls[0].to_wire() == "pick(a)"


@pytest.mark.parametrize(
    ("text", "position", "fragment"),
    [
        ("grab(a)", 0, "'grab'"),
        ("pick(a)->grab(a)", 9, "'grab'"),
        ("place(a)", 0, "takes 2"),
        ("move(a,1,2)", 5, "must be num"),
        ("pick(1)", 5, "must be obj"),
        ("pick(a)place(a,b)", 7, "'->'"),
        ("pick(a", 6, "')'"),
        ("pick a", 5, "'('"),
        ("", 0, "skill name"),
        ("->pick(a)", 0, "skill name"),
        ("pick(a)->->", 9, "skill name"),
    ],
)
def test_syntax_errors(text, position, fragment):
    with pytest.raises(SkillSyntaxError) as info:
        ARM.parse(text)
    assert info.value.position == position
    assert fragment in str(info.value)


def test_regex():
    regex = ARM.output_regex(3)
    assert re.fullmatch(regex, "pick(red_block)->place(red_block,blue_block)->check(red_block)")
    assert re.fullmatch(regex, "move(10, -5.5, 20)")
    for garbage in ["", "pick(a)->", "grab(a)", "pick(A)", "pick(a)->pick(a)->pick(a)->pick(a)",
                    "move(1000,0,0)", "I will pick(a)"]:
        assert re.fullmatch(regex, garbage) is None, garbage
    with pytest.raises(ValueError):
        ARM.output_regex(0)


_objs = st.tuples(st.sampled_from("abcxyz"), st.text("ab_", max_size=8)).map("".join)
_nums = st.one_of(st.integers(-999, 999).map(str), st.sampled_from(["0.5", "-12.25"]))
_sep = st.sampled_from([",", ", "])
_calls = st.one_of(
    _objs.map(lambda o: f"pick({o})"),
    st.tuples(_objs, _sep, _objs).map(lambda t: f"place({t[0]}{t[1]}{t[2]})"),
    st.tuples(_nums, _sep, _nums, _sep, _nums).map(lambda t: "move({})".format("".join(t))),
    _objs.map(lambda o: f"check({o})"),
)


@st.composite
def plans(draw):
    """A plan and its expected segments; a separator is `->` (maybe spaced) or a newline."""
    calls = draw(st.lists(_calls, min_size=1, max_size=8))
    segments, lead = [], ""
    for index, call in enumerate(calls):
        if index == len(calls) - 1:
            segments.append(lead + call)
            break
        arrow = draw(st.sampled_from(["->", " ->", "\n"]))
        if arrow == "\n":
            segments.append(lead + call)
            lead = "\n"
        else:
            segments.append(lead + call + arrow)
            lead = draw(st.sampled_from(["", " "]))
    return "".join(segments), segments


@settings(max_examples=60, deadline=None)
@given(plans())
def test_segments_rejoin_and_parse(plan_and_segments):
    plan, expected = plan_and_segments
    segments, rest = segments_of(plan)
    assert segments == expected
    assert "".join(segments) + rest == plan
    calls = [c for s in segments for c in ARM.parse(s).calls]
    assert tuple(calls) == ARM.parse(plan).calls
    pos = 0
    while (end := ARM.next_boundary(plan, pos)) is not None:
        for k in range(pos, min(len(plan), end + 3) + 1):
            assert ARM.next_boundary(plan[:k], pos) in (None, end)
        pos = end


@settings(max_examples=30, deadline=None)
@given(st.from_regex(ARM.output_regex(4), fullmatch=True))
def test_every_string_the_regex_admits_parses(plan):
    segments, rest = segments_of(plan)
    assert "".join(segments) == plan and rest == ""
    assert sum(len(ARM.parse(s).calls) for s in segments) == len(ARM.parse(plan).calls)
