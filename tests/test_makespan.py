"""All-admit makespan and finish times against a token-by-token reference and the closed forms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import curves, make_curve
from tailsieve.model.curves import TpotCurve
from tailsieve.model.makespan import finish_times, lane_makespans, makespan


def token_by_token(lengths: list[int], curve: TpotCurve) -> tuple[float, list[float]]:
    """Reference: advance one decode iteration at a time."""
    remaining = list(lengths)
    done = [0.0] * len(lengths)
    t = 0.0
    while any(r > 0 for r in remaining):
        active = [i for i, r in enumerate(remaining) if r > 0]
        t += curve.tpot_s(len(active))
        for i in active:
            remaining[i] -= 1
            if remaining[i] == 0:
                done[i] = t
    return t, done


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=9), curves())
def test_matches_token_by_token(lengths: list[int], curve: TpotCurve) -> None:
    total, done = token_by_token(lengths, curve)
    assert makespan(lengths, curve) == pytest.approx(total, abs=1e-12)
    assert finish_times(lengths, curve) == pytest.approx(done, abs=1e-12)


def test_closed_form_hand_example() -> None:
    c = make_curve(batch=(1, 2, 3), tpot_ms=(1000.0, 1500.0, 2000.0))  # τ = 1, 1.5, 2 s
    # lengths 5, 3, 1: three active for 1 token (2 s), two for 2 tokens (3 s), one for 2 tokens (2 s)
    assert makespan([3, 5, 1], c) == pytest.approx(2 + 3 + 2)
    assert list(finish_times([3, 5, 1], c)) == pytest.approx([5.0, 7.0, 2.0])
    assert makespan([], c) == 0.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=12), st.integers(1, 4), curves())
def test_lane_makespans_equal_per_lane(lengths: list[int], n_lanes: int, curve: TpotCurve) -> None:
    rng = np.random.default_rng(len(lengths))
    lanes = rng.integers(0, n_lanes, size=len(lengths))
    got = lane_makespans(lengths, lanes, n_lanes, curve)
    arr = np.asarray(lengths)
    want = [makespan(arr[lanes == j], curve) for j in range(n_lanes)]
    assert got == pytest.approx(want, abs=1e-12)


def test_bad_lengths_rejected() -> None:
    c = make_curve()
    with pytest.raises(ValueError, match="non-negative and finite, got -1"):
        makespan([3, -1], c)
    with pytest.raises(ValueError, match="lane indices"):
        lane_makespans([1, 2], [0, 2], 2, c)
