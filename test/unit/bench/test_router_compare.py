"""The bookkeeping of `timelyllm router-compare` (bench/router_workload.py, router_compare.py)
without servers: run records, the per-run counter attribution, the table."""

from __future__ import annotations

import pytest

from timelyllm_ros.bench import router_workload
from timelyllm_ros.bench.router_compare import PLACEMENTS, PlacementResult, markdown_table
from timelyllm_ros.bench.router_workload import MeteredRuns, RunRecord, lrtrace_tasks
from timelyllm_ros.core.engine.base import EngineOutput, EngineRequest


def test_a_run_record_knows_its_task_resume_and_whole_blocks():
    run = RunRecord("robot-3-task#4", prompt_len=449, added_s=10.0, first_token_s=10.25)
    assert (run.task_id, run.resume, run.ttft_s) == ("robot-3-task", 4, 0.25)
    # vLLM computes at least the last prompt token: 448 tokens could hit, 14 blocks of 32.
    assert run.full_blocks(32) == 448 and run.full_blocks(128) == 384


class _Engine:
    def __init__(self):
        self.out = []

    def add_request(self, request):
        pass

    def abort_request(self, request_id):
        pass

    def step(self):
        out, self.out = self.out, []
        return out


def test_counters_moving_between_two_runs_are_the_first_runs(monkeypatch):
    counters = {"a": (0.0, 0.0), "b": (100.0, 50.0)}
    monkeypatch.setattr(router_workload, "prefix_counters", lambda url: counters[url])
    engine = _Engine()
    meter = MeteredRuns(engine, ["a", "b"], per_run_counters=True)
    engine.add_request(EngineRequest("t#0", list(range(400)), 8))
    engine.out = [EngineOutput("t#0", [5], "x")]
    engine.step()
    counters["b"] = (500.0, 434.0)      # worker b prefilled it: 384 of 400 tokens cached
    engine.abort_request("t#0")
    engine.add_request(EngineRequest("t#1", list(range(420)), 8))
    counters["a"] = (420.0, 0.0)        # the resume went to a and found nothing
    first, second = meter.finish()
    assert (first.worker, first.cached, first.finish_reason) == (1, 384, "abort")
    assert first.first_token_s is not None and first.ended_s is not None
    assert (second.worker, second.cached) == (0, 0) and not meter.generating("t")


def test_tasks_take_turns_over_skill_sets():
    specs = lrtrace_tasks("x", 4, 0.0, ("chat", "drone"))
    assert [s.skill_set for s in specs] == ["chat", "drone", "chat", "drone"]
    assert len({s.instruction for s in specs}) == 4 and specs[3].task_id == "x-3"


def test_the_table_has_a_column_per_placement():
    result = PlacementResult(resumes=4, resumes_whole_plan_cached=3, cached_tokens=[300, 100],
                             whole_blocks=[320, 128], ttft_s=[0.1, 0.2], response_s=[1.0],
                             runs_per_worker=[5, 7], tasks_done=2, tasks=2,
                             death={"tasks_failed": 1})
    summary = {p: result.summary() for p in PLACEMENTS}
    assert summary["replicas"]["cached_share"] == pytest.approx(400 / 448, abs=1e-4)
    table = markdown_table(summary)
    assert "| resumes with the whole plan so far cached | 3 / 4 | 3 / 4 |" in table
    assert "5 / 7" in table and table.count("\n") == 11
