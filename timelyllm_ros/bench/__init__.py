"""Benchmark: replay LRTrace workloads against scheduling policies and report the paper's metrics.

- `config`: `BenchConfig`, how a replay runs, with the paper's configuration as defaults.
- `workloads`: the events to replay (a workload preset or file, an event list); `paper_workloads`:
  each seed paper's own workload as a scenario.
- `policies`, `engines`, `prompts`: the policy with the run's overrides, the engine it runs on
  (`core.engine.factory`), skill-set prompts padded to the paper's length.
- `simulated_robots`: the robots of a replay, executing dispatched segments in order.
- `replay`: the discrete-event loop (`run_policy`), on the simulated engine (virtual time) or the
  real vLLM engine (wall-clock time); `sweep`: the batch-cap sweep (Fig. 8).
- `results`: each task's outcome and a run's; `metrics`, `paper_metrics`: the paper's metrics as
  JSON and a table; `plots`: the paper's figures; `compare`: every policy on every workload.
- `progress`: the progress bar of a replay.

`timelyllm bench` (cli/bench.py) is the command. Nothing here imports ROS; vLLM is imported only
when the real engine is asked for.
"""

from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.metrics import compute_metrics, format_table, results_json
from timelyllm_ros.bench.replay import run_policy
from timelyllm_ros.bench.results import RunResult, TaskResult, task_type

__all__ = [
    "BenchConfig",
    "RunResult",
    "TaskResult",
    "compute_metrics",
    "format_table",
    "results_json",
    "run_policy",
    "task_type",
]
