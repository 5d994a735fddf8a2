"""What one batch decision costs (core/sched/decision.py), against the engine step it precedes.

    python -m timelyllm_ros.bench.decision_cost [--profile config/engine_profiles/P.yaml]

For a grid of running batches and queue lengths it builds snapshots like an overloaded mixed
fleet's (first segments and resumes, urgent and normal TUFs, a third of the running responses
near or past their deadline, prompts of tens to thousands of tokens), times `decide` (median of
`--repeats` calls; wall clock on a shared machine: noise only adds; the CPU time beside it
leaves out the waits for a core), and prints it next to the step the profile predicts for that
batch and the ratio of the wall clock to it. No assertion: a benchmark.

The snapshots carry the responses expected to arrive (`INCOMING`, what `timelyllm-pred` measures
from a drone fleet's passes): they price every queued resume's admission and every running
resume's next segment. `--no-incoming` leaves them out.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from timelyllm_ros.core.engine.cost_model import EngineProfile
from timelyllm_ros.core.policies.predictive import PredictiveTimelyPolicy
from timelyllm_ros.core.sched.decision import (CandidateQueue, DecisionSnapshot,
                                               IncomingResponses, RunningSet, StepCoefficients,
                                               decide)

# How the default policy weighs a resume's lateness (its adapter multiplies the TUF slope).
DEFAULT_RESUME_WEIGHT = PredictiveTimelyPolicy.resume_weight
RUNNING = (8, 64, 256)
QUEUED = (10, 100, 1000, 5000)

# Arriving responses per class: urgent drone commands (ERT 0.2 s, k 10, ~30/s) and normal tasks
# (ERT 1 s, k 2, ~40/s), short prompts to compute beside a shared prefix, first segments of a
# few tokens (8 equally likely lengths, as `timelyllm-pred` passes its measured histogram).
INCOMING = IncomingResponses.build(
    rate_per_s=[30.0, 40.0], prefill_tokens=[20.0, 200.0], context_tokens=[420.0, 900.0],
    segment_tokens=[[2, 3, 3, 4, 4, 5, 6, 9], [2, 3, 3, 4, 4, 5, 6, 9]], ert_s=[0.2, 1.0],
    slope=[10.0, 2.0])


def snapshot(profile: EngineProfile, running: int, queued: int, seed: int = 0,
             free_slots: int | None = None,
             incoming: IncomingResponses = INCOMING,
             resume_weight: float = DEFAULT_RESUME_WEIGHT) -> DecisionSnapshot:
    """A synthetic overloaded snapshot; resumes are priced at their TUF slope times
    `resume_weight`, as `timelyllm-pred`'s adapter prices them (its default: 0)."""
    rng = np.random.default_rng(seed)
    now = 1000.0
    seg = np.where(rng.random(running) < 0.5, 0, rng.integers(1, 6, running))
    urgent = rng.random(running) < 0.3
    run = RunningSet.build(
        [f"r{i}" for i in range(running)], rng.integers(1, 30, running),
        rng.integers(300, 4000, running), now + rng.uniform(-0.2, 2.0, running),
        np.ones(running), np.where(urgent, 10.0, 1.0) * np.where(seg > 0, resume_weight, 1.0),
        seg, urgent)
    q_urgent = rng.random(queued) < 0.3
    q_seg = np.where(rng.random(queued) < 0.5, 0, 2)
    cand = CandidateQueue.build(
        [f"c{i}" for i in range(queued)], rng.integers(10, 3000, queued),
        np.full(queued, 10), np.full(queued, 10), rng.integers(300, 4000, queued),
        rng.integers(20, 260, queued), now + rng.uniform(-0.1, 5.0, queued), np.ones(queued),
        np.where(q_urgent, 10.0, 1.0) * np.where(q_seg > 0, resume_weight, 1.0), q_seg)
    blocks = profile.kv_total_blocks // 4
    return DecisionSnapshot(now, run, cand, blocks, free_slots, profile.max_num_batched_tokens,
                            StepCoefficients.from_profile(profile), profile.kv_block_size,
                            incoming)


def time_decision(snap: DecisionSnapshot, repeats: int) -> tuple[float, float]:
    """Median wall-clock and CPU seconds of `decide(snap)`: on a shared machine the wall clock
    also counts the time the process waited for a core, the CPU time does not."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        decide(snap)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default=None, help="engine profile YAML (default: built-in)")
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--no-incoming", action="store_true",
                   help="snapshots without arriving responses")
    p.add_argument("--resume-weight", type=float, default=DEFAULT_RESUME_WEIGHT,
                   help="resumes priced at their TUF slope times this, as timelyllm-pred's "
                        f"knob (default: the policy's, {DEFAULT_RESUME_WEIGHT:g})")
    args = p.parse_args(argv)
    profile = EngineProfile.from_yaml(args.profile) if args.profile else EngineProfile()
    incoming = IncomingResponses.empty() if args.no_incoming else INCOMING
    print(f"profile {profile.name}; decide() median of {args.repeats} calls; "
          f"{len(incoming)} incoming classes; resume weight {args.resume_weight:g}")
    print(f"{'running':>7} {'queued':>7} {'admitted':>8} {'yields':>6} {'decide ms':>9} "
          f"{'cpu ms':>7} {'step ms':>8} {'ratio':>6}")
    for running in RUNNING:
        mean_ctx = 2150 * running
        step = profile.decode_step_s(running, mean_ctx)
        for queued in QUEUED:
            snap = snapshot(profile, running, queued, free_slots=max(0, 256 - running),
                            incoming=incoming, resume_weight=args.resume_weight)
            d = decide(snap)
            t, cpu = time_decision(snap, args.repeats)
            print(f"{running:>7} {queued:>7} {len(d.admit):>8} {len(d.yields):>6} "
                  f"{t * 1e3:>9.3f} {cpu * 1e3:>7.3f} {step * 1e3:>8.2f} {t / step:>6.3f}")


if __name__ == "__main__":
    main()
