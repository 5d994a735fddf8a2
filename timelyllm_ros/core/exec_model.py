"""How long a robot takes to execute a skill call.

The scheduler needs a *minimum* (§4.3: resume the generation before the robot could possibly
finish, so the next segment is ready even in the best case); simulated robots need a *sample*.
Both come from the same per-skill model, configured in config/exec_model.yaml and refined online
by the robots' execution reports (`observe`).

Control flow: a segment's calls carry a `weight`, how many times the segment is expected to
run the call (MiniSpec's parser sets it: a loop multiplies by its count, or by its expected
iterations when it can exit early; a conditional's body counts as taken; core/skills/flow.py has
the rule). Segment estimates and samples multiply each call's time by its weight, and a
weighted call is a different key for the observed minima than the same call run once.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

import numpy as np
import yaml

from timelyllm_ros.core.tuf import default_config_dir


class ExecModelConfigError(ValueError):
    """Invalid execution-time configuration; names the file and the key."""

    def __init__(self, source: str, key: str, reason: str):
        super().__init__(f"{source}: {key}: {reason}")
        self.source = source
        self.key = key
        self.reason = reason


class CallLike(Protocol):
    name: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class SkillTimeModel:
    """Base: `nominal(args)` is the jitter-free duration; jitter_sigma > 0 multiplies samples by
    a lognormal factor with median 1 (real robots both beat and miss their nominal timings)."""

    jitter_sigma: float = 0.0
    # The longest plausible duration where the draws do not show it (a sweep defined as a loop
    # of turns and checks that may run every iteration); None: from the draws.
    max_s: float | None = None
    kind = "abstract"

    def nominal(self, args: Sequence[str]) -> float:
        raise NotImplementedError

    def minimum(self, args: Sequence[str]) -> float:
        return self.nominal(args)

    def maximum(self, args: Sequence[str]) -> float:
        """A plausible longest duration: the slowest draw, stretched by three sigma of jitter.
        The planner waits this long (plus its margin) before it calls a robot dead."""
        longest = self._slowest_draw(args) * (math.exp(3.0 * self.jitter_sigma)
                                              if self.jitter_sigma > 0 else 1.0)
        return longest if self.max_s is None else max(longest, self.max_s)

    def _slowest_draw(self, args: Sequence[str]) -> float:
        return self.nominal(args)

    def draw(self, args: Sequence[str], rng: np.random.Generator) -> float:
        return self.nominal(args)

    def sample(self, args: Sequence[str], rng: np.random.Generator) -> float:
        base = self.draw(args, rng)
        if self.jitter_sigma > 0:
            base *= math.exp(rng.normal(0.0, self.jitter_sigma))
        return base


@dataclass(frozen=True)
class LinearModel(SkillTimeModel):
    """fixed_s + per_unit_s * |arg[arg]|, e.g. Tello `forward 50`: overhead + distance / speed."""

    fixed_s: float = 0.0
    per_unit_s: float = 0.0
    arg: int = 0
    # Used when the argument is missing or not a number (a variable such as `_1`): the minimum
    # estimate then stays a lower bound.
    fallback_units: float = 0.0
    kind = "linear"

    def units(self, args: Sequence[str]) -> float:
        try:
            v = abs(float(args[self.arg]))
        except (IndexError, ValueError, TypeError):
            return self.fallback_units
        return v if math.isfinite(v) else self.fallback_units

    def nominal(self, args):
        return self.fixed_s + self.per_unit_s * self.units(args)


@dataclass(frozen=True)
class ConstantModel(SkillTimeModel):
    seconds: float = 0.0
    kind = "constant"

    def nominal(self, args):
        return self.seconds


@dataclass(frozen=True)
class EmpiricalModel(SkillTimeModel):
    """Durations that depend on the scene (a search ends when the object comes into view):
    the scheduler plans for the fastest observed case, robots draw from the distribution."""

    samples: tuple[float, ...] = ()
    kind = "empirical"

    def nominal(self, args):
        return float(np.mean(self.samples))

    def minimum(self, args):
        return min(self.samples)

    def _slowest_draw(self, args):
        return max(self.samples)

    def draw(self, args, rng):
        return float(self.samples[int(rng.integers(len(self.samples)))])


@dataclass(frozen=True)
class ReadingModel(SkillTimeModel):
    """Chat "execution": the user reads the text at words_per_minute."""

    words_per_minute: float = 300.0
    fixed_s: float = 0.0
    kind = "reading"

    def nominal(self, args):
        words = sum(len(str(a).split()) for a in args)
        return self.fixed_s + 60.0 * words / self.words_per_minute


# kind -> (class, required params, optional params with defaults)
_KINDS: dict[str, tuple[type, tuple[str, ...], dict[str, Any]]] = {
    "linear": (LinearModel, ("fixed_s", "per_unit_s"), {"arg": 0, "fallback_units": 0.0}),
    "constant": (ConstantModel, ("seconds",), {}),
    "empirical": (EmpiricalModel, ("samples",), {}),
    "reading": (ReadingModel, (), {"words_per_minute": 300.0, "fixed_s": 0.0}),
}
_COMMON_OPTIONAL = {"jitter_sigma": 0.0, "max_s": None, "note": None}


def _number(source: str, key: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ExecModelConfigError(source, key, f"must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ExecModelConfigError(source, key, f"must be finite, got {v}")
    if v < 0 or (positive and v == 0):
        raise ExecModelConfigError(source, key, f"must be {'> 0' if positive else '>= 0'}, got {v}")
    return v


def parse_skill_model(spec: Any, source: str, key: str) -> SkillTimeModel:
    if not isinstance(spec, Mapping):
        raise ExecModelConfigError(source, key, "must be a mapping with a 'kind'")
    kind = spec.get("kind")
    if kind not in _KINDS:
        raise ExecModelConfigError(source, f"{key}.kind",
                                   f"must be one of {sorted(_KINDS)}, got {kind!r}")
    cls, required, optional = _KINDS[kind]
    allowed = {"kind", *required, *optional, *_COMMON_OPTIONAL}
    for k in spec:
        if k not in allowed:
            raise ExecModelConfigError(source, f"{key}.{k}",
                                       f"unknown parameter for kind {kind!r} (allowed: {sorted(allowed - {'kind'})})")
    for k in required:
        if k not in spec:
            raise ExecModelConfigError(source, f"{key}.{k}", f"required for kind {kind!r}")
    params: dict[str, Any] = {}
    for k in (*required, *optional):
        if k not in spec:
            continue
        v = spec[k]
        if k == "samples":
            if not isinstance(v, list) or not v:
                raise ExecModelConfigError(source, f"{key}.samples", "must be a non-empty list of seconds")
            params[k] = tuple(_number(source, f"{key}.samples[{i}]", x) for i, x in enumerate(v))
        elif k == "arg":
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ExecModelConfigError(source, f"{key}.arg", f"must be an argument index >= 0, got {v!r}")
            params[k] = v
        else:
            params[k] = _number(source, f"{key}.{k}", v, positive=(k == "words_per_minute"))
    if "jitter_sigma" in spec:
        params["jitter_sigma"] = _number(source, f"{key}.jitter_sigma", spec["jitter_sigma"])
    if "max_s" in spec:
        params["max_s"] = _number(source, f"{key}.max_s", spec["max_s"])
    return cls(**params)


def call_weight(call: CallLike) -> float:
    """Expected executions of `call` in its segment (1 unless control flow says otherwise)."""
    w = getattr(call, "weight", 1.0)
    return float(w) if w is not None else 1.0


def _call_key(call: CallLike) -> tuple:
    w = call_weight(call)
    return (call.name, tuple(call.args)) if w == 1.0 else (call.name, tuple(call.args), w)


class ExecutionTimeModel:
    def __init__(self, skills: Mapping[str, SkillTimeModel], default: SkillTimeModel,
                 source: str = "<memory>"):
        self._skills = dict(skills)
        self.default = default
        self.source = source
        # Robot reports: minimum observed duration per exact call and per exact segment.
        self._observed: dict[tuple[str, tuple[str, ...]], float] = {}
        self._observed_segments: dict[tuple, float] = {}

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, data: Any, source: str = "<memory>") -> "ExecutionTimeModel":
        if not isinstance(data, Mapping):
            raise ExecModelConfigError(source, "<root>", "must be a mapping")
        unknown = set(data) - {"version", "skills"}
        if unknown:
            raise ExecModelConfigError(source, sorted(unknown)[0], "unknown top-level key")
        if data.get("version", 1) != 1:
            raise ExecModelConfigError(source, "version", f"unsupported version {data.get('version')!r}")
        skills = data.get("skills")
        if not isinstance(skills, Mapping):
            raise ExecModelConfigError(source, "skills", "missing or not a mapping")
        if "default" not in skills:
            raise ExecModelConfigError(source, "skills.default", "required (model for unknown skills)")
        models = {str(name): parse_skill_model(spec, source, f"skills.{name}")
                  for name, spec in skills.items()}
        default = models.pop("default")
        return cls(models, default, source)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike | None = None) -> "ExecutionTimeModel":
        p = Path(path) if path is not None else default_config_dir() / "exec_model.yaml"
        try:
            with open(p, encoding="utf-8") as fh:
                data = yaml.safe_load(fh)
        except yaml.YAMLError as err:
            raise ExecModelConfigError(str(p), "<yaml>", f"not valid YAML: {err}") from None
        return cls.from_mapping(data, source=str(p))

    # --- queries ------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(self._skills)

    def model_for(self, name: str) -> SkillTimeModel:
        return self._skills.get(name, self.default)

    def estimate_min(self, call: CallLike) -> float:
        """Minimum duration the scheduler plans with: the observed minimum of this exact call if
        a robot reported one, else the model's minimum (no jitter, fastest empirical sample)."""
        observed = self._observed.get(_call_key(call))
        if observed is not None:
            return observed
        return self.model_for(call.name).minimum(call.args)

    def sample(self, call: CallLike, rng: np.random.Generator | None = None) -> float:
        """A plausible duration, for simulated robots."""
        rng = rng if rng is not None else np.random.default_rng()
        return self.model_for(call.name).sample(call.args, rng)

    def estimate_segment_min(self, calls: Iterable[CallLike]) -> float:
        calls = tuple(calls)
        observed = self._observed_segments.get(tuple(_call_key(c) for c in calls))
        if observed is not None:
            return observed
        return sum(self._call_min(c) * call_weight(c) for c in calls)

    def estimate_segment_max(self, calls: Iterable[CallLike]) -> float:
        """A plausible longest duration of the segment (each call's `maximum`, times its
        weight), never below the minimum estimate: what the planner's dead-robot timeout waits
        for, where the minimum would call a robot dead in the middle of a long sweep."""
        calls = tuple(calls)
        upper = sum(self.model_for(c.name).maximum(c.args) * call_weight(c) for c in calls)
        return max(upper, self.estimate_segment_min(calls))

    def estimate_segment_nominal(self, calls: Iterable[CallLike]) -> float:
        """The jitter-free duration the model expects (nominal per call, times its weight)."""
        return sum(self.model_for(c.name).nominal(c.args) * call_weight(c) for c in calls)

    def _call_min(self, call: CallLike) -> float:
        observed = self._observed.get((call.name, tuple(call.args)))
        if observed is not None:
            return observed
        return self.model_for(call.name).minimum(call.args)

    def sample_segment(self, calls: Iterable[CallLike], rng: np.random.Generator | None = None) -> float:
        rng = rng if rng is not None else np.random.default_rng()
        return sum(self.sample(c, rng) * call_weight(c) for c in calls)

    # --- feedback -----------------------------------------------------------------------------
    def observe(self, call: CallLike, duration_s: float) -> None:
        """Record a robot's report of how long `call` took."""
        d = self._check_duration(duration_s)
        key = _call_key(call)
        prev = self._observed.get(key)
        if prev is None or d < prev:
            self._observed[key] = d

    def observe_segment(self, calls: Iterable[CallLike], duration_s: float) -> None:
        """Record a report for a whole segment (robots report per segment). A one-call segment
        also teaches the per-call minimum; longer ones only their exact sequence."""
        calls = tuple(calls)
        d = self._check_duration(duration_s)
        key = tuple(_call_key(c) for c in calls)
        prev = self._observed_segments.get(key)
        if prev is None or d < prev:
            self._observed_segments[key] = d
        if len(calls) == 1 and call_weight(calls[0]) == 1.0:
            self.observe(calls[0], d)

    def observed_min(self, call: CallLike) -> float | None:
        return self._observed.get(_call_key(call))

    @staticmethod
    def _check_duration(duration_s: float) -> float:
        d = float(duration_s)
        if not (math.isfinite(d) and d >= 0):
            raise ValueError(f"duration must be finite and >= 0, got {duration_s!r}")
        return d
