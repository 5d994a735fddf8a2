"""The rate at which responses arrive, per class of task, measured from the admission passes.

`timelyllm-pred` prices a resume by what it does to the responses that arrive while it runs
(core/sched/decision.py, `IncomingResponses`), so it needs each class's arrival rate and the
size of its arrivals. A class is a TUF (ERT and slope) and a segment bound: the tasks that
share them are priced alike. Every task's first segment goes through the queue, so a pass sees
each arrival at least once; an arrival is counted the first time, at its arrival time, and
forgotten once it is `window_s` old (the rate is the count over the window, or over the time
observed so far when that is shorter).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np


class ArrivalRates:
    """Counts of recent first-segment arrivals per class (module docstring)."""

    def __init__(self, window_s: float):
        if not (window_s > 0 and math.isfinite(window_s)):
            raise ValueError(f"window_s: must be a finite number > 0, got {window_s!r}")
        self.window_s = float(window_s)
        self._recent: deque = deque()  # (arrival_s, class, prefill, context), oldest first
        self._count: dict[tuple, int] = {}
        self._prefill: dict[tuple, float] = {}
        self._context: dict[tuple, float] = {}
        self._latest_s = -math.inf  # newest arrival counted
        self._since_s: float | None = None  # first pass observed

    def observe(self, now: float, arrival_s: np.ndarray, ert_s: np.ndarray, slope: np.ndarray,
                bound_tokens: np.ndarray, prefill_tokens: np.ndarray,
                context_tokens: np.ndarray) -> None:
        """The queued first segments of one pass (parallel arrays). Arrivals come in time
        order, so the ones newer than any counted before are the new ones."""
        if self._since_s is None:
            self._since_s = now
        new = np.flatnonzero(arrival_s > self._latest_s)
        if len(new):
            order = new[np.argsort(arrival_s[new], kind="stable")]
            for i in order.tolist():
                key = (float(ert_s[i]), float(slope[i]), int(bound_tokens[i]))
                self._recent.append((float(arrival_s[i]), key, float(prefill_tokens[i]),
                                     float(context_tokens[i])))
                self._count[key] = self._count.get(key, 0) + 1
                self._prefill[key] = self._prefill.get(key, 0.0) + float(prefill_tokens[i])
                self._context[key] = self._context.get(key, 0.0) + float(context_tokens[i])
            self._latest_s = float(arrival_s[order[-1]])
        self._forget(now)

    def _forget(self, now: float) -> None:
        horizon = now - self.window_s
        while self._recent and self._recent[0][0] <= horizon:
            _, key, prefill, context = self._recent.popleft()
            self._count[key] -= 1
            self._prefill[key] -= prefill
            self._context[key] -= context
            if not self._count[key]:
                del self._count[key], self._prefill[key], self._context[key]

    def classes(self, now: float) -> list[tuple[tuple, float, float, float]]:
        """(class, arrivals per second, mean prefill tokens, mean context tokens) per class
        seen in the window; class = (ERT, slope, segment bound)."""
        if self._since_s is None:
            return []
        span = min(self.window_s, now - self._since_s)
        if not span > 0:
            return []
        return [(key, n / span, self._prefill[key] / n, self._context[key] / n)
                for key, n in self._count.items()]
