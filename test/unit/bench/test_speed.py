"""The bench-speed benchmark (bench/speed.py) runs and reports figures; it times nothing."""

from __future__ import annotations

import pytest

from timelyllm_ros.bench import speed


def test_measure_reports_positive_figures_per_config_and_policy():
    rows = speed.measure(policies=("vllm-stream", "timelyllm"), duration_s=2.0)
    assert [(r.config, r.policy) for r in rows] == [
        ("modern", "vllm-stream"), ("modern", "timelyllm"),
        ("paper", "vllm-stream"), ("paper", "timelyllm")]
    for r in rows:
        assert r.tasks > 0 and r.steps > 0 and r.clock_s > 0 and r.wall_s > 0 and r.cpu_s > 0
        assert r.tasks_per_wall_s > 0
    # Same events for every run.
    assert len({r.tasks for r in rows}) == 1


def test_configurations_are_the_modern_and_the_paper_one():
    modern, paper = speed.bench_config("modern"), speed.bench_config("paper")
    assert modern.prompt_tokens is None and modern.baseline_prefix_cache
    assert paper.prompt_tokens == 2884 and not paper.baseline_prefix_cache
    with pytest.raises(ValueError, match="config"):
        speed.bench_config("fast")


def test_main_prints_a_row_per_run(capsys):
    assert speed.main(["--duration-s", "2", "--policies", "vllm-stream",
                       "--config", "modern"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "workload mixed-30tps, first 2 s"
    assert out[1].split() == ["config", "policy", "tasks", "clock_s", "steps", "wall_s",
                              "tasks/wall_s", "cpu_s"]
    assert out[2].split()[:2] == ["modern", "vllm-stream"]
    with pytest.raises(SystemExit):
        speed.main(["--config", "fastest"])


def test_wall_ratios_compare_each_policy_with_the_first_of_its_configuration():
    rows = [speed.SpeedRow("modern", "vllm-stream", 10, 1.0, 5, 2.0, 1.0),
            speed.SpeedRow("modern", "timelyllm-wc", 10, 1.0, 5, 3.0, 2.0),
            speed.SpeedRow("paper", "vllm-stream", 10, 1.0, 5, 4.0, 4.0),
            speed.SpeedRow("paper", "timelyllm-wc", 10, 1.0, 5, 2.0, 1.0)]
    assert speed.wall_ratios(rows) == [("modern", "timelyllm-wc", "vllm-stream", 1.5, 2.0),
                                       ("paper", "timelyllm-wc", "vllm-stream", 0.5, 0.25)]
    assert speed.wall_ratios(rows[:1]) == []


def test_main_takes_the_default_alias_and_prints_the_ratio(capsys):
    from timelyllm_ros.core.policies.registry import DEFAULT_POLICY
    assert speed.main(["--workload", "mixed-overload", "--duration-s", "2", "--policies",
                       "vllm-stream,default", "--config", "modern"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "workload mixed-overload, first 2 s"
    assert [line.split()[1] for line in out[2:4]] == ["vllm-stream", DEFAULT_POLICY]
    assert out[4].startswith(f"modern   {DEFAULT_POLICY} / vllm-stream: wall ")
    assert ", cpu " in out[4]
    with pytest.raises(SystemExit):
        speed.main(["--policies", "vllm-stream,nonesuch"])


def test_repeats_interleave_the_policies_and_summarise_median_and_fastest(capsys):
    rows = speed.measure("mixed-overload", ("vllm-stream", "timelyllm"), ("modern",), 1.0,
                         repeats=3)
    # Every other round reversed, so drift in the machine's speed weighs on both alike.
    assert [(r.round, r.policy) for r in rows] == [
        (0, "vllm-stream"), (0, "timelyllm"), (1, "timelyllm"), (1, "vllm-stream"),
        (2, "vllm-stream"), (2, "timelyllm")]
    assert len({(r.tasks, r.steps) for r in rows if r.policy == "timelyllm"}) == 1
    with pytest.raises(ValueError, match="repeats"):
        speed.measure(repeats=0)
    fake = [speed.SpeedRow("modern", "a", 1, 1.0, 1, w, c, k)
            for k, (w, c) in enumerate([(3.0, 2.0), (1.0, 4.0), (2.0, 3.0)])] + \
           [speed.SpeedRow("modern", "b", 1, 1.0, 1, 6.0, c, k)
            for k, c in enumerate([5.0, 3.0, 9.0])]
    a, b = speed.summarise_repeats(fake)
    assert (a.policy, a.rounds, a.median_cpu_s, a.fastest_cpu_s, a.median_wall_s,
            a.fastest_wall_s) == ("a", 3, 3.0, 2.0, 2.0, 1.0)
    assert (b.median_cpu_s, b.fastest_cpu_s) == (5.0, 3.0)
    assert speed.repeat_ratios([a, b]) == [("modern", "b", "a", 5.0 / 3.0, 1.5)]
    assert speed.main(["--workload", "mixed-overload", "--duration-s", "1", "--policies",
                       "vllm-stream,timelyllm", "--config", "modern", "--repeats", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in out[2:6]] == ["vllm-stream", "timelyllm", "timelyllm",
                                                      "vllm-stream"]
    assert out[6].startswith("round 1: modern   timelyllm / vllm-stream: wall ")
    assert out[7].startswith("round 2: modern   timelyllm / vllm-stream: wall ")  # (ran second)
    assert out[8].startswith("modern   vllm-stream      2 rounds: cpu_s median ")
    assert out[-1].startswith("modern   timelyllm / vllm-stream over 2 rounds: cpu median ")
    with pytest.raises(SystemExit):
        speed.main(["--repeats", "0"])
