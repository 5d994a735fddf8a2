"""The paper's chat experiment (Fig. 10, bench/chat_experiment.py) and the bench's two
configurations (`--paper-config`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from timelyllm_ros.bench.chat_experiment import (RUNS, STORY_WORDS_MEAN, chat_skill_sets,
                                                 format_chat_experiment, run_chat_experiment,
                                                 stories_workload, story, traces_for)
from timelyllm_ros.cli import bench as cli


def test_stories_have_the_shape_of_writingprompts():
    rng = np.random.default_rng(3)
    text = story(rng, 120, 0)
    assert len(text.split()) == 120
    paragraphs = text.split("\n\n")
    assert len(paragraphs) >= 2 and all(p.endswith(".") for p in paragraphs)
    workload, events, prompts, stories = stories_workload(2.0, 200.0, seed=1)
    assert len(events) == len(prompts) == len(stories) and 300 < len(events) < 500
    mean_words = np.mean([len(s.split()) for s in stories])
    assert 0.8 * STORY_WORDS_MEAN < mean_words < 1.2 * STORY_WORDS_MEAN
    again = stories_workload(2.0, 200.0, seed=1)
    assert again[3] == stories and [e.time_s for e in again[1]] == [e.time_s for e in events]
    with pytest.raises(ValueError, match="chat rate"):
        stories_workload(0.0, 10.0)


def test_both_segmentations_cut_the_same_story_where_they_should():
    sets = chat_skill_sets()
    text = story(np.random.default_rng(0), 200, 0)
    sentences = sets["chat"].language
    paragraphs = sets["chat-paragraph"].language
    first_sentence = sentences.next_boundary(text + " ", 0)
    first_paragraph = paragraphs.next_boundary(text, 0)
    assert first_sentence is not None and first_paragraph is not None
    assert first_sentence < first_paragraph
    assert text[:first_paragraph].strip() == text.split("\n\n")[0]
    _, _, prompts, stories = stories_workload(1.0, 5.0, seed=0)
    traces = traces_for(prompts, stories, "paragraph")
    assert {t.skill_set for t in traces.values()} == {"chat-paragraph"}


def test_sentences_answer_sooner_than_paragraphs_on_the_same_requests():
    runs = [r for r in RUNS if r[0] in ("timelyllm-wc-sen", "timelyllm-wc-para", "vllm-stream")]
    doc = run_chat_experiment(rates=[0.5], duration_s=20.0, seed=2, runs=runs)
    sen, para = doc["runs"]["timelyllm-wc-sen"], doc["runs"]["timelyllm-wc-para"]
    assert doc["tasks"][0] > 3
    # A first paragraph takes several sentences' worth of tokens: later, and past ERT (1 s).
    assert sen["response_time_mean_s"][0] < para["response_time_mean_s"][0]
    assert sen["utility_mean"][0] > para["utility_mean"][0]
    # At light load the default serves like streaming (work-conserving: nothing to yield to).
    stream = doc["runs"]["vllm-stream"]
    assert sen["utility_mean"][0] == pytest.approx(stream["utility_mean"][0], abs=0.01)
    table = format_chat_experiment(doc)
    assert "timelyllm-wc-para" in table and "vllm-stream" in table


def test_cli_chat_experiment_writes_table_json_and_figure(tmp_path, capsys, monkeypatch):
    import timelyllm_ros.bench.chat_experiment as chat
    monkeypatch.setattr(chat, "RUNS", tuple(r for r in chat.RUNS
                                            if r[0] in ("timelyllm-wc-sen", "vllm-priority")))
    rc = cli.main(["--chat-experiment", "--chat-rates", "0.5", "--duration-s", "10",
                   "--no-progress", "--json", str(tmp_path / "chat.json"),
                   "--plots", str(tmp_path / "fig")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "timelyllm-wc-sen" in out and "vllm-priority" in out
    doc = json.loads((tmp_path / "chat.json").read_text())
    assert doc["rates"] == [0.5] and set(doc["runs"]) == {"timelyllm-wc-sen", "vllm-priority"}
    assert (tmp_path / "fig" / "chat_experiment.png").stat().st_size > 10_000


def test_cli_needs_a_workload_without_the_chat_experiment(capsys):
    assert cli.main(["--policies", "vllm-stream", "--no-progress"]) == 2
    assert "--workload is required" in capsys.readouterr().err


@pytest.mark.parametrize("flags, prompt_tokens, baseline_cache", [
    ([], None, True),
    (["--paper-config"], 2884, False),
    (["--paper-config", "--baseline-prefix-cache", "on"], 2884, True),
    (["--paper-config", "--prompt-tokens", "none"], None, False),
])
def test_modern_configuration_by_default_and_the_papers_on_request(
        tmp_path, capsys, flags, prompt_tokens, baseline_cache):
    out = tmp_path / "r.json"
    assert cli.main(["--workload", "WID1", "--duration-s", "6", "--policies", "vllm-stream",
                     "--no-progress", "--json", str(out), *flags]) == 0
    bench = json.loads(out.read_text())["workload"]["bench"]
    assert bench["prompt_tokens"] == prompt_tokens
    assert bench["baseline_prefix_cache"] is baseline_cache
