"""The one interface every robot backend implements, and the executor node drives."""

from __future__ import annotations

from typing import Protocol, Sequence

from timelyllm_ros.core.skills.base import SkillCall


class SkillBackend(Protocol):
    """What "executing a segment" means on one robot.

    `execute` must not raise: a failure of the robot (or of its link) is a result, reported to
    the planner as an unsuccessful segment, not an exception that would stop the executor.
    A backend that holds resources (sockets, threads) may also have `close()`; the executor
    calls it on shutdown when present.
    """

    def execute(self, calls: Sequence[SkillCall]) -> tuple[bool, str]:
        """Run the calls to completion; return (success, message)."""
