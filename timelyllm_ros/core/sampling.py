"""Random draws shared by the workload generators (plain numpy, no knowledge of any workload)."""

from __future__ import annotations

import math

import numpy as np


def lognormal_by_mean_std(rng: np.random.Generator, mean: float, std: float,
                          size: int | tuple[int, ...] | None = None):
    """Lognormal draw(s) whose own mean and standard deviation are `mean` and `std`.

    Papers report token counts by their mean and std, while numpy's lognormal takes the mean and
    sigma of the underlying normal: sigma^2 = ln(1 + (std/mean)^2), mu = ln(mean) - sigma^2 / 2.
    Exactly one `rng.lognormal` call, so a generator seeded alike yields the same numbers as the
    per-workload copies this replaces. `size=None` returns a scalar, as `rng.lognormal` does.
    """
    sigma2 = math.log1p((std / mean) ** 2)
    return rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), size)
