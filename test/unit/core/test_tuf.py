import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from timelyllm_ros.core.tuf import (MAX_ERT_S, MAX_INITIAL_UTILITY, MAX_SLOPE_PER_S, TUF, TufError,
                                    TufLevels, load_tuf_levels)

NORMAL = TUF(1.0, 2.0, 1.0)


def test_utility_flat_until_ert_then_linear():
    assert NORMAL.utility(0.0) == 1.0
    assert NORMAL.utility(1.0) == 1.0  # at ERT: still full utility
    assert NORMAL.utility(1.25) == pytest.approx(0.5)
    assert NORMAL.utility(1.5) == pytest.approx(0.0)


def test_utility_not_clipped_after_cutoff():
    assert NORMAL.utility(2.0) == pytest.approx(-1.0)
    assert NORMAL.utility(11.0) == pytest.approx(-19.0)


def test_utility_vectorised_matches_scalar():
    t = np.array([0.0, 0.5, 1.0, 1.2, 1.5, 3.0])
    got = NORMAL.utility(t)
    assert isinstance(got, np.ndarray)
    assert got == pytest.approx([NORMAL.utility(float(x)) for x in t])


def test_cutoff():
    assert NORMAL.cutoff_s == pytest.approx(1.5)
    assert TUF(0.2, 6.67, 2.0).cutoff_s == pytest.approx(0.2 + 2 / 6.67)
    assert NORMAL.utility(NORMAL.cutoff_s) == pytest.approx(0.0)


def test_for_suspended_drops_ert_keeps_k_and_u0():
    s = TUF(0.2, 6.67, 2.0).for_suspended()
    assert s == TUF(0.0, 6.67, 2.0)
    assert s.utility(0.0) == 2.0
    assert s.utility(0.1) == pytest.approx(2.0 - 0.667)


def test_frozen():
    with pytest.raises(Exception):
        NORMAL.ert_s = 3.0


@pytest.mark.parametrize("tuf,field", [
    (TUF(float("nan"), 2.0, 1.0), "ert_s"),
    (TUF(1.0, float("inf"), 1.0), "slope_per_s"),
    (TUF(1.0, 2.0, -1.0), "initial_utility"),
    (TUF(-0.1, 2.0, 1.0), "ert_s"),
    (TUF(1.0, 0.0, 1.0), "slope_per_s"),
    (TUF(1.0, -2.0, 1.0), "slope_per_s"),
    (TUF(MAX_ERT_S + 1, 2.0, 1.0), "ert_s"),
    (TUF(1.0, 2.0, MAX_INITIAL_UTILITY * 2), "initial_utility"),
    (TUF(1.0, MAX_SLOPE_PER_S * 2, 1.0), "slope_per_s"),
    (TUF(1.0, "2", 1.0), "slope_per_s"),
])
def test_validate_rejects(tuf, field):
    with pytest.raises(TufError) as info:
        tuf.validate()
    assert info.value.field == field
    assert isinstance(info.value, ValueError)


def test_validate_accepts_and_returns_self():
    assert NORMAL.validate() is NORMAL
    assert TUF(0.0, 1.0, 0.0).validate()  # zero ERT (suspended) and zero U0 are legal


@given(ert=st.floats(0, 100), k=st.floats(0.01, 100), u0=st.floats(0, 100),
       t1=st.floats(0, 1000), t2=st.floats(0, 1000))
def test_utility_non_increasing(ert, k, u0, t1, t2):
    tuf = TUF(ert, k, u0)
    lo, hi = sorted((t1, t2))
    assert tuf.utility(lo) >= tuf.utility(hi) - 1e-9 * max(1.0, abs(tuf.utility(hi)))


def test_levels_from_config():
    levels = load_tuf_levels()
    assert levels.get("normal") == TUF(1.0, 2.0, 1.0)
    assert levels.get("urgent") == TUF(0.2, 6.67, 2.0)
    assert levels.get("urgent").cutoff_s == pytest.approx(0.5, abs=1e-3)
    assert levels.get("chat") == levels.get("normal")
    assert {"normal", "urgent", "chat"} <= set(levels.names())


def test_levels_unknown_lists_known():
    levels = load_tuf_levels()
    with pytest.raises(KeyError) as info:
        levels.get("critical")
    assert "normal" in str(info.value) and "urgent" in str(info.value)


def test_levels_invalid_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("levels:\n  fast: {ert_s: 0.1, initial_utility: 1, slope_per_s: 0}\n")
    with pytest.raises(TufError) as info:
        load_tuf_levels(p)
    assert info.value.field == "slope_per_s"
    assert "bad.yaml" in str(info.value) and "fast" in str(info.value)
    p.write_text("levels:\n  fast: {ert_s: 0.1, initial_utility: 1}\n")
    with pytest.raises(TufError, match="slope_per_s"):
        load_tuf_levels(p)
    p.write_text("nothing: 1\n")
    with pytest.raises(ValueError, match="levels"):
        load_tuf_levels(p)


def test_levels_in_memory():
    lv = TufLevels.from_mapping({"levels": {"x": {"ert_s": 1, "initial_utility": 1, "slope_per_s": 1}}})
    assert "x" in lv and len(lv) == 1 and math.isclose(lv["x"].cutoff_s, 2.0)
