"""The fleet simulator (many robots, one process) and the soak that drives it, at test size.

`make soak` runs the real thing (200 robots, 10 minutes); here a handful of robots for seconds
checks the same machinery end to end: every task through the PlanTask action and the robots'
ExecuteSegment actions, every task terminal with a reason, the planner idle at the end.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("rclpy")

from fleet_helpers import use_domain  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(420)]


def test_fleet_simulator_refuses_bad_parameters_naming_them(monkeypatch):
    use_domain(monkeypatch, 170)
    import rclpy

    from timelyllm_ros.ros.fleet_sim_node import FleetSimNode

    cases = [
        (["-p", "robots:=['drone_1:boat']"], "parameter robots: 'drone_1:boat'"),
        (["-p", "robots:=['drone_1:drone', 'drone_1:arm']"], "appears twice"),
        (["-p", "robots:=['a:drone']", "-p", "drones:=2"], "one or the other"),
        (["-p", "drones:=1", "-p", "time_scale:=0.0"], "parameter time_scale"),
        (["-p", "drones:=1", "-p", "drone_backend:=hovercraft"], "parameter drone_backend"),
        ([], "parameter robots: empty"),
    ]
    for args, message in cases:
        rclpy.init(args=["--ros-args", *args])
        try:
            with pytest.raises(ValueError, match=message):
                FleetSimNode()
        finally:
            rclpy.try_shutdown()


def test_small_soak_ends_every_task_and_leaves_the_planner_idle(tmp_path, monkeypatch):
    use_domain(monkeypatch, 171)
    from timelyllm_ros.cli.soak import main

    out = tmp_path / "soak"
    rc = main(["--robots", "8", "--arm-share", "0.25", "--duration-s", "25", "--think-s", "1",
               "--time-scale", "0.05", "--warmup-s", "5", "--out", str(out),
               "--log-dir", str(tmp_path / "logs")])
    payload = json.loads((out / "soak.json").read_text())
    s = payload["summary"]
    verdicts = s["verdicts"]
    assert verdicts["every task terminal with a reason"], s
    assert verdicts["queue, engine and KV idle at the end"], s["idle_at_end"]
    # 8 robots looping for 25 s with ~1 s of thinking: many tasks, on drones and arms.
    assert s["tasks_submitted"] >= 16 and s["tasks_terminal"] == s["tasks_submitted"], s
    assert s["results"].get("done", 0) >= s["tasks_submitted"] // 2, s["results"]
    by_kind = s["results_by_kind"]
    assert set(by_kind) == {"drone", "arm"} and all(c.get("done", 0) > 0 for c in by_kind.values())
    # Samples every second, with the planner's metrics and RSS.
    samples = payload["samples"]
    assert len(samples) >= 20 and all(x["planner_rss_mb"] > 50 for x in samples)
    assert any(x["active_tasks"] > 0 for x in samples)
    assert s["scheduler_ms_mean"] > 0
    assert (out / "soak.png").stat().st_size > 10_000 and "| target | result |" in (
        out / "soak.md").read_text()
    # The exit status is the verdicts' (RSS growth over a 20 s window is not meaningful here).
    assert rc == (0 if all(verdicts.values()) else 1)
    # The fleet simulator hosted all 8 robots in one process.
    assert "fleet of 8 robots ready" in (tmp_path / "logs" / "fleet_sim.log").read_text()

