"""Helpers shared by the seed papers' policies."""

from __future__ import annotations

from pathlib import Path

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.sched.interface import Candidate, SchedulerContext


def engine_profile(ctx: SchedulerContext,
                   override: EngineProfile | str | Path | None = None) -> EngineProfile:
    """The engine cost model a policy prices work with: `override` (an EngineProfile or a YAML
    path), else the engine's own (simulated engine), else the default profile."""
    if isinstance(override, EngineProfile):
        return override
    if isinstance(override, (str, Path)):
        return EngineProfile.from_yaml(override)
    if ctx.profile is not None:
        return ctx.profile
    return EngineProfile()


def kv_blocks_ok(candidate: Candidate, free_kv_blocks: int) -> tuple[bool, str]:
    if candidate.blocks_needed > free_kv_blocks:
        return False, f"kv blocks: need {candidate.blocks_needed}, free {free_kv_blocks}"
    return True, ""
