"""Fit the execution-time model (config/exec_model.yaml schema) to recorded skill timings.

Input rows come from a timing table (timing_table.py). Only successful, single-call segments
measure one skill, so only those are fitted; multi-call segments are used afterwards as a check
(observed / predicted duration).

Per skill:
- parameterised skills (names matching LINEAR_SKILL_PATTERNS: move_*, turn_*, delay; or any skill
  the base model already fits linearly, or named with --linear): least squares of
  duration = fixed_s + per_unit_s * |argument| (numpy lstsq; scipy's NNLS when the unconstrained
  fit goes negative, since the model requires both >= 0). Reports n, RMSE and R². The sampler's
  jitter_sigma is the standard deviation of the log residuals log(observed / fitted), i.e. the
  lognormal factor exp(N(0, sigma)) that simulated robots multiply the fitted value by.
- every other skill (sweeping, searches, vision, anything with non-numeric arguments): an
  empirical distribution, the observed durations (thinned to MAX_EMPIRICAL_SAMPLES quantiles).

The scheduler plans with the model's minimum (the fitted line without jitter, or the fastest
sample); simulated robots sample (line x lognormal jitter, or a random sample).

Skills with fewer than MIN_LINEAR_SAMPLES / MIN_EMPIRICAL_SAMPLES rows (or a linear skill seen
at a single argument value) are an error naming the skill and its count, unless allow_sparse
keeps the base model's entry for them. Skills not in the recording keep the base model's entry.

Writing the fitted model, its summary table and its plots: lrtrace/fit_output.py.
"""

from __future__ import annotations

import copy
import fnmatch
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import yaml

from timelyllm_ros.core.exec_model import ExecModelConfigError, ExecutionTimeModel
from timelyllm_ros.lrtrace.timing_table import CALL_SEPARATOR, TimingRow

MIN_LINEAR_SAMPLES = 3
MIN_EMPIRICAL_SAMPLES = 2
MIN_DISTINCT_ARGUMENTS = 2
LINEAR_SKILL_PATTERNS = ("move_*", "turn_*", "delay")
MAX_EMPIRICAL_SAMPLES = 200
DECIMALS = 6


class FitError(ValueError):
    """Data that cannot be fitted; the message names the skill."""


@dataclass(frozen=True)
class SparseSkill:
    skill: str
    kind: str
    count: int
    needed: int
    why: str = ""

    def describe(self) -> str:
        if self.why:
            return f"{self.skill}: {self.why}"
        const = "MIN_LINEAR_SAMPLES" if self.kind == "linear" else "MIN_EMPIRICAL_SAMPLES"
        article = "an" if self.kind[0] in "aeiou" else "a"
        return (f"{self.skill}: {self.count} sample{'s' if self.count != 1 else ''}, {article} "
                f"{self.kind} fit needs at least {self.needed} ({const})")


class SparseSkillsError(FitError):
    def __init__(self, sparse: Sequence[SparseSkill]):
        self.sparse = list(sparse)
        lines = "\n".join(f"  {s.describe()}" for s in self.sparse)
        super().__init__(f"too few samples for {len(self.sparse)} skill(s):\n{lines}\n"
                         "record more runs, or pass --allow-sparse to keep the existing model "
                         "for these skills")


@dataclass
class SkillFit:
    skill: str
    kind: str  # "linear" or "empirical"
    n: int
    xs: np.ndarray
    ys: np.ndarray
    fixed_s: float = 0.0
    per_unit_s: float = 0.0
    arg: int = 0
    rmse: float = math.nan
    r2: float = math.nan
    jitter_sigma: float = 0.0
    samples: tuple[float, ...] = ()
    constrained: bool = False
    dropped: int = 0  # rows of a linear skill whose argument is not a number

    @property
    def minimum_s(self) -> float:
        """What the scheduler plans with at the smallest argument (linear: the line at |arg| = 0;
        empirical: the fastest sample)."""
        return self.fixed_s if self.kind == "linear" else min(self.samples)

    def predict(self, xs: np.ndarray) -> np.ndarray:
        return self.fixed_s + self.per_unit_s * np.abs(xs)


@dataclass
class FitResult:
    fits: dict[str, SkillFit]
    kept: dict[str, str]  # skill -> why the base entry was kept
    config: dict  # the exec_model mapping to write
    source: str
    rows_total: int = 0
    rows_failed: int = 0
    rows_multi: int = 0
    multi_check: tuple[int, float] | None = None  # (segments, median observed / predicted)
    sparse: list[SparseSkill] = field(default_factory=list)

    def model(self) -> ExecutionTimeModel:
        return ExecutionTimeModel.from_mapping(self.config, source=f"<fit of {self.source}>")


# --- fitting -------------------------------------------------------------------------------------

