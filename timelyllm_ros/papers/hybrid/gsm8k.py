"""Seed 003's standalone reproduction: a stage-level simulator of a GSM8K-like batch on J client
slots under PD competition, over the paper's four configurations and every combination of the
three levels (docs/seeds-001-003.md). `python -m timelyllm_ros.papers.hybrid` prints the table.

Idle slot time - a slot with nothing to do, or whose request cannot be served by the stage that
is running - is the waste the paper attacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from timelyllm_ros.papers.hybrid.dispatch import SlotDispatcher
from timelyllm_ros.papers.hybrid.gate import PrefillDecodeGate
from timelyllm_ros.papers.hybrid.packing import (hybrid_lower_bound, makespan_lower_bound,
                                                 pack_min_makespan)
from timelyllm_ros.papers.hybrid.time_model import TimeModel


@dataclass(frozen=True)
class Workload:
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    predicted_output: np.ndarray

    def __len__(self) -> int:
        return int(self.prompt_tokens.shape[0])


# GSM8K on LLaMA-65B as reported by the paper: prompts 68.43 +- 25.04 tokens; outputs
# 344.83 +- 187.99 tokens with a 512-token cap.
GSM8K_PROMPT = (68.43, 25.04)
GSM8K_OUTPUT = (344.83, 187.99)
GSM8K_MAX_OUTPUT = 512


def gsm8k_like(n: int = 1319, seed: int = 0, prediction_sigma: float = 0.0) -> Workload:
    """A batch with GSM8K's reported moments.

    Prompts: normal(68.43, 25.04) rounded, at least 8 tokens. Outputs: the paper gives only mean
    and sd under a 512 cap; a Beta(a, b) on [0, 512] matched to both moments (a = 0.425,
    b = 0.206, U-shaped: many short answers and many runs into the cap, as a base model on
    GSM8K does) is our choice, rounded up to >= 1 token. Predicted outputs: exact, or times a
    lognormal(0, prediction_sigma) error, clipped to [1, 512].
    """
    rng = np.random.default_rng(seed)
    prompt = np.maximum(8, np.rint(rng.normal(*GSM8K_PROMPT, size=n))).astype(np.int64)
    m = GSM8K_OUTPUT[0] / GSM8K_MAX_OUTPUT
    v = (GSM8K_OUTPUT[1] / GSM8K_MAX_OUTPUT) ** 2
    k = m * (1 - m) / v - 1
    out = np.maximum(1, np.ceil(rng.beta(m * k, (1 - m) * k, size=n) * GSM8K_MAX_OUTPUT)).astype(np.int64)
    if prediction_sigma > 0:
        pred = np.clip(np.rint(out * rng.lognormal(0.0, prediction_sigma, size=n)), 1, GSM8K_MAX_OUTPUT)
    else:
        pred = out.astype(float)
    return Workload(prompt, out, pred.astype(np.int64))


@dataclass
class BatchReport:
    name: str
    total_s: float
    utilization: float
    tokens_per_s: float
    prefill_stages: int
    decode_rounds: int
    prefill_s: float
    decode_s: float


ListMode = Literal["shared", "round_robin", "packed"]


def simulate_batch(w: Workload, J: int = 200, *, lists: ListMode = "shared", online: bool = False,
                   gate: bool = False, gate_charge: Literal["marginal", "wall"] = "marginal",
                   tm: TimeModel = TimeModel(), name: str = "",
                   exact_max_vars: int = 4000) -> BatchReport:
    """Serve workload `w` on J slots under PD competition.

    lists: how requests reach slots -
        "shared": one FCFS queue that any idle slot takes from (vLLM's behaviour; this baseline
            reproduces the paper's 80.2% / 201 s closely, see the docs);
        "round_robin": static per-slot lists, request i to slot i mod J (J benchmark clients);
        "packed": static per-slot lists from the offline minimum-makespan packing of
            N_p + predicted N_d.
    online: Algorithm 1 - lists served longest first, and slots with an empty list steal
        (without it, static lists are served in dataset order and an empty slot idles; the shared
        queue is always taken from by any idle slot).
    gate: PrefillDecodeGate (otherwise prefill-first: prefill whenever a prompt waits).
    gate_charge: what a decode round adds to the gate's C_d - "marginal" (the paper's T^d per
        decoding sequence) or "wall" (the whole iteration, fixed 29 ms included).

    Utilization = sum over stages of (slots the stage serves x its duration) / (J x total time):
    a decoding slot is idle during a prefill stage, a slot with a waiting prompt is idle during a
    decode round, and an empty slot is idle throughout.
    """
    n = len(w)
    sizes = (w.prompt_tokens + w.predicted_output).astype(float)
    slot_lists: list[list[tuple[int, float]]] = [[] for _ in range(J)]
    if lists == "shared":
        # Parked on slot 0; every other slot "steals" from it, i.e. takes the queue's head.
        slot_lists[0] = [(i, float(sizes[i])) for i in range(n)]
        disp = SlotDispatcher(slot_lists, sort=online, steal=True)
    else:
        if lists == "packed":
            assignment = pack_min_makespan(sizes, J, exact_max_vars=exact_max_vars).assignment
        elif lists == "round_robin":
            assignment = np.arange(n) % J
        else:
            raise ValueError(f"unknown list mode {lists!r}")
        for i in range(n):
            slot_lists[int(assignment[i])].append((i, float(sizes[i])))
        disp = SlotDispatcher(slot_lists, sort=online, steal=online)
    g = PrefillDecodeGate(tm) if gate else None

    IDLE, WAIT, DECODE = 0, 1, 2
    phase = np.full(J, IDLE, np.int8)
    req = np.full(J, -1, np.int64)
    left = np.zeros(J, np.int64)
    free = list(range(J))
    t_ms = busy = prefill_ms = decode_ms = 0.0
    n_prefill = n_decode = 0
    while True:
        if free:
            still = []
            for j in sorted(free):
                d = disp.next_for(j)
                if d is None:
                    still.append(j)
                else:
                    phase[j] = WAIT
                    req[j] = d.rid
            free = still
        waiting = np.flatnonzero(phase == WAIT)
        decoding = np.flatnonzero(phase == DECODE)
        if waiting.size == 0 and decoding.size == 0:
            break
        if g is not None:
            action = g.decide(w.prompt_tokens[req[waiting]], int(decoding.size))
        else:
            action = "prefill" if waiting.size else "decode"
        if action == "prefill":
            dur = tm.prefill_ms(float(w.prompt_tokens[req[waiting]].sum()))
            busy += waiting.size * dur
            prefill_ms += dur
            n_prefill += 1
            phase[waiting] = DECODE
            left[waiting] = w.output_tokens[req[waiting]]
            if g is not None:
                g.note_prefill()
        else:
            dur = tm.decode_ms(int(decoding.size))
            busy += decoding.size * dur
            decode_ms += dur
            n_decode += 1
            left[decoding] -= 1
            finished = decoding[left[decoding] == 0]
            phase[finished] = IDLE
            req[finished] = -1
            free.extend(finished.tolist())
            if g is not None:
                if gate_charge == "wall":
                    g.note_decode(dur)
                else:
                    g.note_decode_round(int(decoding.size))
        t_ms += dur

    total_s = t_ms / 1000.0
    return BatchReport(
        name=name or _variant_name(lists, online, gate), total_s=total_s,
        utilization=busy / (J * t_ms) if t_ms > 0 else 0.0,
        tokens_per_s=float(w.output_tokens.sum()) / total_s if total_s > 0 else 0.0,
        prefill_stages=n_prefill, decode_rounds=n_decode,
        prefill_s=prefill_ms / 1000.0, decode_s=decode_ms / 1000.0)


def _variant_name(lists: str, online: bool, gate: bool) -> str:
    return "+".join([lists] + [p for p, on in (("online", online), ("gate", gate)) if on])


# The paper's four configurations as (lists, online request scheduling, gate). "online only"
# needs per-slot lists for Algorithm 1 and has no offline packing, so it starts from round robin.
PAPER_VARIANTS = (
    ("baseline", "shared", False, False),
    ("offline only", "packed", False, False),
    ("online only", "round_robin", True, True),
    ("hybrid", "packed", True, True),
)


def run_gsm8k(n: int = 1319, J: int = 200, seeds: Sequence[int] = (0,), prediction_sigma: float = 0.0,
              prefill_cap_tokens: int = 5000, tm: TimeModel = TimeModel(),
              gate_charge: Literal["marginal", "wall"] = "marginal") -> dict:
    """Every (lists, online, gate) combination per seed, plus T_LB per seed."""
    rows: dict[tuple[str, bool, bool], list[BatchReport]] = {}
    lbs = []
    for seed in seeds:
        w = gsm8k_like(n, seed=seed, prediction_sigma=prediction_sigma)
        for mode in ("shared", "round_robin", "packed"):
            for on in (False, True):
                for gt in (False, True):
                    rows.setdefault((mode, on, gt), []).append(
                        simulate_batch(w, J, lists=mode, online=on, gate=gt, tm=tm,
                                   gate_charge=gate_charge))
        # t_d*: every output token of a slot costs it one full-batch decode iteration, and
        # max(sum/J, max) is a proven bound on the best packing of those times.
        td = makespan_lower_bound(w.output_tokens * tm.decode_ms(J), J)
        lbs.append(hybrid_lower_bound(w.prompt_tokens, td, prefill_cap_tokens, tm))
    return {"rows": rows, "lower_bounds": lbs}
