import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.core.skills.chat import ChatLanguage, reading_time_s

SENTENCE = ChatLanguage("sentence")
PARAGRAPH = ChatLanguage("paragraph")


def segments_of(lang, text):
    segments, pos = [], 0
    while (end := lang.next_boundary(text, pos)) is not None:
        segments.append(text[pos:end])
        pos = end
    end = lang.final_segment_end(text, pos)
    if end is not None:
        segments.append(text[pos:end])
        pos = end
    return segments, text[pos:]


def test_sentences():
    segments, rest = segments_of(SENTENCE, "Hello there. How are you?  Fine!")
    assert segments == ["Hello there. ", "How are you? ", " Fine!"]
    assert rest == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello.", None),  # could still be "Hello.5" or "Hello..."
        ("Hello.\n", 7),
        ("Wait... what", 8),
        ('He said "go." Then', 14),
        ("It is 3.5 meters. Yes", 18),
        ("Dr. Smith is here. Yes", 19),
        ("e.g. this one! ok", 15),
        ("... ok", None),
        ("", None),
    ],
)
def test_sentence_boundaries(text, expected):
    assert SENTENCE.next_boundary(text, 0) == expected


def test_paragraphs():
    text = "First line.\nStill first.\n  \nSecond.\n\n\nThird"
    segments, rest = segments_of(PARAGRAPH, text)
    assert segments == ["First line.\nStill first.\n  \n", "Second.\n\n", "\nThird"]
    assert rest == ""
    assert PARAGRAPH.next_boundary("One paragraph.\n", 0) is None


def test_final_segment_needs_words():
    assert SENTENCE.final_segment_end("Done. ", 6) is None
    assert SENTENCE.final_segment_end("Done. Bye", 6) == 9
    assert PARAGRAPH.final_segment_end("\n\n", 0) is None


def test_parse_says_the_text():
    assert SENTENCE.parse(" Hello there. ").calls == (
        SkillCall("say", ("Hello there.",), "Hello there."),
    )
    assert SENTENCE.parse("  \n").calls == ()
    assert SENTENCE.output_regex(8) is None


def test_names_and_modes():
    assert SENTENCE.name == "chat"
    assert PARAGRAPH.name == "chat-paragraph"
    with pytest.raises(ValueError, match="line"):
        ChatLanguage("line")


def test_reading_time():
    assert reading_time_s(" ".join(["word"] * 300)) == pytest.approx(60.0)
    assert reading_time_s("one two three four five") == pytest.approx(1.0)
    assert reading_time_s("one two", words_per_minute=60) == pytest.approx(2.0)
    assert reading_time_s("") == 0.0
    with pytest.raises(ValueError):
        reading_time_s("x", words_per_minute=0)


_words = st.lists(
    st.sampled_from(["robot", "the", "cup", "3.5", "ok", "Dr."]), min_size=1, max_size=5
)
_sentences = st.tuples(_words, st.sampled_from([".", "!", "?", "...", '."'])).map(
    lambda t: " ".join(t[0]) + t[1]
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(_sentences, st.sampled_from([" ", "\n", "\n\n", " \n \n"])),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from([SENTENCE, PARAGRAPH]),
)
def test_segments_rejoin_and_boundaries_are_stable(parts, lang):
    text = "".join(s + sep for s, sep in parts).rstrip()
    segments, rest = segments_of(lang, text)
    assert "".join(segments) + rest == text
    assert rest.strip() == ""
    for segment in segments:
        (call,) = lang.parse(segment).calls
        assert call.args[0] == segment.strip()
    pos = 0
    while (end := lang.next_boundary(text, pos)) is not None:
        for k in range(pos, min(len(text), end + 3) + 1):
            assert lang.next_boundary(text[:k], pos) in (None, end)
        pos = end
