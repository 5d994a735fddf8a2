"""The simulated bench gives exactly the numbers recorded in its golden records.

`tools/golden_bench.py` recorded `timelyllm bench --json` for a prefix of each workload of two
sets. `paper`: WID1-3 and each seed paper's workload, every policy of the paper's comparison,
with the code as it was before any module moved (commit aadaff6, the parent layout).
`planner`: the planner's default (`timelyllm-pred`), the previous default and the vLLM
baselines on issue 22's overload and the fleet with per-task contexts, on the default and a
KV-limited profile. The simulated engine runs in virtual time and is deterministic, so
behaviour kept means every figure equal, bit for bit. `make golden` checks the whole workloads
the same way (minutes).
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


QUICK = [(name, label, args) for name, chosen in sorted(golden.SETS.items())
         for label, args in chosen.runs["quick"]]


@pytest.mark.parametrize("golden_set,label,args", QUICK, ids=[f"{n}:{lab}" for n, lab, _ in QUICK])
def test_bench_numbers_equal_the_golden_record(golden_set, label, args):
    path = golden.golden_path("quick", golden_set)
    expected = json.loads(path.read_text(encoding="utf-8"))[label]
    actual = golden.run_bench(args, golden_set)
    diff = list(golden.differences(expected, actual))
    assert not diff, f"{len(diff)} figures differ, first: {diff[:5]}"
    # The comparison is not vacuous: every policy ran and produced utilities.
    policies = set(golden.SETS[golden_set].policies) - {"vllm", "vllm-stream"}
    assert set(actual["policies"]) >= policies
    assert all(actual["policies"][p]["overall"]["utility_mean"] == actual["policies"][p][
        "overall"]["utility_mean"] for p in policies)  # (not NaN)


def test_differences_finds_a_changed_figure():
    doc = {"policies": {"a": {"overall": {"utility_mean": 1.25}}}}
    changed = json.loads(json.dumps(doc))
    changed["policies"]["a"]["overall"]["utility_mean"] = 1.2500000001
    assert list(golden.differences(doc, changed)) == [
        "/policies/a/overall/utility_mean: 1.25 != 1.2500000001"]
    assert list(golden.differences(doc, doc)) == []
    assert golden.strip_wall_clock({"x": 1, "scheduling_overhead_ms": 2.0}) == {"x": 1}
