"""TimelyLLM's priority: potential utility density scaled by slack (DESIGN §2, Eq. 4).

For a queued generation at time t, with g the estimated time to generate one segment:

    w   = max(0, t + g - r)           waiting time if started now
    PUD = U(w) / g                    utility gained per second of engine time
    s   = r + ERT - (t + g)           slack left once the segment is generated
    P   = PUD * f(s, g)               f = slack scaling, e.g. 1 / max(s, g)

U uses each row's own ERT, k and U0. Because ERT >= 0, U(w) = U0 + k * min(s, 0), which
avoids computing w at all.

Negative PUD (rows already past their cut-off). A scaling f that shrinks with slack is meant to
demote rows that can wait. Applied to a negative PUD it would do the opposite: a late row with
"lots of slack" would be pulled towards zero and overtake a late row with less. We never let
slack help a negative row: such rows are scaled by the largest factor the scaling gives
(its value at s <= 0), so among late rows the order is by PUD alone - the least-late, most
valuable one first - and every late row stays below every row with U >= 0. With validated TUFs
(U0 >= 0, ERT >= 0) a negative PUD implies s < 0 anyway (U < 0 needs t + g - r > ERT + U0/k),
so this only fixes the sign convention; for such rows Eq. 4 holds exactly (max(s, g) = g).
The same rule is written uniformly as P = min(PUD * f(s), PUD * f_max), which is exact for
PUD >= 0 because f(s) <= f_max there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from timelyllm_ros.core.sched.queue_view import QueueView

# ScalingFn(u, s, g, out, params) -> out. u holds U(w), s the slack; both are scratch arrays the
# function may overwrite. It must return PUD scaled, i.e. based on u / g.
ScalingFn = Callable[[np.ndarray, np.ndarray, float, np.ndarray, Mapping[str, float]], np.ndarray]


@dataclass(frozen=True)
class SlackScaling:
    name: str
    fn: ScalingFn
    defaults: Mapping[str, float] = field(default_factory=dict)
    description: str = ""

    def params(self, overrides: Mapping[str, float] | None = None) -> dict[str, float]:
        merged = dict(self.defaults)
        for k, v in (overrides or {}).items():
            if k not in self.defaults:
                raise TypeError(
                    f"slack scaling {self.name!r} has no parameter {k!r}"
                    f" (parameters: {sorted(self.defaults) or 'none'})")
            v = float(v)
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"slack scaling {self.name!r}: {k} must be > 0, got {v}")
            merged[k] = v
        return merged


def _max_slack_g(u, s, g, out, params):
    # P = U / (g * max(s, g)); late rows (U < 0) use the maximum factor 1/g, i.e. U / g^2.
    np.maximum(s, g, out=s)
    s *= g
    np.divide(u, s, out=out)
    u *= 1.0 / (g * g)
    return np.minimum(out, u, out=out)


def _exp_decay(u, s, g, out, params):
    # P = (U / g) * exp(-max(s, 0) / tau); the factor is 1 at s <= 0, its maximum.
    np.maximum(s, 0.0, out=s)
    s *= -1.0 / params["tau"]
    np.exp(s, out=s)
    u *= 1.0 / g
    np.multiply(u, s, out=out)
    return np.minimum(out, u, out=out)


def _no_scaling(u, s, g, out, params):
    return np.multiply(u, 1.0 / g, out=out)


_SCALINGS: dict[str, SlackScaling] = {}


def register_slack_scaling(name: str, fn: ScalingFn, defaults: Mapping[str, float] | None = None,
                           description: str = "") -> SlackScaling:
    """Add a named scaling. `fn` must be non-increasing in slack and positive; see module doc."""
    if name in _SCALINGS:
        raise ValueError(f"slack scaling {name!r} is already registered")
    sc = SlackScaling(name, fn, dict(defaults or {}), description)
    _SCALINGS[name] = sc
    return sc


register_slack_scaling("max_slack_g", _max_slack_g,
                       description="P = PUD / max(s, g) (DESIGN default)")
register_slack_scaling("exp_decay", _exp_decay, {"tau": 1.0},
                       description="P = PUD * exp(-max(s, 0) / tau)")
register_slack_scaling("none", _no_scaling, description="P = PUD (slack ignored)")


def slack_scaling_names() -> list[str]:
    return sorted(_SCALINGS)


def get_slack_scaling(name: str | SlackScaling) -> SlackScaling:
    if isinstance(name, SlackScaling):
        return name
    try:
        return _SCALINGS[name]
    except KeyError:
        raise KeyError(f"unknown slack scaling {name!r}; known: {', '.join(slack_scaling_names())}") from None


def pud_priority(view: QueueView, now: float, gen_time_s: float,
                 slack_scaling: str | SlackScaling = "max_slack_g", *,
                 out: np.ndarray | None = None,
                 params: Mapping[str, float] | None = None) -> np.ndarray:
    """Priority of every row of `view` at time `now` (higher = serve first).

    `params` overrides the scaling's parameters (e.g. {"tau": 0.5}). `out`, if given, must be a
    float64 array of len(view) and receives the result.
    """
    g = check_gen_time(gen_time_s)
    sc = get_slack_scaling(slack_scaling)
    return pud_core(view, now, g, sc, sc.params(params), out)


def check_gen_time(gen_time_s: float) -> float:
    g = float(gen_time_s)
    if not (g > 0 and math.isfinite(g)):
        raise ValueError(f"gen_time_s must be a positive finite number, got {gen_time_s!r}")
    return g


def pud_core(view: QueueView, now: float, g: float, scaling: SlackScaling,
             params: Mapping[str, float], out: np.ndarray | None = None) -> np.ndarray:
    """Eq. 4 without argument checks, for callers that validated once (policies)."""
    s = np.add(view.reference_s, view.ert_s)
    s -= now + g
    u = np.minimum(s, 0.0)
    u *= view.slope
    u += view.initial_utility
    if out is None:
        out = np.empty_like(s)
    return scaling.fn(u, s, g, out, params)


def pud_priority_scalar(reference_s: float, ert_s: float, slope: float, initial_utility: float,
                        now: float, gen_time_s: float, slack_scaling: str = "max_slack_g",
                        params: Mapping[str, float] | None = None) -> float:
    """Eq. 4 for one row, written the long way (w, U, PUD, s) as the readable reference."""
    g = gen_time_s
    w = max(0.0, now + g - reference_s)
    u = initial_utility if w <= ert_s else initial_utility - slope * (w - ert_s)
    pud = u / g
    s = reference_s + ert_s - (now + g)
    if slack_scaling == "none":
        return pud
    if slack_scaling == "max_slack_g":
        return pud / max(s, g) if pud >= 0 else pud / g
    if slack_scaling == "exp_decay":
        tau = get_slack_scaling("exp_decay").params(params)["tau"]
        return pud * math.exp(-max(s, 0.0) / tau) if pud >= 0 else pud
    raise KeyError(f"no scalar reference for slack scaling {slack_scaling!r}")
