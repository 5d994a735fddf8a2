"""The prefill hold of the planner's default policy (`work_conserving.ResponseFirstAdmission`).

A step's prefill is shared by every sequence in it. Tasks that arrive together, each with its
own context (a scene, the robot's recent history), are prefilled in the same steps, and an
urgent one gets its first segment only after every prompt of the group: on mixed-fleet-long,
urgent drones took 371 ms on average at the lightest load under every policy, against about
150 ms alone (docs/bench.md, "The prefill hold"). So a queued response is held, for a pass,
while a running response still on its first segment needs the time its prefill would take:

- only if its prefill is at least `hold_share` of that response's remaining slack: a smaller
  one is within the error of the estimates below, and holding for it only delays the held one
  (on WID1, without per-task context, it raised p99 response times at every load);
- **due earlier:** held if it can wait until that deadline and still make its own deadline
  alone;
- **due earlier or at the same time:** held if that response would make its deadline without
  this prefill and miss it with it (the prefill admitted earlier in the same pass counted).

How long a response still needs is its first segment's remaining tokens at the measured step
time; first segments are measured per skill set (a drone's MiniSpec statement is 4 tokens, a
chat sentence dozens), from what the admission passes see of the running batch.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from timelyllm_ros.core.sched.interface import Candidate, RunningGen


class FirstSegmentLengths:
    """Tokens a first segment takes, per skill set: an exponential moving average of what the
    running batch shows. A generation seen on its first segment (segment index 0) and later on
    a later one, or no longer running (a generation pauses only at a boundary), had generated
    about as many tokens as it was last seen with: a slight underestimate when passes were
    skipped, which makes the hold protect a little more, never less."""

    def __init__(self, default_tokens: float = 8.0, smoothing: float = 0.2):
        if not (default_tokens >= 1 and math.isfinite(default_tokens)):
            raise ValueError(
                f"default_tokens: must be a finite number >= 1, got {default_tokens!r}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing: must be in (0, 1], got {smoothing!r}")
        self.default_tokens = float(default_tokens)
        self.smoothing = float(smoothing)
        self._mean: dict[str, float] = {}
        self._watching: dict[str, tuple[str, int]] = {}  # key -> (skill set, tokens so far)

    def observe(self, running: Sequence[RunningGen]) -> None:
        still: dict[str, tuple[str, int]] = {}
        for g in running:
            if g.segment_index == 0:
                still[g.key] = (g.skill_set, g.tokens_this_run)
        for key, (skill_set, tokens) in self._watching.items():
            if key not in still:
                self._record(skill_set, max(1, tokens))
        self._watching = still

    def _record(self, skill_set: str, tokens: int) -> None:
        mean = self._mean.get(skill_set)
        self._mean[skill_set] = float(tokens) if mean is None else (
            mean + self.smoothing * (tokens - mean))

    def tokens(self, skill_set: str) -> float:
        return self._mean.get(skill_set, self.default_tokens)


class PrefillHold:
    """Decides, per admission pass, which queued responses wait for a running one (module
    docstring). `prefill_cost_s(tokens)` prices a prefill (the engine's cost profile)."""

    def __init__(self, prefill_cost_s: Callable[[int], float], hold_share: float = 0.1,
                 lengths: FirstSegmentLengths | None = None):
        if not (0 <= hold_share and math.isfinite(hold_share)):
            raise ValueError(f"hold_share: must be a finite number >= 0, got {hold_share!r}")
        self.prefill_cost_s = prefill_cost_s
        self.hold_share = float(hold_share)
        self.lengths = lengths if lengths is not None else FirstSegmentLengths()
        self._now: float | None = None
        self._step_s: float | None = None
        self._pass_prefill_s = 0.0

    def begin_pass(self, now: float, step_s: float | None,
                   running: Sequence[RunningGen]) -> None:
        """`step_s`: the measured step time (None before any step: nothing is held)."""
        self._now = now
        self._step_s = step_s
        self._pass_prefill_s = 0.0
        self.lengths.observe(running)

    def note_admitted(self, candidate: Candidate) -> None:
        """`candidate` was admitted in this pass: its prefill shares the coming steps."""
        self._pass_prefill_s += self.prefill_cost_s(candidate.prefill_tokens)

    def response_to_protect(self, batch: Sequence[RunningGen],
                            candidate: Candidate) -> RunningGen | None:
        """The running response `candidate` (a response) must wait for, or None."""
        now, step = self._now, self._step_s
        if now is None or step is None:
            return None
        prefill = self.prefill_cost_s(candidate.prefill_tokens)
        alone = prefill + self.lengths.tokens(candidate.skill_set) * step
        own_slack = candidate.deadline_s - now
        for g in batch:
            if g.segment_index != 0 or not now < g.deadline_s <= candidate.deadline_s:
                continue
            slack = g.deadline_s - now
            if prefill < self.hold_share * slack:
                continue  # within the error of the estimates below: not what makes it late
            if g.deadline_s < candidate.deadline_s and own_slack > slack + alone:
                return g
            left = max(1.0, self.lengths.tokens(g.skill_set) - g.tokens_this_run) * step
            finish = now + self._pass_prefill_s + left
            if finish <= g.deadline_s < finish + prefill:
                return g
        return None
