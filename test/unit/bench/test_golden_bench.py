"""The simulated bench gives exactly the numbers recorded before the redesign (issue 10).

`tools/golden_bench.py` recorded `timelyllm bench --json` for a prefix of WID1-3 and of each seed
paper's workload, every policy of the comparison, with the code as it was before any module
moved (commit aadaff6, the parent layout). The simulated engine
runs in virtual time and is deterministic, so behaviour kept means every figure equal, bit for
bit. `make golden` checks the whole workloads the same way (minutes).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[3] / "tools" / "golden_bench.py"


def _tool():
    spec = importlib.util.spec_from_file_location("golden_bench", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


golden = _tool()


@pytest.mark.parametrize("label,args", golden.RUNS["quick"], ids=[r[0] for r in golden.RUNS["quick"]])
def test_bench_numbers_equal_the_golden_record(label, args):
    expected = json.loads(golden.golden_path("quick").read_text(encoding="utf-8"))[label]
    actual = golden.run_bench(args)
    diff = list(golden.differences(expected, actual))
    assert not diff, f"{len(diff)} figures differ, first: {diff[:5]}"
    # The comparison is not vacuous: every policy ran and produced utilities.
    assert set(actual["policies"]) >= set(golden.POLICIES) - {"vllm", "vllm-stream"}


def test_differences_finds_a_changed_figure():
    doc = {"policies": {"a": {"overall": {"utility_mean": 1.25}}}}
    changed = json.loads(json.dumps(doc))
    changed["policies"]["a"]["overall"]["utility_mean"] = 1.2500000001
    assert list(golden.differences(doc, changed)) == [
        "/policies/a/overall/utility_mean: 1.25 != 1.2500000001"]
    assert list(golden.differences(doc, doc)) == []
    assert golden.strip_wall_clock({"x": 1, "scheduling_overhead_ms": 2.0}) == {"x": 1}
