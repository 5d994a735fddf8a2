"""Time-utility functions (TUFs) and the named TUF levels robots can ask for.

A TUF maps a response time to the utility of answering at that time (DESIGN §2, Eq. 1):
`U(t) = U0` while `t <= ERT`, then it declines linearly with slope k. It is deliberately not
clipped at zero: a plan delivered after the cut-off `ERT + U0/k` is worse than useless (the robot
acted on stale information or stood idle), and the scheduler must be able to see how much worse.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import yaml

from timelyllm_ros.core.errors import FieldError

# Plausibility bounds. They catch unit mistakes (milliseconds passed as seconds, a slope of
# 1/ms), not policy: no robot task in this project waits an hour for its first action, and a
# utility or slope this large would swamp every other task in a PUD comparison.
MAX_ERT_S = 3600.0
MAX_INITIAL_UTILITY = 1e3
MAX_SLOPE_PER_S = 1e4

# Overridable so a ROS install (config under share/) and tests can point elsewhere.
CONFIG_DIR_ENV = "TIMELYLLM_CONFIG_DIR"


def default_config_dir() -> Path:
    env = os.environ.get(CONFIG_DIR_ENV)
    if env:
        return Path(env)
    # timelyllm_ros/core/tuf.py -> repository root / config
    return Path(__file__).resolve().parents[2] / "config"


class TufError(FieldError):
    """A TUF parameter that cannot be right; `field` names the offending parameter."""

    @staticmethod
    def describe(field: str, reason: str) -> str:
        return f"invalid TUF {field}: {reason}"


@dataclass(frozen=True)
class TUF:
    ert_s: float
    slope_per_s: float
    initial_utility: float

    def utility(self, t):
        """Utility of response time `t` (seconds); `t` may be a scalar or a numpy array."""
        if isinstance(t, np.ndarray):
            late = np.maximum(t - self.ert_s, 0.0)
            return self.initial_utility - self.slope_per_s * late
        t = float(t)
        if t <= self.ert_s:
            return float(self.initial_utility)
        return float(self.initial_utility - self.slope_per_s * (t - self.ert_s))

    @property
    def cutoff_s(self) -> float:
        """Response time at which utility reaches zero."""
        return self.ert_s + self.initial_utility / self.slope_per_s

    def for_suspended(self) -> "TUF":
        """TUF of a suspended generation (§4.2): same criticality (k, U0), but no grace period,
        because the next segment is due the moment the robot finishes the previous one."""
        return TUF(0.0, self.slope_per_s, self.initial_utility)

    def validate(self) -> "TUF":
        """Raise TufError for values that cannot describe a real task; return self otherwise."""
        checks = (
            ("ert_s", self.ert_s, MAX_ERT_S, True),
            ("slope_per_s", self.slope_per_s, MAX_SLOPE_PER_S, False),
            ("initial_utility", self.initial_utility, MAX_INITIAL_UTILITY, True),
        )
        for name, value, limit, zero_ok in checks:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise TufError(name, f"must be a number, got {type(value).__name__}")
            v = float(value)
            if math.isnan(v):
                raise TufError(name, "is NaN")
            if math.isinf(v):
                raise TufError(name, "is infinite")
            if v < 0:
                raise TufError(name, f"is negative ({v})")
            if v == 0 and not zero_ok:
                # A flat TUF has no cut-off and gives PUD nothing to rank by.
                raise TufError(name, "is zero")
            if v > limit:
                raise TufError(name, f"{v} exceeds the plausible maximum {limit}")
        return self

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "TUF") -> "TUF":
        """Build and validate a TUF from a mapping with keys ert_s, slope_per_s, initial_utility."""
        if not isinstance(data, Mapping):
            raise TufError("*", f"{where}: expected a mapping, got {type(data).__name__}")
        expected = {"ert_s", "slope_per_s", "initial_utility"}
        missing = expected - set(data)
        if missing:
            raise TufError(sorted(missing)[0], f"{where}: missing (need {sorted(expected)})")
        unknown = set(data) - expected
        if unknown:
            raise TufError(sorted(unknown)[0], f"{where}: unknown key")
        return cls(data["ert_s"], data["slope_per_s"], data["initial_utility"]).validate()


class TufLevels:
    """Named TUFs (normal, urgent, chat, ...) that task goals refer to by name."""

    def __init__(self, levels: Mapping[str, TUF], source: str = "<memory>"):
        self._levels = dict(levels)
        self.source = source

    def get(self, name: str) -> TUF:
        try:
            return self._levels[name]
        except KeyError:
            raise KeyError(
                f"unknown TUF level {name!r}; known levels: {', '.join(sorted(self._levels))}"
            ) from None

    __getitem__ = get

    def names(self) -> list[str]:
        return sorted(self._levels)

    def __contains__(self, name: object) -> bool:
        return name in self._levels

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._levels)

    def as_dict(self) -> dict[str, TUF]:
        return dict(self._levels)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "<memory>") -> "TufLevels":
        if not isinstance(data, Mapping) or not isinstance(data.get("levels"), Mapping):
            raise ValueError(f"{source}: expected a top-level 'levels' mapping")
        levels: dict[str, TUF] = {}
        for name, spec in data["levels"].items():
            try:
                levels[str(name)] = TUF.from_mapping(spec, where=f"level {name!r}")
            except TufError as err:
                raise TufError(err.field, f"{source}: levels.{name}: {err.reason}") from None
        if not levels:
            raise ValueError(f"{source}: 'levels' is empty")
        return cls(levels, source)


def load_tuf_levels(path: str | os.PathLike | None = None) -> TufLevels:
    """Load TUF levels from YAML (default: config/tuf_levels.yaml)."""
    p = Path(path) if path is not None else default_config_dir() / "tuf_levels.yaml"
    with open(p, encoding="utf-8") as fh:
        try:
            data = yaml.safe_load(fh)
        except yaml.YAMLError as err:
            raise ValueError(f"{p}: not valid YAML: {err}") from None
    return TufLevels.from_mapping(data or {}, source=str(p))
