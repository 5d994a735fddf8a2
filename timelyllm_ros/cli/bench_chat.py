"""`timelyllm bench --chat-experiment`: the paper's Fig. 10 (bench/chat_experiment.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from timelyllm_ros.bench.chat_experiment import (DEFAULT_DURATION_S, DEFAULT_RATES,
                                                 format_chat_experiment, plot_chat_experiment,
                                                 run_chat_experiment)
from timelyllm_ros.bench.config import BenchConfig
from timelyllm_ros.bench.metrics import json_safe
from timelyllm_ros.bench.progress import ReplayProgress


def run(args: argparse.Namespace, config: BenchConfig) -> int:
    rates = args.chat_rates or list(DEFAULT_RATES)
    duration = args.duration_s if args.duration_s is not None else DEFAULT_DURATION_S
    seed = args.seed if args.seed is not None else 0
    print(f"chat experiment (Fig. 10): WritingPrompts-like stories at {rates} requests/s for "
          f"{duration:g} s, seed {seed}; reading at 300 words per minute", file=sys.stderr)
    def factory(label: str) -> ReplayProgress:
        return ReplayProgress(label, enabled=not args.no_progress)

    doc = run_chat_experiment(rates, duration, seed, config, progress_factory=factory)
    print(format_chat_experiment(doc))
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(json_safe(doc), indent=2) + "\n",
                                        encoding="utf-8")
        print(f"wrote {args.json_path}", file=sys.stderr)
    if args.plots:
        Path(args.plots).mkdir(parents=True, exist_ok=True)
        path = Path(args.plots) / "chat_experiment.png"
        plot_chat_experiment(doc, path)
        print(f"wrote {path}", file=sys.stderr)
    return 0
