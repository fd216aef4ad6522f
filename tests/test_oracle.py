"""Two-lane oracle and top-k isolation against brute force over every assignment (§2.1, §2.2, App. A.4)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tailsieve.model.oracle as oracle_mod
from conftest import curves, make_curve
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve
from tailsieve.model.makespan import lane_makespans, makespan, marginal_tpot
from tailsieve.model.oracle import (
    OracleBudgetError,
    alternate_lanes,
    best_topk,
    topk_curve,
    topk_lanes,
    topk_makespans,
    two_lane_oracle,
)
from tailsieve.workloads.traces import load_trace

lengths_st = st.lists(st.integers(0, 40), max_size=12)  # small range: many ties and zeros


def brute_force(lengths: list[int], curve: TpotCurve) -> float:
    """min over all 2^n assignments of max(T_0, T_1), every lane time from Σ_j L_j dτ(j) on its sorted lengths."""
    n = len(lengths)
    if n == 0:
        return 0.0
    desc = np.sort(np.asarray(lengths, dtype=np.float64))[::-1]
    d = marginal_tpot(curve, n)
    bits = np.array(list(itertools.product((0, 1), repeat=n)), dtype=np.int64)
    lanes = []
    for member in (bits, 1 - bits):
        rank = np.cumsum(member, axis=1) * member  # 1-based rank within the lane, 0 when not in it
        lanes.append((member * desc * d[rank]).sum(axis=1))
    return float(np.maximum(lanes[0], lanes[1]).min())


def check_result(lengths: list[int], curve: TpotCurve, **kwargs: int | None) -> None:
    res = two_lane_oracle(lengths, curve, **kwargs)
    n = len(lengths)
    assert res.makespan == pytest.approx(brute_force(lengths, curve), abs=1e-9)
    assert res.lane.dtype == np.int8 and res.lane.shape == (n,)
    assert set(res.lane.tolist()) <= {0, 1}
    if n:
        assert float(lane_makespans(lengths, res.lane, 2, curve).max()) == pytest.approx(res.makespan, abs=1e-9)
        ones = int(res.lane.sum())
        assert ones <= n - ones  # lane 1 holds fewer requests ...
        if ones == n - ones:  # ... and on equal counts the (first) longest request
            assert res.lane[int(np.argmax(lengths))] == 1
        assert res.states > 0
    assert res.makespan <= res.topk
    assert res.topk == pytest.approx(float(topk_makespans(lengths, curve)[res.best_k]), abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(lengths_st, curves())
def test_oracle_equals_brute_force(lengths: list[int], curve: TpotCurve) -> None:
    check_result(lengths, curve)


@pytest.mark.parametrize("name", ["h100-llama3-8b", "h100-llama2-70b-tp8", "cpu-vllm-tiny"])
def test_twelve_requests_equal_brute_force(name: str) -> None:
    curve = load_curve(name)  # the last two curves dip somewhere (non-monotone τ)
    rng = np.random.default_rng(7)
    for _ in range(6):
        lengths = rng.integers(0, 3000, size=12).tolist()
        lengths[:3] = [rng.integers(5000, 9000)] * 3  # a tied tail
        check_result(lengths, curve)


@settings(max_examples=60, deadline=None)
@given(lengths_st, curves(), st.sampled_from([None, 1, 3]))
def test_exact_pass_and_count_split_equal_brute_force(lengths: list[int], curve: TpotCurve, beam: int | None) -> None:
    check_result(lengths, curve, beam=beam)  # without beam / with a beam that truncates
    with pytest.MonkeyPatch.context() as mp:  # force the search split by final lane count
        mp.setattr(oracle_mod, "_ONE_PASS_STATES", 0)
        check_result(lengths, curve, beam=beam or 1)


@settings(max_examples=100, deadline=None)
@given(lengths_st, curves())
def test_topk_per_k_matches_direct_makespans(lengths: list[int], curve: TpotCurve) -> None:
    tk = topk_curve(lengths, curve)
    n = len(lengths)
    assert tk.tail_s.shape == tk.bulk_s.shape == (n + 1,)
    for k in range(n + 1):
        lane = topk_lanes(lengths, k)
        arr = np.asarray(lengths)
        assert tk.tail_s[k] == pytest.approx(makespan(arr[lane == 1], curve), abs=1e-9)
        assert tk.bulk_s[k] == pytest.approx(makespan(arr[lane == 0], curve), abs=1e-9)
    assert np.array_equal(tk.makespan_s, np.maximum(tk.tail_s, tk.bulk_s))
    best = best_topk(lengths, curve)
    assert best.makespan == pytest.approx(float(tk.makespan_s.min()))
    assert best.k == int(np.argmin(tk.makespan_s))
    assert best.makespan >= brute_force(lengths, curve) - 1e-9


def test_topk_fft_path_agrees_with_direct_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    lengths = np.random.default_rng(3).integers(0, 5000, size=300)
    curve = make_curve()
    direct = topk_curve(lengths, curve)
    monkeypatch.setattr(oracle_mod, "_DIRECT_CORRELATE_MAX", 0)
    fft = topk_curve(lengths, curve)
    assert fft.bulk_s == pytest.approx(direct.bulk_s, rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=10), st.integers(0, 40), st.integers(0, 6),
       curves(monotone=False))
def test_abel_bound_on_future_lane_time(placed: list[int], nxt: int, more: int, curve: TpotCurve) -> None:
    """final ≥ T − τ(c)·ℓ_next when every later request is ≤ ℓ_next, even where τ dips (docs/oracle.md)."""
    placed = sorted(placed, reverse=True)
    nxt = min(nxt, placed[-1])
    later = [nxt] * (1 if more else 0) + [max(0, nxt - j) for j in range(1, more)]
    c = len(placed)
    assert makespan(placed + later, curve) >= makespan(placed, curve) - curve.tpot_s(c) * nxt - 1e-9


def test_hand_example_tail_isolation() -> None:
    curve = make_curve(batch=(1, 2, 3, 4), tpot_ms=(1000.0, 1100.0, 1200.0, 1300.0))
    lengths = [100, 10, 10, 10, 10]
    res = two_lane_oracle(lengths, curve)
    assert res.lane.tolist() == [1, 0, 0, 0, 0]  # the long request alone, the rest batched
    assert res.makespan == pytest.approx(100.0)
    assert res.best_k == 1 and res.topk == pytest.approx(100.0)


def test_empty_and_single() -> None:
    curve = make_curve()
    empty = two_lane_oracle([], curve)
    assert empty.makespan == 0.0 and empty.lane.size == 0 and empty.states == 0
    one = two_lane_oracle([7], curve)
    assert one.lane.tolist() == [0] and one.makespan == pytest.approx(7 * curve.tpot_s(1))


def test_trace_group_and_baselines() -> None:
    lengths = np.random.default_rng(0).choice(load_trace().length, size=60, replace=False)
    curve = make_curve()
    res = two_lane_oracle(lengths, curve)
    uniform = float(lane_makespans(lengths, alternate_lanes(lengths.size), 2, curve).max())
    assert res.makespan <= res.topk <= uniform
    assert res.states > 0
    assert int(res.lane.sum()) < lengths.size // 2  # tail isolation: the optimum's lane 1 is the small lane


def hard_group() -> np.ndarray:
    """80 trace requests whose optimum beats best-k (0.43%) and needs ~10^5 DP states on h100-llama3-8b."""
    return np.random.default_rng(5).choice(load_trace().length, size=80, replace=False)


def test_one_pass_and_count_split_agree_on_a_hard_group(monkeypatch: pytest.MonkeyPatch) -> None:
    curve = load_curve("h100-llama3-8b")
    split = two_lane_oracle(hard_group(), curve)
    assert split.makespan < split.topk * (1 - 1e-3)
    monkeypatch.setattr(oracle_mod, "_ONE_PASS_STATES", 10**9)
    one = two_lane_oracle(hard_group(), curve)
    assert one.makespan == pytest.approx(split.makespan, rel=1e-12)


def test_budget_errors_are_one_line_with_bounds() -> None:
    curve = load_curve("h100-llama3-8b")
    with pytest.raises(OracleBudgetError, match="state budget 1,000 exhausted") as info:
        two_lane_oracle(hard_group(), curve, max_states=1000)
    assert "\n" not in str(info.value)
    assert 0 < info.value.lower <= info.value.upper
    with pytest.raises(OracleBudgetError, match="time budget exhausted"):
        two_lane_oracle(hard_group(), curve, max_seconds=1e-9)


def test_bad_lengths_rejected() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        two_lane_oracle([3, -1], make_curve())


def test_progress_reports_every_request_of_every_search_and_changes_nothing() -> None:
    lengths = np.random.default_rng(5).choice(load_trace().length, size=80, replace=False)
    curve = load_curve("h100-llama3-8b")
    seen: list[oracle_mod.OracleProgress] = []
    res = two_lane_oracle(lengths, curve, on_step=seen.append)
    plain = two_lane_oracle(lengths, curve)
    assert (res.makespan, res.states, res.lane.tolist()) == (plain.makespan, plain.states, plain.lane.tolist())
    searches = [p.search for p in seen]
    assert searches[0] == 1 and searches == sorted(searches) and len(set(searches)) > 1  # beam, then exact ones
    placed = {k: [p.step for p in seen if p.search == k] for k in set(searches)}
    assert all(s == list(range(1, len(s) + 1)) and len(s) <= 80 for s in placed.values())  # pruned: stops early
    assert len(placed[1]) == 80  # the beam pass places every request
    assert all(p.requests == 80 for p in seen)
    assert [p.states for p in seen] == sorted(p.states for p in seen) and seen[-1].states == res.states
