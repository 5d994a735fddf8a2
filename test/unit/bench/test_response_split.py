"""Splitting a response's loss against the alone bound into the wait for admission and the
service (bench/response_split.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from timelyllm_ros.bench import response_split
from timelyllm_ros.core.tuf import TUF


def _task(task_id, task_type, arrival, admitted, response, tuf=TUF(0.2, 10.0, 2.0)):
    return SimpleNamespace(task_id=task_id, task_type=task_type, arrival_s=arrival,
                           generation_spans=[(admitted, admitted + 1.0)] if admitted else [],
                           response_time_s=response, tuf=tuf)


def test_a_loss_splits_into_the_wait_and_the_service():
    alone = {k: SimpleNamespace(alone_response_time_s=0.15) for k in ("a", "b", "c", "d")}
    tasks = [_task("a", "urgent", 10.0, 10.1, 0.35),  # waits 0.1, served 0.25 (alone 0.15)
             _task("b", "urgent", 5.0, 5.0, 0.15),    # as alone: loses nothing
             _task("c", "urgent", 1.0, None, 0.3),    # never admitted: not split
             _task("d", "urgent", 1.0, 1.0, math.nan)]  # no response
    (a, b) = response_split.split_responses(tasks, alone)
    assert (a.task_id, b.task_id) == ("a", "b")
    assert a.wait_s == pytest.approx(0.1) and a.service_s == pytest.approx(0.25)
    # ERT 0.2 s, slope 10 per s: alone 0.15 s is on time (2.0); after the wait, 0.25 s (1.5);
    # at the response, 0.35 s (0.5).
    assert (a.utility_alone, a.utility_after_wait, a.utility) == pytest.approx((2.0, 1.5, 0.5))
    assert (a.lost_to_wait, a.lost_to_service) == pytest.approx((0.5, 1.0))
    assert b.lost_to_wait == b.lost_to_service == 0.0
    n, wait, service = response_split.by_type([a, b])["urgent"]
    assert n == 2 and (wait, service) == pytest.approx((0.5, 1.0))
    lines = response_split.format_report("p", [a, b], 4, "urgent")
    assert "wait   0.500 (0.1250), service   1.000 (0.2500)" in lines[1]
    assert lines[-2].strip().startswith("a: wait  100.0, service   250.0, alone   150.0")


def test_the_engine_is_busy_over_the_union_of_the_generations_spans():
    def spans(*pairs):
        return SimpleNamespace(generation_spans=list(pairs))

    tasks = [spans((0.0, 1.0), (3.0, 4.0)), spans((0.5, 2.0)), spans(), spans((1.5, 1.8)),
             spans((2.0, 2.5))]  # touching at 2.0: one interval
    intervals = response_split.busy_intervals(tasks)
    assert intervals == [(0.0, 2.5), (3.0, 4.0)]
    assert response_split.busy_during(intervals, 1.0)
    assert not response_split.busy_during(intervals, 2.75)
    assert not response_split.busy_during(intervals, 3.0)  # a step starts with the arrival
    assert not response_split.busy_during(intervals, -1.0)
    assert not response_split.busy_during(intervals, 5.0)
    assert response_split.busy_intervals([spans()]) == []

    # Two urgent tasks: one on an idle engine, one while the first one's generation runs.
    alone = {k: SimpleNamespace(alone_response_time_s=0.15) for k in ("a", "b")}
    a, b = _task("a", "urgent", 1.0, 1.0, 0.15), _task("b", "urgent", 1.5, 2.5, 1.15)
    splits = response_split.split_responses([a, b], alone)
    line = response_split.busy_line([a, b], splits, "urgent")
    assert line == ("  engine busy 2.00 s of the 2.50 s from its first step to its last "
                    "(80.0%); 1 of 2 urgent tasks arrived while it was busy")
    assert response_split.busy_line([spans()], [], None) == "  engine never busy"
    summary = response_split.summary_line(7, "p", splits, 2, [a, b])
    assert summary.endswith("; engine busy 80.0%")


def test_main_splits_a_family_member_and_names_a_bad_task_type(capsys):
    assert response_split.main(["--member", "31", "--policies", "vllm-stream",
                                "--task-type", "drone-urgent"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("family 1 member 31: fleet on llama3-8b-a10")
    assert out[1].startswith("vllm-stream: utility lost against the alone bound")
    assert sum(line.strip().startswith("t000") for line in out) == 5  # its urgent drones
    assert out[-1].startswith("  engine busy ") and out[-1].endswith(
        "drone-urgent tasks arrived while it was busy")
    with pytest.raises(SystemExit):
        response_split.main(["--member", "31", "--task-type", "submarine"])
    assert "--task-type: member 31 has no 'submarine' task" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        response_split.main(["--member", "-1"])


def test_several_members_give_a_line_each():
    assert response_split.parse_members("0-3,31,2") == [0, 1, 2, 3, 31]
    for bad in ("x", "5-2", "1-"):
        with pytest.raises(ValueError):
            response_split.parse_members(bad)
    a = response_split.ResponseSplit("a", "drone-urgent", 0.1, 0.25, 0.15, 2.0, 1.5, 0.5)
    line = response_split.summary_line(7, "p", [a], 4)
    assert line == ("member   7 p:     4 tasks,     1 answered; lost 0.3750 of the mean: wait "
                    "0.1250 (urgent drones 0.1250), service 0.2500")


def test_main_with_members_prints_one_line_per_member_and_policy(capsys):
    assert response_split.main(["--members", "31,4", "--policies", "vllm-stream"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["member  31 vllm-stream",
                                                   "member   4 vllm-stream"]
    assert all("; engine busy " in line for line in out)
    with pytest.raises(SystemExit):
        response_split.main(["--members", "3-1"])
