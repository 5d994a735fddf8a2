"""The paper's chat experiment (§7.4.2, Fig. 10): story writing served with sentence and with
paragraph segmentation, against the engines a user would otherwise run.

    timelyllm bench --chat-experiment [--chat-rate 0.5,1,2] [--duration-s 120] [--plots DIR]

People ask for stories (prompts like WritingPrompts'); each reply is read as it arrives, so a
segment's "execution" is its reading time at 300 words per minute (`say` in
config/exec_model.yaml), and the TUF is the normal one (ERT 1 s, the paper's human-interaction
level). The response is the first sentence (or paragraph) on screen; the waiting time is how long
the reader waited for text beyond their own reading.

Stories are generated text with WritingPrompts' published shape (Fan et al., 2018: prompts of
28.4 words and stories of 734.5 words on average), drawn lognormal and capped so that a story
fits the model context; paragraphs of 3-6 sentences, sentences of 8-25 words. The simulated
engine "generates" each story as scripted text; its cost model does the timing.

Every policy replays the same stories and arrivals: `timelyllm-wc` and `timelyllm` with sentence
segments (`-sen`) and with paragraph segments (`-para`), and `vllm-stream` / `vllm-priority`,
which stream the same text (sentence by sentence) without segmenting the generation.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.metrics import compute_metrics
from timelyllm_ros.bench.replay import ProgressFn, run_policy
from timelyllm_ros.core.skills import get_language
from timelyllm_ros.core.skills.skillset import SkillSet, load_skillsets
from timelyllm_ros.core.tuf import default_config_dir
from timelyllm_ros.lrtrace.traces import Trace
from timelyllm_ros.lrtrace.workload import Event, TaskSpec, Workload

# WritingPrompts (Fan et al., ACL 2018, Table 1): mean prompt and story lengths in words.
PROMPT_WORDS_MEAN = 28.4
STORY_WORDS_MEAN = 734.5
# Our choices: lognormal spread, and a cap that keeps prompt + story inside an 8k context.
STORY_SIGMA = 0.5
STORY_WORDS_CAP = 1500
DEFAULT_RATES = (0.25, 0.5, 1.0, 2.0)
DEFAULT_DURATION_S = 120.0
# (label, policy, segmentation): the runs of one load.
RUNS = (("timelyllm-wc-sen", "timelyllm-wc", "sentence"),
        ("timelyllm-wc-para", "timelyllm-wc", "paragraph"),
        ("timelyllm-sen", "timelyllm", "sentence"),
        ("timelyllm-para", "timelyllm", "paragraph"),
        ("vllm-stream", "vllm-stream", "sentence"),
        ("vllm-priority", "vllm-priority", "sentence"))
_SETS = {"sentence": "chat", "paragraph": "chat-paragraph"}


def _word(i: int) -> str:
    # Letters only, so the simulated tokenizer sees one token per word.
    out = ""
    while True:
        i, r = divmod(i, 26)
        out += "abcdefghijklmnopqrstuvwxyz"[r]
        if i == 0:
            return "w" + out


def story(rng: np.random.Generator, words: int, offset: int) -> str:
    """`words` words of prose: sentences of 8-25 words in paragraphs of 3-6 sentences."""
    paragraphs, sentences, used = [], [], 0
    target = int(rng.integers(3, 7))
    while used < words:
        n = min(int(rng.integers(8, 26)), words - used) or 1
        text = " ".join(_word(offset + used + k) for k in range(n))
        sentences.append(text.capitalize() + ".")
        used += n
        if len(sentences) == target:
            paragraphs.append(" ".join(sentences))
            sentences, target = [], int(rng.integers(3, 7))
    if sentences:
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs)


def chat_skill_sets(config_dir=None) -> dict[str, SkillSet]:
    """The chat skill set with room for a story, by sentences (`chat`) and by paragraphs
    (`chat-paragraph`)."""
    base = load_skillsets((config_dir or default_config_dir()) / "skillsets")["chat"]
    roomy = dataclasses.replace(base, max_statements=400, max_plan_tokens=2200)
    return {"chat": dataclasses.replace(roomy, max_segment_tokens=60),
            "chat-paragraph": dataclasses.replace(roomy, name="chat-paragraph",
                                                  language=get_language("chat-paragraph"),
                                                  max_segment_tokens=400)}


def stories_workload(rate_per_s: float, duration_s: float, seed: int = 0
                     ) -> tuple[Workload, list[Event], list[str], list[str]]:
    """(workload, events, prompts, stories): Poisson arrivals of story requests, one reader
    each. The event list is the same for both segmentations; `traces_for` names the set."""
    if not (rate_per_s > 0 and math.isfinite(rate_per_s)):
        raise ValueError(f"chat rate: must be a positive number, got {rate_per_s!r}")
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate_per_s, int(rate_per_s * duration_s * 2) + 8))
    times = times[times < duration_s]
    mu = math.log(STORY_WORDS_MEAN) - STORY_SIGMA ** 2 / 2
    lengths = np.clip(np.rint(rng.lognormal(mu, STORY_SIGMA, len(times))), 40, STORY_WORDS_CAP)
    prompts, stories = [], []
    for i, words in enumerate(lengths.astype(int)):
        n = max(5, int(round(rng.normal(PROMPT_WORDS_MEAN, 8))))
        prompts.append("Write a story: " + " ".join(_word(10_000_000 + 1000 * i + k)
                                                   for k in range(n)))
        stories.append(story(rng, int(words), 100_000 * (i + 1)))
    events = [Event(float(t), i, (TaskSpec(i, f"reader_{i}", i + 1, "chat"),))
              for i, t in enumerate(times)]
    workload = Workload(name=f"stories@{rate_per_s:g}/s", eps=rate_per_s, max_tpe=1,
                        traces=tuple(range(1, len(times) + 1)), agents=len(times),
                        duration_s=duration_s, seed=seed,
                        description="WritingPrompts-like story requests (Fig. 10)")
    return workload, events, prompts, stories


def traces_for(prompts: Sequence[str], stories: Sequence[str], segmentation: str
               ) -> dict[int, Trace]:
    skill_set = _SETS[segmentation]
    return {i + 1: Trace(i + 1, p, "chat", "chat", skill_set, s, max_plan_tokens=2200)
            for i, (p, s) in enumerate(zip(prompts, stories))}


def run_chat_experiment(rates: Sequence[float] = DEFAULT_RATES,
                        duration_s: float = DEFAULT_DURATION_S, seed: int = 0,
                        config: BenchConfig | None = None,
                        progress_factory: Callable[[str], ProgressFn] | None = None,
                        runs: Sequence[tuple[str, str, str]] | None = None) -> dict[str, Any]:
    """{"rates": [...], "tasks": [...], "runs": {label: {"utility_mean": [...],
    "response_time_mean_s": [...], "response_time_p99_s": [...], "waiting_time_mean_s": [...],
    "deadline_miss_rate": [...]}}}: one entry per rate."""
    config = config or BenchConfig()
    runs = RUNS if runs is None else runs  # read at call time (tests narrow it)
    skill_sets = chat_skill_sets(config.skillsets_dir)
    out: dict[str, Any] = {"rates": list(rates), "tasks": [], "duration_s": duration_s,
                           "seed": seed, "runs": {label: {} for label, _, _ in runs}}
    for rate in rates:
        workload, events, prompts, stories = stories_workload(rate, duration_s, seed)
        out["tasks"].append(len(events))
        for label, policy, segmentation in runs:
            traces = traces_for(prompts, stories, segmentation)
            progress = progress_factory(f"{rate:g}/s {label}") if progress_factory else None
            result = run_policy(events, policy, workload, config, traces=traces,
                                skill_sets=skill_sets, progress=progress)
            overall = compute_metrics(result.tasks)["overall"]
            series = out["runs"][label]
            for key, value in overall.items():
                series.setdefault(key, []).append(value)
    return out


def format_chat_experiment(doc: Mapping[str, Any]) -> str:
    """One row per (rate, run): utility, mean / p99 response, waiting time, misses."""
    lines = [f"{'rate/s':>6} {'tasks':>5} {'run':<18} {'utility':>8} {'resp_ms':>8} "
             f"{'p99_ms':>8} {'wait_s':>7} {'miss':>6}"]
    for i, rate in enumerate(doc["rates"]):
        for label, series in doc["runs"].items():
            lines.append(
                f"{rate:>6g} {doc['tasks'][i]:>5} {label:<18} {series['utility_mean'][i]:>8.3f} "
                f"{series['response_time_mean_s'][i] * 1e3:>8.0f} "
                f"{series['response_time_p99_s'][i] * 1e3:>8.0f} "
                f"{series['waiting_time_mean_s'][i]:>7.2f} "
                f"{series['deadline_miss_rate'][i] * 100:>5.1f}%")
    return "\n".join(lines)


def plot_chat_experiment(doc: Mapping[str, Any], path) -> None:
    """Fig. 10's two panels against load: mean utility, and mean waiting (planning) delay."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label, series in doc["runs"].items():
        style = "--" if label.startswith("vllm") else "-"
        left.plot(doc["rates"], series["utility_mean"], style, marker="o", label=label)
        right.plot(doc["rates"], series["waiting_time_mean_s"], style, marker="o", label=label)
    left.set(xlabel="story requests per second", ylabel="mean utility",
             title="Time utility (first sentence / paragraph)")
    right.set(xlabel="story requests per second", ylabel="mean waiting time (s)",
              title="Delay beyond reading time", yscale="log")
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
