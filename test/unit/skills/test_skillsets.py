import re
from pathlib import Path

import pytest
import yaml

from timelyllm_ros.core.skills import ARM, MINISPEC, get_language, known_languages
from timelyllm_ros.core.skills.chat import ChatLanguage
from timelyllm_ros.core.skills.skillset import load_skillsets

CONFIG = Path(__file__).resolve().parents[3] / "config" / "skillsets"

VALID = {
    "language": "minispec",
    "system_prompt": "Fly.",
    "user_template": "Task: {instruction}",
    "max_statements": 8,
    "max_segment_tokens": 10,
    "max_plan_tokens": 64,
}


@pytest.fixture(scope="module")
def skillsets():
    return load_skillsets(CONFIG)


def test_registry():
    assert get_language("minispec") is MINISPEC
    assert get_language("drone") is MINISPEC
    assert get_language("arm") is ARM
    assert isinstance(get_language("chat"), ChatLanguage)
    assert get_language("chat-paragraph").mode == "paragraph"
    assert get_language("tool-call").name == "tool-call"
    assert set(known_languages()) == {"minispec", "drone", "arm", "chat", "chat-paragraph",
                                      "tool-call"}
    with pytest.raises(KeyError) as info:
        get_language("klingon")
    assert "klingon" in str(info.value)
    assert all(name in str(info.value) for name in known_languages())


def test_shipped_skillsets(skillsets):
    assert set(skillsets) == {"drone", "arm", "chat"}
    drone, arm, chat = skillsets["drone"], skillsets["arm"], skillsets["chat"]
    assert drone.language is MINISPEC and arm.language is ARM and chat.language.name == "chat"
    assert (drone.max_statements, drone.max_segment_tokens, drone.max_plan_tokens) == (8, 10, 64)
    assert (arm.max_statements, arm.max_segment_tokens, arm.max_plan_tokens) == (12, 24, 160)
    assert (chat.max_segment_tokens, chat.max_plan_tokens) == (60, 200)
    assert chat.output_regex() is None


@pytest.mark.parametrize("name", ["drone", "arm", "chat"])
def test_prompts_are_small(skillsets, name):
    # SmolLM2-135M: stay under ~600 tokens; about 3 characters per token is a safe bound here.
    assert len(skillsets[name].system_prompt) / 3 < 600


@pytest.mark.parametrize("name", ["drone", "arm"])
def test_prompt_examples_are_valid_constrained_plans(skillsets, name):
    skillset = skillsets[name]
    plans = re.findall(r"^Plan: (.+)$", skillset.system_prompt, flags=re.MULTILINE)
    assert len(plans) >= 3
    for plan in plans:
        assert re.fullmatch(skillset.output_regex(), plan), plan
        assert skillset.language.parse(plan).calls


def test_render_messages_keeps_braces(skillsets):
    messages = skillsets["drone"].render_messages("find the {red} cup")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == skillsets["drone"].system_prompt
    assert messages[1]["content"] == "Task: find the {red} cup\nPlan:"


def write(tmp_path, data, name="bad.yaml"):
    (tmp_path / name).write_text(yaml.safe_dump(data))
    return tmp_path


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"colour": "red"}, "colour"),
        ({"max_statements": 0}, "max_statements"),
        ({"max_plan_tokens": True}, "max_plan_tokens"),
        ({"max_segment_tokens": "10"}, "max_segment_tokens"),
        ({"user_template": "no placeholder"}, "user_template"),
        ({"system_prompt": ""}, "system_prompt"),
        ({"language": "klingon"}, "language"),
    ],
)
def test_bad_values_name_file_and_key(tmp_path, change, key):
    with pytest.raises(ValueError) as info:
        load_skillsets(write(tmp_path, {**VALID, **change}))
    assert "bad.yaml" in str(info.value) and key in str(info.value)


@pytest.mark.parametrize("key", sorted(VALID))
def test_missing_keys_name_file_and_key(tmp_path, key):
    data = {k: v for k, v in VALID.items() if k != key}
    with pytest.raises(ValueError) as info:
        load_skillsets(write(tmp_path, data))
    assert "bad.yaml" in str(info.value) and repr(key) in str(info.value)


def test_loader_edge_cases(tmp_path):
    loaded = load_skillsets(write(tmp_path, VALID, name="tiny.yaml"))
    assert loaded["tiny"].name == "tiny"
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="list.yaml"):
        load_skillsets(tmp_path)
    with pytest.raises(ValueError):
        load_skillsets(tmp_path / "missing")
