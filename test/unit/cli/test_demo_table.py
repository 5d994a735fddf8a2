"""The demo's table: cached and recomputed prompt tokens per resume beside each other."""

from __future__ import annotations

from timelyllm_ros.experiments.demo import format_table


def test_table_shows_cached_and_recomputed_tokens_per_resume():
    rows = [
        {"task_id": "survey-1", "robot": "drone_1", "urgency": "normal", "state": "done",
         "response_time_s": 0.4, "utility": 1.0, "waiting_time_s": 0.9, "segments": 4,
         "resumes": 3, "cached_total": 1290.0, "recomputed_per_resume": 1.0},
        {"task_id": "alone-2", "robot": "drone_2", "urgency": "urgent", "state": "done",
         "response_time_s": 0.2, "utility": 2.0, "waiting_time_s": float("nan"),
         "segments": 2, "resumes": 0, "cached_total": 0, "recomputed_per_resume": 0.0},
    ]
    header, _, first, second = format_table(rows).splitlines()
    assert header.split()[-2:] == ["cached/resume", "recomputed/resume"]
    assert first.split()[-2:] == ["430", "1.0"]
    assert second.split()[-2:] == ["-", "-"]  # no resume, nothing to average
    assert " - " in second  # a NaN waiting time prints as "-"
