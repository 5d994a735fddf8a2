"""The shape of the package is a checked contract (issue 10): every import arrow points down
(.importlinter, lazy imports inside functions included), `core` holds no paper, and no module
grows past 600 lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "timelyllm_ros"
MAX_LINES = 600
PAPERS = ("bros", "mcsf", "lamps", "hybrid")


def test_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    res = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    # lint-imports exits non-zero when any contract is broken, and lists the offending imports.
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout.replace(",", "") or "broken" not in res.stdout.lower()


def test_no_module_is_over_600_lines():
    sizes = {str(f.relative_to(PACKAGE)): sum(1 for _ in f.open(encoding="utf-8"))
             for f in PACKAGE.rglob("*.py")}
    assert sizes, "no modules found"
    big = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_core_holds_no_paper_code():
    core = PACKAGE / "core"
    named = [str(f.relative_to(PACKAGE)) for f in core.rglob("*.py")
             if any(p in f.stem for p in PAPERS)]
    assert not named, f"paper modules in core: {named}"
    # ... and no paper lives outside papers/ either (policies find them through entry points).
    assert {d.name for d in (PACKAGE / "papers").iterdir() if d.is_dir()} >= set(PAPERS)
