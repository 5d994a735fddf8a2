"""`timelyllm model prepare`: the bundled GGUF model -> a Hugging Face directory vLLM loads
offline (timelyllm_ros/core/engine/model_prep.py does the work)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from timelyllm_ros.core.engine.model_prep import DEFAULT_MODEL_DIR, ModelPrepError, prepare_model

USAGE = "usage: timelyllm model prepare [--output DIR] [--force]"


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if not argv or argv[0] != "prepare":
        print(USAGE, file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="timelyllm model prepare")
    parser.add_argument("--output", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv[1:])
    try:
        prepare_model(args.output, force=args.force)
    except ModelPrepError as err:
        print(f"timelyllm model prepare: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
