"""The batch a decision predicts (core/sched/decision.py): every member's steps to its segment
end and TUF as the admission walk grows it, when each finishes, and what a sequence added to it
costs the responses expected to arrive. The arithmetic is the decision module's docstring."""

from __future__ import annotations

import numpy as np

from timelyllm_ros.core.sched.decision_records import CandidateQueue, DecisionSnapshot


class PredictedBatch:
    """The batch as the walk grows it: every member's steps to its segment end and TUF."""

    def __init__(self, snap: DecisionSnapshot):
        r = snap.running
        c = snap.coefficients
        self.now = snap.now
        self.coef = c
        self.size = float(len(r))
        self.context = float(r.context_tokens.sum())
        self.prefill = 0.0  # admitted, not yet computed
        self.free_blocks = int(snap.free_kv_blocks)  # left after the walk's admissions
        self.free_slots = snap.free_slots
        # One chunk of prefill per step: what the budget leaves after the running decodes.
        self.chunk = float(max(1, snap.step_token_budget - len(r)))
        self.steps = r.remaining_tokens.astype(np.float64)
        self.deadline = r.deadline_s
        # Only utility differences are compared, so U0 cancels; k weighs lateness.
        self.slope = r.slope
        self.incoming = inc = snap.incoming
        # An arrival of each class: its prefill, KV, first-segment lengths and ERT, shaped
        # (class, length quantile, column) for `incoming_lateness`.
        self._arrival_prefill_s = (c.prefill_fixed_s
                                   + c.prefill_per_token_s * inc.prefill_tokens)[:, None, None]
        self._arrival_context = inc.context_tokens[:, None]
        self._arrival_lengths = inc.segment_tokens[:, :, None]
        self._arrival_ert = inc.ert_s[:, None, None]
        self._arrival_weight = inc.rate_per_s * inc.slope
        # The arrivals' lateness with the batch as it is, for the (size, context) it was for.
        self._without: tuple[tuple[float, float], np.ndarray] | None = None

    def step_s(self, size, context):
        c = self.coef
        return c.decode_fixed_s + c.decode_per_seq_s * size + c.decode_per_ctx_token_s * context

    def finish(self, steps, size, context, prefill):
        """Seconds from now until `steps` more steps have run (decision module docstring);
        numpy broadcasting over any of the arguments."""
        return self.finish_at(steps, self.step_s(size, context), prefill)

    def finish_at(self, steps, step_s, prefill):
        """`finish` with the decode step already known (`step_s(size, context)`)."""
        c = self.coef
        prefill_steps = np.ceil(prefill / self.chunk)
        return (steps * step_s
                + c.prefill_per_token_s * np.minimum(prefill, steps * self.chunk)
                + c.prefill_fixed_s * np.minimum(steps, prefill_steps))

    def lateness(self, t, deadline):
        return np.maximum(self.now + t - deadline, 0.0)

    def own_steps(self, prefill_through, segment_tokens):
        """Steps to an admitted candidate's segment end, `prefill_through` the prefill admitted
        up to and including its own: its first token comes with its last prefill chunk."""
        return np.maximum(1.0, np.ceil(prefill_through / self.chunk) + segment_tokens - 1)

    def add(self, cand: CandidateQueue, admitted: np.ndarray) -> None:
        """Admit the candidates at positions `admitted`, in walk order."""
        prefill = self.prefill + np.cumsum(cand.prefill_tokens[admitted])
        self.steps = np.concatenate((self.steps,
                                     self.own_steps(prefill, cand.segment_tokens[admitted])))
        self.deadline = np.concatenate((self.deadline, cand.deadline_s[admitted]))
        self.slope = np.concatenate((self.slope, cand.slope[admitted]))
        self.size += len(admitted)
        self.context += float(cand.context_tokens[admitted].sum())
        self.prefill = float(prefill[-1])

    def incoming_lateness(self, size: np.ndarray, context: np.ndarray) -> np.ndarray:
        """Each incoming class's expected lateness (rows) if it arrived now and joined a batch
        of `size` sequences holding `context` tokens (columns: one per size/context pair). Its
        response is its prefill, then its first segment's steps; the lateness is averaged over
        the class's measured first-segment lengths (lateness is convex in the length, so the
        mean length would understate it)."""
        step = self.step_s(size[None, :] + 1.0, context[None, :] + self._arrival_context)
        response = self._arrival_prefill_s + self._arrival_lengths * step[:, None, :]
        late = np.maximum(response - self._arrival_ert, 0.0)
        return np.add.reduce(late, axis=1) / late.shape[1]  # the mean, without its overhead

    def incoming_cost(self, size, context, context_k: np.ndarray,
                      residency_s: np.ndarray) -> np.ndarray:
        """What adding each candidate (its KV `context_k`) to a batch of `size` sequences holding
        `context` tokens (scalars, or one per candidate) costs the responses expected to arrive
        while it runs: `rate * residency` arrivals of each class, each made later by the
        candidate's share of every step of its first segment, priced by its TUF (only the
        lateness it adds past its ERT)."""
        if np.ndim(size) == 0 and np.ndim(context) == 0:
            # The batch as it is (a pass with no admission before its candidates): the same
            # for every candidate of the pass, and for every pass until the walk admits.
            known = self._without
            if known is None or known[0] != (size, context):
                known = self._without = ((size, context), self.incoming_lateness(
                    np.array([size], dtype=np.float64), np.array([context], dtype=np.float64)))
            without = known[1]
        else:
            size, context = np.atleast_1d(size), np.atleast_1d(context)
            without = self.incoming_lateness(size, context)
        # (Broadcast against the candidates by the step's arithmetic.)
        with_k = self.incoming_lateness(np.atleast_1d(size + 1.0), context + context_k)
        per_second = self._arrival_weight @ (with_k - without)
        return per_second * residency_s