def fit_linear(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """Least squares of ys = fixed_s + per_unit_s * |xs| with both coefficients >= 0."""
    x = np.abs(np.asarray(xs, dtype=float))
    y = np.asarray(ys, dtype=float)
    if len(x) != len(y) or len(x) < 2:
        raise FitError(f"linear fit needs at least 2 points, got {len(x)}")
    design = np.column_stack([np.ones_like(x), x])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    constrained = False
    if coef[0] < 0 or coef[1] < 0:
        from scipy.optimize import nnls

        coef, _ = nnls(design, y)
        constrained = True
    fitted = design @ coef
    resid = y - fitted
    n = len(y)
    rmse = float(np.sqrt(np.mean(resid ** 2)))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    ss_res = float(np.sum(resid ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res < 1e-18 else 0.0)
    ok = (y > 1e-9) & (fitted > 1e-9)  # log residuals need positive durations
    logres = np.log(y[ok] / fitted[ok])
    dof = max(int(ok.sum()) - 2, 1)
    sigma = float(np.sqrt(np.sum(logres ** 2) / dof)) if ok.any() else 0.0
    return {"fixed_s": float(coef[0]), "per_unit_s": float(coef[1]), "rmse": rmse, "r2": float(r2),
            "jitter_sigma": sigma, "constrained": constrained, "n": n}


def empirical_samples(ys: Sequence[float], limit: int = MAX_EMPIRICAL_SAMPLES) -> tuple[float, ...]:
    """Sorted durations; more than `limit` are thinned to evenly spaced quantiles (keeping the
    minimum and maximum)."""
    y = np.sort(np.asarray(ys, dtype=float))
    if len(y) > limit:
        y = np.quantile(y, np.linspace(0.0, 1.0, limit))
    return tuple(round(float(v), DECIMALS) for v in y)


def is_linear_skill(skill: str, base_spec: Mapping | None, extra: Iterable[str] = ()) -> bool:
    if skill in set(extra):
        return True
    if isinstance(base_spec, Mapping) and base_spec.get("kind") == "linear":
        return True
    return any(fnmatch.fnmatchcase(skill, pat) for pat in LINEAR_SKILL_PATTERNS)


def _number(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def fit_rows(rows: Sequence[TimingRow], *, base: Mapping | None = None, allow_sparse: bool = False,
             linear_skills: Iterable[str] = (), source: str = "<rows>") -> FitResult:
    """Fit every skill that has single-call, successful rows; raise SparseSkillsError (all sparse
    skills at once) unless allow_sparse."""
    base = load_base(None) if base is None else base
    base_skills = base.get("skills", {})
    linear_skills = tuple(linear_skills)
    by_skill: dict[str, list[TimingRow]] = {}
    failed = multi = 0
    multi_only: set[str] = set()
    for r in rows:
        if not r.success:
            failed += 1
            continue
        if r.calls_in_segment > 1:
            multi += 1
            multi_only.update(s for s in r.skill.split(CALL_SEPARATOR) if s)
            continue
        by_skill.setdefault(r.skill, []).append(r)
    if not by_skill and not multi:
        raise FitError(f"{source}: no successful executions to fit "
                       f"({len(rows)} rows, {failed} failed)")

    fits: dict[str, SkillFit] = {}
    sparse: list[SparseSkill] = []
    for skill, srows in sorted(by_skill.items()):
        spec = base_skills.get(skill)
        ys = np.array([r.duration for r in srows], dtype=float)
        if is_linear_skill(skill, spec, linear_skills):
            arg = int(spec.get("arg", 0)) if isinstance(spec, Mapping) and spec.get("kind") == "linear" else 0
            pairs = [(_number(a[arg]) if len(a) > arg else None, r.duration)
                     for r in srows for a in [r.args()]]
            good = [(x, y) for x, y in pairs if x is not None]
            dropped = len(pairs) - len(good)
            if len(good) < MIN_LINEAR_SAMPLES:
                sparse.append(SparseSkill(skill, "linear", len(good), MIN_LINEAR_SAMPLES,
                                          "" if not dropped else
                                          f"{len(good)} samples with a numeric argument "
                                          f"({dropped} not numeric), a linear fit needs at least "
                                          f"{MIN_LINEAR_SAMPLES} (MIN_LINEAR_SAMPLES)"))
                continue
            xs = np.array([x for x, _ in good])
            ysl = np.array([y for _, y in good])
            if len(set(np.abs(xs).tolist())) < MIN_DISTINCT_ARGUMENTS:
                sparse.append(SparseSkill(
                    skill, "linear", len(good), MIN_LINEAR_SAMPLES,
                    f"{len(good)} samples but all at argument {abs(xs[0]):g}; a linear fit needs "
                    f"at least {MIN_DISTINCT_ARGUMENTS} distinct values (MIN_DISTINCT_ARGUMENTS)"))
                continue
            lf = fit_linear(xs, ysl)
            fits[skill] = SkillFit(skill, "linear", len(good), xs, ysl, fixed_s=lf["fixed_s"],
                                   per_unit_s=lf["per_unit_s"], arg=arg, rmse=lf["rmse"], r2=lf["r2"],
                                   jitter_sigma=lf["jitter_sigma"], constrained=lf["constrained"],
                                   dropped=dropped)
        else:
            if len(ys) < MIN_EMPIRICAL_SAMPLES:
                sparse.append(SparseSkill(skill, "empirical", len(ys), MIN_EMPIRICAL_SAMPLES))
                continue
            fits[skill] = SkillFit(skill, "empirical", len(ys), np.zeros(len(ys)), ys,
                                   samples=empirical_samples(ys),
                                   rmse=float(np.std(ys)), r2=math.nan)
    if sparse and not allow_sparse:
        raise SparseSkillsError(sparse)

    kept: dict[str, str] = {}
    for s in sparse:
        kept[s.skill] = ("sparse, base entry kept" if s.skill in base_skills
                         else "sparse, not in base: the default model applies")
    for s in sorted(multi_only - set(fits) - set(kept)):
        kept[s] = ("only inside multi-call segments, base entry kept" if s in base_skills
                   else "only inside multi-call segments, not in base: the default model applies")

    config = _merge(base, fits, source)
    result = FitResult(fits, kept, config, source, rows_total=len(rows), rows_failed=failed,
                       rows_multi=multi, sparse=sparse)
    try:
        model = result.model()
    except ExecModelConfigError as err:  # pragma: no cover - _merge writes valid entries
        raise FitError(f"fitted model does not validate: {err}") from None
    result.multi_check = _multi_check(rows, model)
    return result


def _merge(base: Mapping, fits: Mapping[str, SkillFit], source: str) -> dict:
    skills: dict[str, Any] = {}
    for name, spec in base.get("skills", {}).items():
        skills[str(name)] = copy.deepcopy(dict(spec))  # no YAML anchors/aliases in the output
    for name in sorted(fits):
        f = fits[name]
        old = skills.get(name, {})
        if f.kind == "linear":
            spec = {"kind": "linear", "fixed_s": round(f.fixed_s, DECIMALS),
                    "per_unit_s": round(f.per_unit_s, DECIMALS), "arg": f.arg,
                    "jitter_sigma": round(f.jitter_sigma, 4)}
            if old.get("kind") == "linear" and "fallback_units" in old:
                spec["fallback_units"] = old["fallback_units"]
            spec["note"] = (f"lrtrace fit of {source}: n={f.n}, RMSE={f.rmse:.4f} s, R2={f.r2:.4f}"
                            + (", coefficients constrained >= 0" if f.constrained else "")
                            + (f", {f.dropped} non-numeric arguments skipped" if f.dropped else ""))
        else:
            spec = {"kind": "empirical", "samples": list(f.samples),
                    "note": (f"lrtrace fit of {source}: n={f.n}, mean={np.mean(f.ys):.4f} s, "
                             f"min={np.min(f.ys):.4f} s, max={np.max(f.ys):.4f} s")}
        skills[name] = spec
    if "default" not in skills:
        skills = {"default": {"kind": "constant", "seconds": 1.0, "jitter_sigma": 0.1}, **skills}
    return {"version": 1, "skills": skills}


def _multi_check(rows: Sequence[TimingRow], model: ExecutionTimeModel) -> tuple[int, float] | None:
    ratios = []
    for r in rows:
        if not r.success or r.calls_in_segment < 2:
            continue
        names = r.skill.split(CALL_SEPARATOR)
        args = r.arguments.split(CALL_SEPARATOR)
        if len(names) != len(args):
            continue
        predicted = sum(model.model_for(n).nominal(tuple(a.split(",")) if a else ())
                        for n, a in zip(names, args))
        if predicted > 0:
            ratios.append(r.duration / predicted)
    return (len(ratios), float(np.median(ratios))) if ratios else None


# --- the base model ------------------------------------------------------------------------------

def default_base_path() -> Path:
    from timelyllm_ros.core.tuf import default_config_dir

    return default_config_dir() / "exec_model.yaml"


def load_base(path: str | os.PathLike | None) -> dict:
    """The model whose entries are kept for skills not fitted (default config/exec_model.yaml);
    validated like the planner would."""
    p = Path(path) if path is not None else default_base_path()
    ExecutionTimeModel.from_yaml(p)  # raises ExecModelConfigError naming file and key
    with open(p, encoding="utf-8") as fh:
        return yaml.safe_load(fh)
