"""The workload of BROS's reproduction: Poisson RT chat plus closed-loop BE batches.

`HybridWorkload` holds its parameters, `rt_arrivals` draws the RT requests, and `SimRequest` is
a request's state in the iteration-level simulator (`bros.reproduction`). The bench's BROS
workload (`bench.paper_workloads`) reuses `HybridWorkload`'s moments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from timelyllm_ros.core.sampling import lognormal_by_mean_std
from timelyllm_ros.papers.bros.requests import RT


@dataclass
class SimRequest:
    """One request's state in the reproduction's simulator."""

    rid: int
    kind: str
    arrival: float
    prompt: int
    output: int
    generated: int = 0
    resident: int = 0            # KV tokens on the device (plain KV) / placed (bidirectional)
    first_s: float = math.nan
    last_s: float = math.nan
    finish_s: float = math.nan
    late_gaps: int = 0           # inter-token gaps above TPOT
    gaps: int = 0
    recomputes: int = 0

    @property
    def done(self) -> bool:
        return self.generated >= self.output

    def context(self) -> int:
        return self.prompt + self.generated


@dataclass(frozen=True)
class HybridWorkload:
    """RT: Poisson arrivals with ShareGPT-like lengths (lognormal matched to the paper's Table 2
    means/stds, clipped). BE: closed-loop batches, prompt U(512,1024), output U(32,128); the next
    batch is submitted when the previous one has completed."""

    rt_rate: float = 2.0
    duration_s: float = 60.0
    be_batch: int = 64
    rt_prompt_mean: float = 222.76
    rt_prompt_std: float = 256.36
    rt_output_mean: float = 234.51
    rt_output_std: float = 268.50
    max_len: int = 2048
    seed: int = 0


def rt_arrivals(w: HybridWorkload) -> list[SimRequest]:
    """The RT requests of the whole run, in arrival order (the BE batches are drawn as they
    are submitted)."""
    rng = np.random.default_rng(w.seed)
    t = 0.0
    out = []
    while True:
        t += rng.exponential(1.0 / w.rt_rate)
        if t >= w.duration_s:
            break
        p = int(np.clip(lognormal_by_mean_std(rng, w.rt_prompt_mean, w.rt_prompt_std, 1)[0],
                        4, w.max_len))
        o = int(np.clip(lognormal_by_mean_std(rng, w.rt_output_mean, w.rt_output_std, 1)[0],
                        2, w.max_len))
        out.append(SimRequest(len(out), RT, t, p, o))
    return out
