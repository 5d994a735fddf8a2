"""The seed papers' scheduling policies on the segment scheduler (docs/policies.md).

Each policy is a `Policy` that drives the same `SegmentScheduler` code path as TimelyLLM, on the
simulated and the real engine, through the scheduler's extension points (queue size columns,
`make_admission`, `make_gate`, `pause_handling`, `on_admitted` / `on_step` / `on_task_end`). The
algorithms themselves are the ones in each paper's own modules (beside its reproduction); these modules only
map the robot-fleet queue onto them, one module per paper:

- `mcsf` (001): shortest first by the output bound of the next run (`bound_tokens`, the segment's
  max_tokens), ties by arrival; admission by MC-SF's look-ahead KV check at every completion time
  of the batch (`mcsf.McsfAdmission`, whole blocks). `mcsf-utility`: our weighted variant,
  order by U0 * k / o (Smith's rule with the TUF's initial utility times slope as the weight).
- `bros` (002): urgent segments and segments with little slack are real-time (RT), the rest
  best-effort (BE) (`bros.classify_robot_work`); RT by slack ascending, BE behind in arrival
  order; each admission pass runs BROS's selection (`bros.BrosScheduler`: Tres check,
  BE packing, TCP-like adaptive batch size) over the running batch and the queue and admits the
  queued generations it selects.
- `hybrid` (003): Algorithm 1's order (longest N_p + N_d first) and the Lagrangian
  prefill/decode gate (`hybrid.PrefillDecodeGate`) in front of every admission pass;
  `hybrid-nogate` is the order alone.
- `lamps` (004): memory-over-time ranking (`lamps.memory_time_score`, refreshed every k
  passes) with starvation promotion (`lamps.LampsQueue`, threshold 100), and per-pause
  preserve / discard / swap by least waste (`lamps.handling_for_pause`). Running segments
  are never preempted for rank (the `lamps-np` reading, see docs/seeds-002-004.md).
- Combinations with TimelyLLM's priorities: `timelyllm-mcsf` (plus MC-SF's look-ahead, next to
  the latency-guided admission), `timelyllm-bros` (BROS's selection as admission) and
  `timelyllm-lamps` (plus LAMPS's pause handling).

Each paper is a package: its algorithm, its policy adapter, its engine variant (where it has one)
and its reproduction. The policies are registered as entry points (setup.py, group
`timelyllm_ros.policies`), so a paper is imported only when one of its policies is asked for.
"""
