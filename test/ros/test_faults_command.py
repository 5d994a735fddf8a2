"""`timelyllm faults` (experiments/faults.py) runs its rows and reports what they found: two
cheap rows through the runner, each in its own child process and ROS domain (176, 178), with
real planner, executor and fleet-simulator processes and real faults (SIGTERM, an injected
engine exception). Asserted: the fields a row reports say what happened (every task terminal
with its reason, every client told, every robot stopped, back to idle), and the table and the
JSON are written. Timings are printed (`-s`), not asserted tightly: the machine is shared.

The other rows take longer (a DDS lease, a real-time drain, a 40-robot fleet) and are measured
by `timelyllm faults` (docs/faults.md)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("rclpy")

from timelyllm_ros.experiments.faults import parse_rows, run_faults  # noqa: E402
from timelyllm_ros.experiments.faults_report import markdown  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(400)]
DOMAIN_BASE = 176      # row i on 176 + i: planner-sigterm 176, engine-exception 178
ROBOTS = {"arm_1", "arm_2", "arm_3", "arm_4"}


def _check_everyone_told(row: dict, state: str, reason_part: str) -> None:
    assert "error" not in row, row.get("error")
    assert row["n_tasks"] == 4 and row["all_terminal"], row["tasks"]
    assert row["clients_told"] == 4, row["tasks"]
    for task_id, task in row["tasks"].items():
        assert task["state"] == state and reason_part in task["reason"], (task_id, task)
        assert task["told_after_s"] is not None and task["status_after_s"] is not None
    assert row["terminal_after_s"] == max(t["terminal_after_s"] for t in row["tasks"].values())
    # Every robot was inside a segment at the fault and stopped it (its report says so).
    assert set(row["robots"]) == ROBOTS
    for robot, stop in row["robots"].items():
        assert stop["stopped_after_s"] is not None, (robot, stop)
        assert stop["how"].startswith("cancelled"), (robot, stop)


def test_planner_sigterm_and_engine_exception_rows(tmp_path, capsys):
    rows = parse_rows("engine-exception,planner-sigterm")
    assert rows == ["planner-sigterm", "engine-exception"]   # the table's order
    lines = []
    results = run_faults(rows, out=tmp_path / "out", log_dir=tmp_path / "logs",
                         domain_base=DOMAIN_BASE, say=lines.append)
    with capsys.disabled():
        print("\n" + "\n".join(line for line in lines if "what happened" in line))
    term, engine = results
    assert [term["domain"], engine["domain"]] == [DOMAIN_BASE, DOMAIN_BASE + 2]

    # SIGTERM: every client told "planner shutting down", the planner gone with status 0,
    # the robots idle with their threads as before.
    _check_everyone_told(term, "cancelled", "planner shutting down")
    assert term["planner_exit"]["code"] == 0
    assert term["idle"]["idle"], term["idle"]
    assert term["idle"]["planner"] == {"exited": 0}
    assert set(term["idle"]["threads"]) == {"planner", "arm_1/executor", "arm_2/executor", "fleet_sim"}
    assert term["idle"]["threads"]["planner"]["after"] is None   # gone

    # Engine exception with restart_engine=1: every task failed with the cause, the planner
    # came back to active by itself, idle (queue, KV, robot goals, the same ExecuteSegment
    # action clients: each restart once added one per robot, threads) and serving.
    _check_everyone_told(engine, "failed", "engine step failed: InjectedFault")
    assert engine["recovered"]["left_active"] and engine["recovered"]["active_again"]
    checks = engine["idle"]["checks"]
    for name in ("planner_queue_kv", "planner_goals", "planner_action_clients", "arm_1_idle",
                 "arm_2_idle", "fleet_idle", "planner_threads", "arm_1/executor_threads",
                 "fleet_sim_threads"):
        assert checks[name], (name, engine["idle"])
    assert engine["idle"]["idle"], engine["idle"]
    planner = engine["idle"]["planner"]
    assert planner["kv_free_blocks"] == planner["kv_total_blocks"] > 0
    assert planner["lifecycle_state"] == "active"
    assert engine["fresh_task"]["state"] == "done", engine["fresh_task"]

    # What was written: the JSON holds every figure, the table one line per row.
    written = json.loads((tmp_path / "out" / "faults.json").read_text())
    assert [r["row"] for r in written["rows"]] == rows
    assert written["rows"][0]["tasks"] == term["tasks"]
    table = (tmp_path / "out" / "faults_table.md").read_text()
    assert table.strip() == markdown(results)
    assert len(table.strip().splitlines()) == 2 + len(rows)
    assert "4/4, last" in table


def test_only_and_out_update_some_rows_of_a_table(tmp_path):
    """`--only` names rows (an unknown one is refused, naming the rows); `--out` into a
    directory with an earlier faults.json replaces the rows run now and keeps the others."""
    from timelyllm_ros.experiments.faults import ROWS
    from timelyllm_ros.experiments.faults_report import write

    with pytest.raises(ValueError, match="unknown row.*planner-sigkil.*rows: planner-sigterm"):
        parse_rows("planner-sigkil")
    old = [{"row": r, "title": ROWS[r], "error": f"old {r}"} for r in ("deep-overload", "planner-sigterm")]
    write(old, tmp_path, tmp_path, order=list(ROWS))
    write([{"row": "planner-sigterm", "title": "planner SIGTERM", "error": "new"}], tmp_path,
          tmp_path, order=list(ROWS))
    rows = json.loads((tmp_path / "faults.json").read_text())["rows"]
    assert [(r["row"], r["error"]) for r in rows] == [("planner-sigterm", "new"),
                                                      ("deep-overload", "old deep-overload")]
    assert "ERROR: new" in (tmp_path / "faults_table.md").read_text()
