"""Tail-strength transform (App. A.5): order, lower half, median and P90/P50 = r under numpy's percentiles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tailsieve.errors import ConfigError
from tailsieve.model.tailstrength import (
    STRONG_TAIL_RATIO,
    WEAK_TAIL_RATIO,
    tail_scale,
    tail_stats,
    tail_transform,
)
from tailsieve.workloads.traces import load_trace

lengths_st = st.lists(st.integers(0, 20_000), min_size=3, max_size=60)
ratios = st.floats(1.05, 12.0, allow_nan=False)


def feasible(arr: np.ndarray, r: float) -> bool:
    s = tail_stats(arr)
    return s.p90 > s.anchor and r * s.median > s.anchor


@settings(max_examples=200, deadline=None)
@given(lengths_st, ratios)
def test_properties_hold_exactly(lengths: list[int], r: float) -> None:
    arr = np.asarray(lengths, dtype=np.float64)
    assume(feasible(arr, r))
    out = tail_transform(arr, r)
    m = np.median(arr)
    # order preserved (strictly where it was strict, ties stay ties)
    order = np.argsort(arr, kind="stable")
    assert np.all(np.diff(out[order]) >= 0)
    assert np.array_equal(np.sign(np.diff(out[order])), np.sign(np.diff(arr[order])))
    # lower half and median unchanged
    assert np.array_equal(out[arr <= m], arr[arr <= m])
    assert np.median(out) == m
    # P90 maps to rM, so P90/P50 = r
    assert np.percentile(out, 90) == pytest.approx(r * m, rel=1e-12)
    assert np.percentile(out, 90) / np.median(out) == pytest.approx(r, rel=1e-12)


def test_bundled_trace_even_count_distinct_middles() -> None:
    arr = load_trace(None).length
    assert arr.size % 2 == 0  # the case where the paper's M-anchored map moves the median
    stats = tail_stats(arr)
    assert stats.anchor > stats.median
    for r in (WEAK_TAIL_RATIO, 3.0, STRONG_TAIL_RATIO):
        out = tail_transform(arr, r)
        assert np.median(out) == np.median(arr)
        assert np.percentile(out, 90) / np.median(out) == pytest.approx(r, rel=1e-12)
        assert np.array_equal(np.argsort(out, kind="stable"), np.argsort(arr, kind="stable"))


def test_odd_count_is_the_paper_formula() -> None:
    arr = np.array([100.0, 200, 300, 400, 500, 900, 1000, 1200, 5000])
    m, p90 = np.median(arr), np.percentile(arr, 90)
    s_r = (3 * m - m) / (p90 - m)
    want = np.where(arr <= m, arr, m + s_r * (arr - m))
    assert tail_scale(m, p90, 3) == pytest.approx(s_r)
    assert tail_transform(arr, 3) == pytest.approx(want, rel=1e-14)


def test_hand_example_even_count() -> None:
    # median 2.5, anchor 3, P90 = 3.7; s = (3·2.5 − 3)/(3.7 − 3) = 45/7
    out = tail_transform([1, 2, 3, 4], 3)
    assert out == pytest.approx([1, 2, 3, 3 + 45 / 7])
    assert np.median(out) == 2.5
    assert np.percentile(out, 90) == pytest.approx(7.5)


def test_reference_statistics_reused() -> None:
    ref = np.arange(1, 102, dtype=np.float64)  # M = 51, P90 = 91
    out = tail_transform([10, 51, 91, 101], 2, reference=ref)
    assert out == pytest.approx([10, 51, 102, 102 + 51 / 40 * 10])
    assert tail_transform([10, 51, 91, 101], 2, reference=tail_stats(ref)) == pytest.approx(out)


def test_compression_keeps_order_and_lower_half() -> None:
    arr = np.array([1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144], dtype=np.float64)  # P90/P50 = 89/13 ≈ 6.8
    out = tail_transform(arr, WEAK_TAIL_RATIO)
    assert np.all(np.diff(out) > 0)
    assert out[:6] == pytest.approx(arr[:6])
    assert np.percentile(out, 90) == pytest.approx(1.5 * 13)


@pytest.mark.parametrize("r", [1.0, 0.5, -2.0, float("nan"), float("inf")])
def test_bad_ratio(r: float) -> None:
    with pytest.raises(ConfigError, match=r"tail ratio r must be a finite number > 1, got"):
        tail_transform([1, 2, 3, 10, 20], r)


def test_p90_not_above_median() -> None:
    with pytest.raises(ConfigError, match=r"needs P90 > P50, got P50=5 and P90=5"):
        tail_transform([1, 5, 5, 5, 5, 5], 2)
    with pytest.raises(ConfigError, match=r"needs P90 > P50, got P50=7 and P90=3"):
        tail_scale(7, 3, 2)


def test_infeasible_anchor_and_bad_input() -> None:
    with pytest.raises(ConfigError, match=r"P90 above the upper middle length 4, got P90=3.7"):
        tail_transform([1, 2], 3, reference=[1, 4])
    with pytest.raises(ConfigError, match=r"r=1.1 too small"):
        tail_transform([0, 0, 10, 20, 30, 40], 1.1)
    with pytest.raises(ConfigError, match="non-empty one-dimensional"):
        tail_transform([], 2)
    with pytest.raises(ConfigError, match="non-negative finite"):
        tail_transform([1, -1, 3], 2)


def test_explicit_median_and_p90_use_the_paper_map() -> None:
    # App. A.5 with M = 1160, P90 = 4115 given (Table A.3): s_r = (rM − M)/(P90 − M)
    x = np.array([500.0, 1160, 2000, 4115, 11800])
    for r in (WEAK_TAIL_RATIO, STRONG_TAIL_RATIO):
        s_r = (r * 1160 - 1160) / (4115 - 1160)
        out = tail_transform(x, r, median=1160, p90=4115)
        assert out == pytest.approx(np.where(x <= 1160, x, 1160 + s_r * (x - 1160)))
        assert out[3] == pytest.approx(r * 1160)
