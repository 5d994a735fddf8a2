"""Judging a soak: RSS growth after warm-up and the verdicts (experiments/soak_report.py)."""

from __future__ import annotations

import math
from collections import Counter

from timelyllm_ros.experiments.soak import Sample, SoakConfig, SoakResult
from timelyllm_ros.experiments.soak_report import RSS_GROWTH_LIMIT, rss_growth, summary


def _samples(rss, t_end=600):
    return [Sample(t=float(t), planner_rss_mb=rss(t), fleet_rss_mb=100.0, submitted=t,
                   terminal=t, queued=0, running=0, active_tasks=3, kv_used=10,
                   fetch_overhead_ms=0.2) for t in range(t_end + 1)]


def test_flat_rss_after_a_warmup_ramp_is_no_growth():
    # Warm-up allocates (300 -> 400 MB in 100 s), then flat with noise.
    samples = _samples(lambda t: 300 + t if t < 100 else 400 + (t % 7) * 0.3)
    g = rss_growth(samples, warmup_s=120, load_s=600)
    assert abs(g["growth"]) < 0.005 and abs(g["slope_mb_per_min"]) < 0.1


def test_a_leak_is_measured_as_growth():
    samples = _samples(lambda t: 400 + 0.1 * t)   # 6 MB a minute
    g = rss_growth(samples, warmup_s=120, load_s=600)
    assert 0.09 < g["growth"] < 0.12 and 5.5 < g["slope_mb_per_min"] < 6.5


def test_too_few_samples_is_not_a_pass():
    g = rss_growth(_samples(lambda t: 400, t_end=2), warmup_s=0, load_s=2)
    assert math.isnan(g["growth"])


def _result(lost=(), no_reason=(), idle=True, leak=0.0):
    result = SoakResult(SoakConfig(robots=10, duration_s=600))
    result.samples = _samples(lambda t: 400 + leak * t)
    result.load_s = 600
    result.submitted = 50
    result.results = Counter({"done": 50 - len(lost)})
    result.lost = list(lost)
    result.no_reason = list(no_reason)
    result.idle_at_end = {"idle": idle}
    return result


def test_verdicts_pass_only_when_every_target_holds():
    ok = summary(_result())["verdicts"]
    assert all(ok.values()), ok
    lost = summary(_result(lost=["soak-000001-drone_1"]))["verdicts"]
    assert not lost["every task terminal with a reason"]
    busy = summary(_result(idle=False))["verdicts"]
    assert not busy["queue, engine and KV idle at the end"]
    leaky = summary(_result(leak=0.2))["verdicts"]
    assert not leaky[f"planner RSS growth < {RSS_GROWTH_LIMIT:.0%} after warm-up"]
