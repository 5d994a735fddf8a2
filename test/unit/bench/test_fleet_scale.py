"""Fleet scale (bench/fleet_scale.py, `timelyllm fleet`, `timelyllm bench --replicas`): the
workload grows with the robots, the search finds the largest passing fleet, and a replay on
several simulated replicas runs the same scheduler to the end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.engines import build_engine
from timelyllm_ros.bench.fleet_scale import (Probe, fleet_workload, largest_fleet,
                                             per_robot_task_rate, probe, scaling_rows, Search)
from timelyllm_ros.bench.workloads import load_bench_workload
from timelyllm_ros.core.engine.sim.fleet import SimulatedFleet
from timelyllm_ros.lrtrace.workload import compose


def _fake(threshold: int, replicas: int = 1):
    def run(robots: int) -> Probe:
        late = 0 if robots <= threshold else 10
        return Probe(replicas, robots, 100, 100, late, 0.1, 0.0, 60.0, 60.0)
    return run


@settings(max_examples=60, deadline=None)
@given(threshold=st.integers(8, 20_000), guess=st.integers(8, 20_000),
       tolerance=st.sampled_from([0.02, 0.1, 0.25]))
def test_the_search_brackets_the_threshold_within_its_tolerance(threshold, guess, tolerance):
    probes = largest_fleet(_fake(threshold), guess, minimum=8, tolerance=tolerance,
                           max_probes=60)
    search = Search(1, probes)
    best, fail = search.best, search.first_failure
    assert best is not None and best.robots <= threshold
    assert fail is not None and fail.robots > threshold
    assert fail.robots <= best.robots * (1 + tolerance) or fail.robots - best.robots <= 1


def test_the_search_reports_nothing_when_the_smallest_fleet_fails():
    probes = largest_fleet(_fake(3), 100, minimum=8, max_probes=20)
    assert Search(1, probes).best is None and probes[-1].robots == 8


def test_scaling_rows_compare_robots_per_replica_with_one_replica():
    searches = {1: Search(1, largest_fleet(_fake(100), 64, minimum=8, tolerance=0.01,
                                           max_probes=30)),
                8: Search(8, largest_fleet(_fake(600, 8), 800, minimum=8, tolerance=0.01,
                                           max_probes=30, factor=1.05))}
    rows = {r["replicas"]: r for r in scaling_rows(searches)}
    assert rows[1]["robots"] == 100 and rows[1]["efficiency"] == 1.0
    assert 590 <= rows[8]["robots"] <= 600
    assert rows[8]["efficiency"] == pytest.approx(rows[8]["robots"] / 800)


def test_the_workload_keeps_each_robot_s_task_rate():
    base = load_bench_workload("WID1", None, None)[0]
    big = fleet_workload(base, 1000, 30.0)
    assert big.agents == 1000 and big.duration_s == 30.0
    assert per_robot_task_rate(big) == pytest.approx(per_robot_task_rate(base))
    with pytest.raises(ValueError, match="robots"):
        fleet_workload(base, 3, 30.0)


def test_bench_config_replicas_build_a_fleet_and_are_checked():
    config = BenchConfig(replicas=3)
    assert isinstance(build_engine(config), SimulatedFleet)
    assert config.describe()["replicas"] == 3
    assert "replicas" not in BenchConfig().describe()
    with pytest.raises(ValueError, match="replicas"):
        BenchConfig(replicas=0)
    with pytest.raises(ValueError, match="replicas"):
        BenchConfig(engine="vllm", replicas=2)


def test_a_replay_on_a_fleet_serves_every_task_and_more_replicas_are_not_slower():
    """Same events on 1 and 4 replicas of 4 slots each (one replica is overloaded: most urgent
    tasks late): every task is replayed on both, and four replicas make far fewer late."""
    base = load_bench_workload("WID1", None, None)[0]
    config = BenchConfig(max_num_seqs=4)
    one = probe(base, 200, 1, "vllm-stream", config, 20.0)
    four = probe(base, 200, 4, "vllm-stream", config, 20.0)
    assert one.tasks == four.tasks == len([t for e in compose(fleet_workload(base, 200, 20.0))
                                           for t in e.tasks])
    assert one.urgent_late_share > 0.5
    assert four.urgent_late * 2 < one.urgent_late


def test_planner_cost_holds_the_active_population_and_times_every_pass():
    from timelyllm_ros.bench.planner_cost import measure
    from timelyllm_ros.core.engine.cost_model import EngineProfile
    point = measure(EngineProfile(), active=60, replicas=2, ticks=20, warmup_s=2.0)
    assert point.queued + point.running + point.suspended == 60
    assert point.suspended > 0 and point.running > 0  # a mix, not a burst still queued
    assert point.step_ms > 0 and point.pass_ms > 0 and point.max_replicas > 0


def test_fleet_command_refuses_a_workload_whose_robots_cannot_be_scaled(capsys):
    from timelyllm_ros.cli import fleet
    assert fleet.main(["--workload", "mixed-fleet", "--replicas", "1"]) == 2
    assert "one-stream" in capsys.readouterr().err


def test_bench_command_replays_on_several_replicas(capsys):
    from timelyllm_ros.cli import bench
    assert bench.main(["--workload", "WID1", "--policies", "vllm-stream", "--duration-s", "20",
                       "--replicas", "2", "--no-progress"]) == 0
    assert "vllm-stream" in capsys.readouterr().out


def test_single_task_events_keep_each_robot_s_rate():
    from timelyllm_ros.bench.fleet_scale import single_task_events
    base = load_bench_workload("WID1", None, None)[0]
    one = single_task_events(base, 1)
    assert one.max_tpe == 1
    assert per_robot_task_rate(one) == pytest.approx(per_robot_task_rate(base))
    events = compose(fleet_workload(one, 100, 30.0))
    assert events and all(len(e.tasks) == 1 for e in events)
