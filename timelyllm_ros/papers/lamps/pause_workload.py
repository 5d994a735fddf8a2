"""The workloads of LAMPS's API-serving reproduction: requests whose segments each end in a pause
(an API call, or a robot executing the segment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from timelyllm_ros.core.engine.base import DISCARD, PRESERVE, SWAP
from timelyllm_ros.core.sampling import lognormal_by_mean_std


# LAMPS Table 2 (from INFERCEPT): API duration (mean, std) seconds and calls per request (mean,
# std). Token counts are not in the paper; the workload below assumes them.
INFERCEPT_APIS: Mapping[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "math": ((9e-5, 6e-5), (3.75, 1.3)),
    "qa": ((0.69, 0.17), (2.52, 1.73)),
    "ve": ((0.09, 0.014), (28.18, 15.2)),
    "chatbot": ((28.6, 15.6), (4.45, 1.96)),
    "image": ((20.03, 7.8), (6.91, 3.93)),
    "tts": ((17.24, 7.6), (6.91, 3.93)),
}


@dataclass
class PauseSegment:
    """Tokens generated in one go, and the pause that follows them."""

    tokens: int
    pause_s: float            # actual pause after this segment (nan for the last)
    pred_pause_s: float       # what the scheduler predicts
    response: int             # tokens the pause returns into the context


@dataclass
class PausingRequest:
    """One request of the workload, and its state in the simulator (`api_serving`)."""

    rid: int
    arrival: float
    prompt: int
    segs: list[PauseSegment]
    seg: int = 0
    gen_in_seg: int = 0
    context: int = 0          # tokens in the logical context
    kv: int = 0               # tokens resident on the device
    host: int = 0             # tokens swapped to host
    paused_until: float = math.nan
    handling: str = ""        # handling of the current segment's pause
    first_s: float = math.nan
    finish_s: float = math.nan
    counts: dict = field(default_factory=lambda: {PRESERVE: 0, SWAP: 0, DISCARD: 0})

    @property
    def done(self) -> bool:
        return not math.isnan(self.finish_s)

    @property
    def is_last(self) -> bool:
        return self.seg == len(self.segs) - 1


@dataclass(frozen=True)
class PauseWorkload:
    """Poisson arrivals of requests whose segments each end in a pause.

    kind "infercept": API type uniform over INFERCEPT_APIS; calls and durations from its
        (mean, std) as truncated normals. Assumed (not in the paper): prompt U(100, 600),
        segment tokens lognormal(mean 40, std 30), response tokens U(5, 50).
    kind "robot": a planner prompt U(1500, 3000) (TimelyLLM's prompts are ~2.9k tokens), 3-8
        segments of lognormal(mean 40, std 20) tokens, execution pauses lognormal with median
        `robot_pause_median_s`, sigma 0.8, no returned tokens (feedback arrives with the next
        task, not the resume).
    The scheduler's predicted pause is the API type's mean (infercept) or the pause scaled by a
    lognormal error of sigma `pred_sigma` (robot), as the paper's per-type mean / this project's
    execution-time model would give.
    """

    kind: str = "infercept"
    rate: float = 2.0
    n_requests: int = 300
    robot_pause_median_s: float = 2.0
    pred_sigma: float = 0.2
    seed: int = 0


def make_requests(w: PauseWorkload) -> list[PausingRequest]:
    """The workload's requests in arrival order, drawn from one generator seeded with w.seed."""
    rng = np.random.default_rng(w.seed)
    out = []
    t = 0.0
    for i in range(w.n_requests):
        t += rng.exponential(1.0 / w.rate)
        segs: list[PauseSegment] = []
        if w.kind == "infercept":
            api = list(INFERCEPT_APIS)[int(rng.integers(len(INFERCEPT_APIS)))]
            (dm, ds), (cm, cs) = INFERCEPT_APIS[api]
            calls = int(np.clip(round(rng.normal(cm, cs)), 1, 40))
            prompt = int(rng.integers(100, 601))
            for _ in range(calls):
                tok = int(np.clip(lognormal_by_mean_std(rng, 40, 30), 2, 400))
                segs.append(PauseSegment(tok, max(float(rng.normal(dm, ds)), 1e-5), dm,
                                 int(rng.integers(5, 51))))
            answer = int(np.clip(lognormal_by_mean_std(rng, 40, 30), 2, 400))
            segs.append(PauseSegment(answer, math.nan, math.nan, 0))
        elif w.kind == "robot":
            prompt = int(rng.integers(1500, 3001))
            n = int(rng.integers(3, 9))
            for k in range(n):
                tok = int(np.clip(lognormal_by_mean_std(rng, 40, 20), 5, 200))
                if k == n - 1:
                    segs.append(PauseSegment(tok, math.nan, math.nan, 0))
                else:
                    p = float(w.robot_pause_median_s * rng.lognormal(0.0, 0.8))
                    segs.append(PauseSegment(tok, p, p * float(rng.lognormal(0.0, w.pred_sigma)), 0))
        else:
            raise ValueError(f"unknown workload kind {w.kind!r}")
        out.append(PausingRequest(i, t, prompt, segs, context=prompt))
    return out

