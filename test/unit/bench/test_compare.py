"""`python -m timelyllm_ros.bench.compare`: every policy on every workload, cached per run."""

from __future__ import annotations

import json
import math

import pytest

from timelyllm_ros.bench import compare


def test_workload_names_may_carry_a_kv_size():
    assert compare.split_workload("seed002-rtbe@kv320") == ("seed002-rtbe", 320)
    assert compare.split_workload("WID1") == ("WID1", None)
    assert compare.headline("seed002-rtbe@kv320") == compare.HEADLINE["seed002-rtbe"]
    for bad in ("WID1@kv", "WID1@kv0", "WID1@kvx"):
        with pytest.raises(ValueError, match="block count"):
            compare.split_workload(bad)


def test_a_kv_size_changes_the_run_and_results_are_cached(tmp_path, capsys):
    argv = ["--workloads", "WID3@kv200,WID3", "--policies", "fcfs-seg", "--out", str(tmp_path),
            "--jobs", "1"]
    assert compare.main(argv) == 0
    table = capsys.readouterr().out
    assert "WID3@kv200 mean utility" in table and "`fcfs-seg`" in table
    tight = json.loads((tmp_path / "WID3@kv200__fcfs-seg.json").read_text())
    roomy = json.loads((tmp_path / "WID3__fcfs-seg.json").read_text())
    assert tight["done"] == roomy["done"] == roomy["tasks"]
    # 200 blocks: the shared 2884-token prompt (181 blocks) leaves room for few plans at once.
    assert tight["waiting_time_mean_s"] > roomy["waiting_time_mean_s"]
    # A second run reads the cache instead of replaying.
    (tmp_path / "WID3__fcfs-seg.json").write_text(json.dumps({**roomy, "utility_mean": 42.0}))
    assert compare.main(argv) == 0
    assert "42.000" in capsys.readouterr().out


def test_unknown_workloads_and_policies_are_usage_errors(tmp_path, capsys):
    assert compare.main(["--workloads", "WID9", "--out", str(tmp_path)]) == 2
    assert "unknown workload WID9" in capsys.readouterr().err
    assert compare.main(["--workloads", "WID1@kvx", "--out", str(tmp_path)]) == 2
    assert "block count" in capsys.readouterr().err
    assert compare.main(["--policies", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err


def test_markdown_table_marks_stuck_and_skipped_runs():
    results = {"seed004-api": {"vllm": {"skipped": "x"}, "lamps": {"latency_mean_s": 3.0},
                               "bros": {"error": "livelock"}}}
    table = compare.markdown_table(results, ["vllm", "lamps", "bros"])
    assert "| `vllm` | n/a |" in table and "| `bros` | stuck |" in table
    assert "| `lamps` | 3.00 |" in table
    assert math.isnan(compare._num({}, "latency_mean_s"))
