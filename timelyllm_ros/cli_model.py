"""`timelyllm model prepare`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if not argv or argv[0] != "prepare":
        print("usage: timelyllm model prepare [--output DIR] [--force]", file=sys.stderr)
        return 2
    from timelyllm_ros.model_prep import main as prepare_main

    return prepare_main(argv[1:])
