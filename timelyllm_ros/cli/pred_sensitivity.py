"""Sensitivity of `timelyllm-pred` to its step model's two knobs (docs/batch-control.md).

    python -m timelyllm_ros.cli.pred_sensitivity [timelyllm bench options ...]

Registers one policy per knob setting, one knob moved at a time from the defaults
(`prior_steps` 50, `memory_steps` 2000), and runs `timelyllm bench` with them and the options
given, e.g. `--workload mixed-fleet-long --robots parallel --load-scale 0.25,1`.
"""

from __future__ import annotations

import sys

from timelyllm_ros.cli import bench as bench_cli
from timelyllm_ros.core.policies.predictive import PredictiveTimelyPolicy
from timelyllm_ros.core.policies.registry import PolicyDefinition, register_policy

PRIOR_STEPS = (1.0, 10.0, 250.0)
MEMORY_STEPS = (200.0, 20000.0)


def variants() -> dict[str, dict[str, float]]:
    out = {f"pred-prior{int(p)}": {"prior_steps": p} for p in PRIOR_STEPS}
    out.update({f"pred-memory{int(m)}": {"memory_steps": m} for m in MEMORY_STEPS})
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = []
    for name, params in variants().items():
        register_policy(name, PolicyDefinition(PredictiveTimelyPolicy, name=name, **params))
        names.append(name)
    policies = ",".join(["timelyllm-pred", *names])
    return bench_cli.main(["--policies", policies, *argv])


if __name__ == "__main__":
    sys.exit(main())
