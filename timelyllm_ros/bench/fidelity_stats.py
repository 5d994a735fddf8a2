"""The simulator against the real engine (`timelyllm bench --fidelity`): what the runs are
compared by. Pure functions of `RunResult`s, so the pairing, the statistics and the ranking are
tested without an engine (bench/fidelity.py runs the engines).

- Pairs: the same task (same id: the same event list is replayed) on every real run and on the
  simulated run, with each run's response time.
- Per policy: p50 and p90 of the response time and the mean utility (over tasks that got a
  response, as `bench.metrics.bucket_metrics` computes them for the bench's table), for every
  real run, their mean and spread (max - min), the simulated run's, and its relative error
  against the real runs' mean.
- Rankings: the policies ordered by each figure, on the simulator, on the real runs' mean, and
  on every real run alone (when the real runs disagree with each other, the real ranking is
  within the noise and an agreement means little).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from timelyllm_ros.bench.metrics import bucket_metrics
from timelyllm_ros.bench.results import RunResult

# The figures compared, the key `bucket_metrics` gives each, and whether higher is better.
FIGURES = (("p50_s", "response_time_p50_s", False),
           ("p90_s", "response_time_p90_s", False),
           ("utility", "utility_mean", True))
# The goal: the simulator's p50 and p90 within 15 % of the real engine's.
GOAL = 0.15
GOAL_FIGURES = ("p50_s", "p90_s")


@dataclass(frozen=True)
class TaskPair:
    """One task's response time on every real run and on the simulated run (NaN: none)."""

    task_id: str
    task_type: str
    real_s: tuple[float, ...]
    sim_s: float

    @property
    def real_mean_s(self) -> float:
        finite = [x for x in self.real_s if math.isfinite(x)]
        return sum(finite) / len(finite) if finite else math.nan

    @property
    def error(self) -> float:
        """(sim - real mean) / real mean; NaN when either has no response."""
        real = self.real_mean_s
        if not (math.isfinite(real) and math.isfinite(self.sim_s)) or real <= 0:
            return math.nan
        return (self.sim_s - real) / real


def pair_tasks(real_runs: Sequence[RunResult], sim: RunResult) -> list[TaskPair]:
    """Every task of the simulated run paired with the same task of each real run, in task id
    order. The runs replayed one event list, so their task ids must be the same set."""
    if not real_runs:
        raise ValueError("pair_tasks: no real run")
    sim_by_id = {t.task_id: t for t in sim.tasks}
    real_by_id = [{t.task_id: t for t in run.tasks} for run in real_runs]
    for i, ids in enumerate(real_by_id):
        if set(ids) != set(sim_by_id):
            only_real = sorted(set(ids) - set(sim_by_id))[:3]
            only_sim = sorted(set(sim_by_id) - set(ids))[:3]
            raise ValueError(f"pair_tasks: real run {i + 1} of {real_runs[i].policy} and the "
                             f"simulated run replayed different tasks (only real: {only_real}, "
                             f"only simulated: {only_sim})")
    return [TaskPair(tid, sim_by_id[tid].task_type,
                     tuple(float(ids[tid].response_time_s) for ids in real_by_id),
                     float(sim_by_id[tid].response_time_s))
            for tid in sorted(sim_by_id)]


@dataclass(frozen=True)
class Figures:
    """One run's compared figures (NaN where no task got a response)."""

    p50_s: float
    p90_s: float
    utility: float
    tasks: int
    without_response: int

    @classmethod
    def of(cls, run: RunResult) -> "Figures":
        metrics = bucket_metrics(run.tasks)
        return cls(**{name: float(metrics[key]) for name, key, _ in FIGURES},
                   tasks=len(run.tasks),
                   without_response=sum(1 for t in run.tasks
                                        if not math.isfinite(float(t.response_time_s))))


def relative_error(sim: float, real: float) -> float:
    """(sim - real) / |real|; NaN when it is undefined."""
    if not (math.isfinite(sim) and math.isfinite(real)) or real == 0:
        return math.nan
    return (sim - real) / abs(real)


@dataclass
class PolicyFidelity:
    """One policy: its real runs' figures and the simulated run's."""

    policy: str
    real: list[Figures]
    sim: Figures
    pairs: list[TaskPair] = field(default_factory=list)

    def real_mean(self, name: str) -> float:
        values = [getattr(f, name) for f in self.real if math.isfinite(getattr(f, name))]
        return sum(values) / len(values) if values else math.nan

    def real_spread(self, name: str) -> float:
        values = [getattr(f, name) for f in self.real if math.isfinite(getattr(f, name))]
        return max(values) - min(values) if values else math.nan

    def error(self, name: str) -> float:
        return relative_error(getattr(self.sim, name), self.real_mean(name))

    def meets_goal(self, goal: float = GOAL) -> bool:
        errors = [self.error(n) for n in GOAL_FIGURES]
        return all(math.isfinite(e) and abs(e) <= goal for e in errors)

    def to_dict(self) -> dict:
        out: dict = {"tasks": self.sim.tasks,
                     "without_response": {"real": [f.without_response for f in self.real],
                                          "sim": self.sim.without_response}}
        for name, _, _ in FIGURES:
            out[name] = {"real": [getattr(f, name) for f in self.real],
                         "real_mean": self.real_mean(name),
                         "real_spread": self.real_spread(name),
                         "sim": getattr(self.sim, name), "error": self.error(name)}
        out["meets_goal"] = self.meets_goal()
        return out


