"""Benchmark: replay LRTrace workloads against scheduling policies and report the paper's metrics.

- `harness`: discrete-event replay of composed events with simulated robots, on the simulated
  engine (virtual time) or the real vLLM engine (wall-clock time).
- `metrics`: utility / response / waiting time per task type and overall, as JSON and a table.
- `plots`: the paper's figures (Fig. 5, 6, 8 and the algorithm comparison) with matplotlib.
- `cli`: `timelyllm bench ...`.

Nothing here imports ROS; vLLM is imported only when the real engine is asked for.
"""

from timelyllm_ros.bench.harness import BenchConfig, RunResult, TaskResult, run_policy, task_type
from timelyllm_ros.bench.metrics import compute_metrics, format_table, results_json

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
