"""Deep overload drains (issue 20 part 4, docs/overload.md): under every policy the planner works
off its backlog in time proportional to it, every task ends and its client is told, and the
planner comes back to idle; the replay tells a stuck run from a long drain by progress, not by a
fixed time after the last arrival."""

from __future__ import annotations

import pytest

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.overload import deep_overload, drain_row
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.core.engine.sim.engine import SimulatedEngine
from timelyllm_ros.core.policies.registry import DEFAULT_POLICY, policy_names
from timelyllm_ros.core.sched.scheduler import SchedulerConfig

# Issue 20's workload, cut short: the same arrival rate, so the same overload, on the same
# fleet. Twice the arrivals must leave about twice the backlog, and take about twice as long
# to drain.
SHORT_S = 1.5


@pytest.fixture(scope="module")
def overloads():
    return deep_overload(SHORT_S), deep_overload(2 * SHORT_S)


@pytest.mark.parametrize("policy", policy_names())
def test_deep_overload_drains_in_time_proportional_to_its_backlog(policy, overloads):
    rows = [drain_row(run_policy(events, policy, workload, BenchConfig()))
            for workload, events in overloads]
    short, long = rows
    # Overload: the backlog grows with the arrivals (a planner that kept up would leave the
    # same small backlog however long the arrivals went on).
    assert long.backlog > 1.25 * short.backlog > 0
    # Drained in proportion: the time per segment of backlog does not grow with the backlog
    # (a livelock or a superlinear cost would; the fixed part, the last plan's own generation,
    # weighs less in the longer run).
    assert long.plan_drain_s / long.backlog <= 1.5 * short.plan_drain_s / short.backlog
    for (workload, _), row in zip(overloads, rows):
        assert sum(row.states.values()) == row.tasks and row.told == row.tasks
        assert row.idle, row.end_state
        # After the planner's last step only the robots are left: each ends by then plus the
        # work it was given (queued robots run one task at a time), plus the way to the robot
        # and the report's way back.
        assert row.plan_drain_s <= row.all_terminal_s <= (
            row.plan_drain_s + row.busiest_robot_s + 2 * workload.network_latency_s + 1e-9)


def test_the_planner_as_configured_fails_no_task_of_a_busy_robot():
    # The real planner's report timeout (SchedulerConfig's, not the bench's hour) and robots that
    # run segments in the order they arrive, as the ROS executor does: robots with tens of
    # queued tasks report late but do report, and no task may be declared lost for it.
    workload, events = deep_overload(4 * SHORT_S)
    config = BenchConfig(robots="dispatch",
                         report_timeout_min_s=SchedulerConfig().report_timeout_min_s)
    row = drain_row(run_policy(events, DEFAULT_POLICY, workload, config))
    assert row.busiest_robot_s > 20 * SchedulerConfig().report_timeout_min_s  # deep queues
    assert row.states == {"done": row.tasks} and row.idle


class _StalledEngine(SimulatedEngine):
    """A livelock once the tasks come (the planner's warm-up runs normally): every step costs a
    decode's time and computes nothing."""

    def step(self):
        if not any(rid.startswith("t") for rid in self._by_id):
            return super().step()
        self._clock += self.profile.step_s(0, 1, 0)
        return []


class _ForgetfulEngine(SimulatedEngine):
    """Requests run to their end in the engine, but the tasks' outputs never reach the
    scheduler: once they are gone each step takes no time, so the clock stands still."""

    def step(self):
        outputs = super().step()
        return [o for o in outputs if o.request_id.startswith("__warmup__")]


@pytest.mark.parametrize("engine,why", [
    (_StalledEngine, r"nothing progressed for \d+ s"),
    (_ForgetfulEngine, r"\d+ engine steps in a row took no time")])
def test_a_run_that_stops_progressing_is_reported_stuck_with_what_it_holds(engine, why):
    workload, events = deep_overload(0.5)
    config = BenchConfig(max_stall_s=5.0)
    with pytest.raises(RuntimeError, match=f"replay stuck: {why} "
                                           r"\(queued \d+, running [1-9]"):
        run_policy(events, "vllm-stream", workload, config, engine=engine(config.load_profile()))


def test_a_drain_longer_than_the_stall_limit_is_not_stuck(overloads):
    # The robots' queues outlast the planner's work by far more than the stall limit; reports
    # keep arriving, so the run goes on until every task is done.
    workload, events = overloads[0]
    stall_s = 20.0
    row = drain_row(run_policy(events, "vllm-stream", workload, BenchConfig(max_stall_s=stall_s)))
    assert row.all_terminal_s > 3 * stall_s and row.states == {"done": row.tasks}