def ranking(values: Mapping[str, float], higher_is_better: bool) -> list[str]:
    """Policy names from best to worst by `values` (NaN last; ties keep the given order)."""
    names = list(values)

    def key(name: str) -> tuple[int, float]:
        v = values[name]
        if not math.isfinite(v):
            return (1, 0.0)
        return (0, -v if higher_is_better else v)
    return sorted(names, key=key)


@dataclass
class Rankings:
    """The policies' order by one figure."""

    figure: str
    sim: list[str]
    real_mean: list[str]
    real_runs: list[list[str]]

    @property
    def agree(self) -> bool:
        return self.sim == self.real_mean

    @property
    def real_runs_agree(self) -> bool:
        return all(r == self.real_runs[0] for r in self.real_runs)

    def to_dict(self) -> dict:
        return {"sim": self.sim, "real_mean": self.real_mean, "real_runs": self.real_runs,
                "agree": self.agree, "real_runs_agree": self.real_runs_agree}


def rankings(policies: Sequence[PolicyFidelity]) -> list[Rankings]:
    """For each compared figure, the policies' order on the simulator, on the real runs' mean
    and on each real run."""
    out = []
    runs = min((len(p.real) for p in policies), default=0)
    for name, _, higher in FIGURES:
        out.append(Rankings(
            name,
            sim=ranking({p.policy: getattr(p.sim, name) for p in policies}, higher),
            real_mean=ranking({p.policy: p.real_mean(name) for p in policies}, higher),
            real_runs=[ranking({p.policy: getattr(p.real[i], name) for p in policies}, higher)
                       for i in range(runs)]))
    return out


def compare(real: Mapping[str, Sequence[RunResult]],
            sim: Mapping[str, RunResult]) -> list[PolicyFidelity]:
    """Per policy (in the order of `sim`), the real runs against the simulated run."""
    missing = [p for p in sim if not real.get(p)]
    if missing:
        raise ValueError(f"compare: no real run of {', '.join(missing)}")
    return [PolicyFidelity(name, [Figures.of(r) for r in real[name]], Figures.of(run),
                           pair_tasks(real[name], run))
            for name, run in sim.items()]


# ---- text -----------------------------------------------------------------------------------

def _ms(x: float) -> str:
    return f"{x * 1e3:.0f}" if math.isfinite(x) else "-"


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%" if math.isfinite(x) else "-"


def _num(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if math.isfinite(x) else "-"


def format_fidelity(policies: Sequence[PolicyFidelity], ranks: Sequence[Rankings],
                    goal: float = GOAL) -> str:
    """The fidelity table: per policy and figure the real runs (mean, spread), the simulator,
    its error; then the rankings."""
    lines = [f"{'policy':<14} {'figure':<8} {'real runs':<20} {'real mean':>9} "
             f"{'spread':>7} {'sim':>8} {'error':>8}"]
    for p in policies:
        for name, _, _ in FIGURES:
            fmt = _num if name == "utility" else _ms
            runs = ", ".join(fmt(getattr(f, name)) for f in p.real)
            unit = "" if name == "utility" else " ms"
            lines.append(f"{p.policy:<14} {name.replace('_s', '') + unit:<8} {runs:<20} "
                         f"{fmt(p.real_mean(name)):>9} {fmt(p.real_spread(name)):>7} "
                         f"{fmt(getattr(p.sim, name)):>8} {_pct(p.error(name)):>8}")
        verdict = "met" if p.meets_goal(goal) else "not met"
        lines.append(f"{'':<14} p50 and p90 within {goal * 100:.0f} %: {verdict}")
    lines.append("")
    for r in ranks:
        runs = "; ".join(" > ".join(x) for x in r.real_runs)
        lines.append(f"ranking by {r.figure}: sim {' > '.join(r.sim)}; real (mean) "
                     f"{' > '.join(r.real_mean)}: {'same' if r.agree else 'DIFFERENT'} "
                     f"(each real run: {runs}; "
                     f"{'consistent' if r.real_runs_agree else 'real runs disagree'})")
    return "\n".join(lines)


def format_pairs(policy: PolicyFidelity, limit: int | None = None) -> str:
    """Per-task response times, real run(s) against the simulator, in ms."""
    n = len(policy.real)
    head = " ".join(f"{'real ' + str(i + 1):>7}" for i in range(n))
    lines = [f"{policy.policy}: per-task response time (ms)",
             f"  {'task':<8} {'type':<13} {head} {'sim':>7} {'error':>8}"]
    shown = policy.pairs if limit is None else policy.pairs[:limit]
    for pair in shown:
        real = " ".join(f"{_ms(x):>7}" for x in pair.real_s)
        lines.append(f"  {pair.task_id:<8} {pair.task_type:<13} {real} {_ms(pair.sim_s):>7} "
                     f"{_pct(pair.error):>8}")
    if limit is not None and len(policy.pairs) > limit:
        lines.append(f"  ... {len(policy.pairs) - limit} more (all in pairs.csv)")
    return "\n".join(lines)


def pairs_csv(policies: Sequence[PolicyFidelity]) -> str:
    """Every pair of every policy as CSV: policy, task, type, real_1..real_n, sim (seconds)."""
    runs = max((len(p.real) for p in policies), default=0)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["policy", "task_id", "task_type"]
                    + [f"real_{i + 1}_s" for i in range(runs)] + ["sim_s", "error"])
    for p in policies:
        for pair in p.pairs:
            real = [f"{x:.6f}" if math.isfinite(x) else "" for x in pair.real_s]
            real += [""] * (runs - len(real))
            writer.writerow([p.policy, pair.task_id, pair.task_type, *real,
                             f"{pair.sim_s:.6f}" if math.isfinite(pair.sim_s) else "",
                             f"{pair.error:.4f}" if math.isfinite(pair.error) else ""])
    return buf.getvalue()
