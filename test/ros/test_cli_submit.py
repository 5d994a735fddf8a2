"""`timelyllm submit` as a user runs it: a real subprocess against a real planner on the simulated
engine and real executors, stopped with real signals. Ctrl-C / SIGTERM cancels the goal once,
the final result is printed with its state and reason, and the exit status tells done (0),
failed/rejected (1), cancelled (3) and no result (4) apart; a second signal exits at once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("rclpy")

from fleet_helpers import executor_spec, fleet, planner_spec, use_domain, wait_until  # noqa: E402

from timelyllm_ros.cli import submit as submit_cli  # noqa: E402
from timelyllm_ros.lrtrace.traces import load_traces  # noqa: E402
from timelyllm_ros.ros_env import REPO_ROOT  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(300)]

DOMAIN = 206
DRONE_PLAN = load_traces()[1].instruction   # several segments


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    use_domain(mp, DOMAIN)
    logs = tmp_path_factory.mktemp("submit-logs")
    # drone_stuck takes segments and never finishes them: its tasks end only when cancelled
    # (the report deadline is pushed past the test).
    specs = [planner_spec(robots=["drone_1:drone", "drone_stuck:drone"],
                          report_timeout_min_s=600.0),
             executor_spec("drone_1"),
             executor_spec("drone_stuck", never_report=True)]
    try:
        with fleet(logs, specs, robots=["drone_1", "drone_stuck"],
                   node_name="submit_test_client") as (group, client):
            yield group, client
    finally:
        mp.undo()


class Submit:
    """`timelyllm submit ARGS` in a process of its own; its output collected as it comes."""

    def __init__(self, *args: str, ignore_sigint: bool = False):
        def preexec():
            # What a non-interactive shell does to a background job (`timelyllm submit ... &`).
            if ignore_sigint:
                signal.signal(signal.SIGINT, signal.SIG_IGN)

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "timelyllm_ros.cli", "submit", *args], cwd=REPO_ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
        self.out: list[str] = []
        self.err: list[str] = []
        self._pumps = [threading.Thread(target=self._pump, args=(s, b), daemon=True)
                       for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for pump in self._pumps:
            pump.start()

    @staticmethod
    def _pump(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def saw(self, text: str, timeout_s: float = 60.0, stream: str = "out") -> bool:
        lines = self.out if stream == "out" else self.err
        return wait_until(lambda: any(text in line for line in lines), timeout_s)

    def finish(self, timeout_s: float = 60.0) -> int:
        try:
            code = self.proc.wait(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        for pump in self._pumps:
            pump.join(timeout=5)
        return code

    def report(self) -> str:
        return "stdout:\n" + "\n".join(self.out) + "\nstderr:\n" + "\n".join(self.err[-30:])


def test_done_task_exits_0_with_its_segments_and_result(planner):
    run = Submit("--robot", "drone_1", "--id", "cli-done", "--urgency", "urgent", DRONE_PLAN)
    assert run.finish() == submit_cli.EXIT_DONE, run.report()
    assert run.out[0].startswith("cli-done: segment 0: "), run.report()
    assert re.match(r"cli-done: done( \(.*\))?; response \d", run.out[-1]), run.report()


def test_rejected_goal_exits_1_with_the_planners_reason(planner):
    run = Submit("--robot", "rover_9", "--id", "cli-rejected", "drive")
    assert run.finish() == submit_cli.EXIT_FAILED, run.report()
    assert run.out[-1].startswith("cli-rejected: rejected (robot_id:"), run.report()


@pytest.mark.parametrize("sig, ignore_sigint", [
    pytest.param(signal.SIGINT, False, id="sigint"),
    # SIGINT ignored from the start, as in a background job of a non-interactive shell.
    pytest.param(signal.SIGINT, True, id="sigint-ignored-at-start"),
    pytest.param(signal.SIGTERM, False, id="sigterm"),
])
def test_signal_cancels_the_task_and_prints_the_cancelled_result(planner, sig, ignore_sigint):
    _, client = planner
    task_id = f"cli-{sig.name.lower()}-{'ign' if ignore_sigint else 'dfl'}"
    run = Submit("--robot", "drone_stuck", "--id", task_id, DRONE_PLAN, ignore_sigint=ignore_sigint)
    try:
        assert run.saw(f"{task_id}: segment 0:"), run.report()
        started = time.monotonic()
        run.proc.send_signal(sig)
        code = run.finish(30)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    assert code == submit_cli.EXIT_CANCELLED, run.report()
    assert run.out[-1].startswith(f"{task_id}: cancelled (cancelled by the client); "), run.report()
    assert any(f"{sig.name}: cancelling" in line for line in run.err), run.report()
    # It returns with the result, not after a timeout of its own.
    assert time.monotonic() - started < 10, run.report()
    # The planner did cancel it (not merely the client giving up).
    final = client.wait_terminal([task_id], 10)[task_id]
    assert final is not None and final.state == "cancelled", final


def test_task_cancelled_by_someone_else_exits_3(planner):
    _, client = planner
    run = Submit("--robot", "drone_stuck", "--id", "cli-other", DRONE_PLAN)
    assert run.saw("cli-other: segment 0:"), run.report()
    response = client.cancel_task("cli-other", reason="operator said stop")
    assert response.success, response.reason
    assert run.finish(30) == submit_cli.EXIT_CANCELLED, run.report()
    assert run.out[-1].startswith("cli-other: cancelled (operator said stop); "), run.report()


def test_unanswered_cancel_exits_4_and_a_second_signal_exits_at_once(planner):
    """With the planner stopped (SIGSTOP) no cancel can be answered: one submit gives up after
    --cancel-wait, the other is ended by a second Ctrl-C."""
    group, client = planner
    waits = Submit("--robot", "drone_stuck", "--id", "cli-nowait", "--cancel-wait", "2", DRONE_PLAN)
    twice = Submit("--robot", "drone_stuck", "--id", "cli-twice", DRONE_PLAN)
    planner_pid = group.procs["planner"].pid
    try:
        assert waits.saw("cli-nowait: segment 0:"), waits.report()
        assert twice.saw("cli-twice: segment 0:"), twice.report()
        os.kill(planner_pid, signal.SIGSTOP)
        for run in (waits, twice):
            run.proc.send_signal(signal.SIGINT)
        assert twice.saw("SIGINT: cancelling", 10, stream="err"), twice.report()
        started = time.monotonic()
        twice.proc.send_signal(signal.SIGINT)
        assert twice.finish(10) == 128 + signal.SIGINT, twice.report()
        assert time.monotonic() - started < 5, twice.report()   # not the 10 s cancel wait
        assert "second SIGINT: exiting without the result" in "\n".join(twice.err), twice.report()
        assert waits.finish(20) == submit_cli.EXIT_NO_RESULT, waits.report()
        assert "cancel sent, but no result within 2 s" in "\n".join(waits.err), waits.report()
    finally:
        os.kill(planner_pid, signal.SIGCONT)
        for run in (waits, twice):
            if run.proc.poll() is None:
                run.proc.kill()
    # Their cancels went to a frozen planner from processes now gone, so DDS may never deliver
    # them: end the tasks here, which also shows the planner is back.
    for task_id in ("cli-nowait", "cli-twice"):
        response = client.cancel_task(task_id, reason="test cleanup")
        assert response.success or "already ended (cancelled)" in response.reason, response
