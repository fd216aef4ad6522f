"""The fast known-length baselines against the exhaustive implementations they replaced (issue 15, part 3).

`topq-best` (branch and bound, `model.topq_search`), `improve` (sorted search, `model.balancing`) and
`streamrl-oracle` (`dealt_makespans`) must return exactly what the old code returned: the same (q, m), the same
replicas, the same makespans. The old code is kept here as the reference.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import curves
from tailsieve.model.balancing import improve
from tailsieve.model.baselines import (
    GroupBatch,
    StreamRLOracle,
    TopQBest,
    _pools,
    group_tail_rank,
    lpt,
    topq_lanes,
)
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve, builtin_curves
from tailsieve.model.makespan import dealt_makespans, lane_makespans, lane_order
from tailsieve.model.topq_search import replica_bound, replica_upper


# ---------------------------------------------------------------- the replaced implementations
def many_makespans(flat: np.ndarray, lanes: np.ndarray, replicas: int, curve: TpotCurve) -> np.ndarray:
    c = lanes.shape[0]
    offset = (np.arange(c, dtype=np.int64) * replicas)[:, None]
    spans = lane_makespans(np.tile(flat, c), (lanes + offset).ravel(), c * replicas, curve)
    return spans.reshape(c, replicas)


def brute_topq_best(batch: GroupBatch, replicas: int, curve: TpotCurve) -> tuple[int, int, float]:
    """The old `TopQBest.assign`: every (q, m) exactly, one N × (N·G) matrix per m."""
    flat, g, rank = batch.lengths.ravel(), batch.group_size, group_tail_rank(batch)
    qs = np.arange(1, batch.n_groups + 1)
    uniform = np.arange(batch.n_groups, dtype=np.int64) % replicas
    best_t = float(many_makespans(flat, np.repeat(uniform, g)[None, :], replicas, curve).max())
    best_q, best_m = 0, 0
    for m in range(1, replicas):
        t = many_makespans(flat, np.repeat(topq_lanes(rank, qs, m, replicas), g, axis=1), replicas, curve).max(axis=1)
        i = int(np.argmin(t))
        if t[i] < best_t:
            best_t, best_q, best_m = float(t[i]), int(qs[i]), m
    return best_q, best_m, best_t


def brute_improve(weights: np.ndarray, bin_of: np.ndarray, bins: int) -> np.ndarray:
    """The old `improve`: every lighter bin scanned with a full pair matrix per round."""
    w, out = np.asarray(weights, dtype=np.int64), np.array(bin_of, dtype=np.int64)
    loads = np.bincount(out, weights=w, minlength=bins).astype(np.int64)
    while True:
        a = int(np.argmax(loads))
        la, in_a = int(loads[a]), np.flatnonzero(out == a)
        best, move = la, (-1, -1, -1)
        for b in np.flatnonzero(loads < la):
            in_b = np.concatenate(([-1], np.flatnonzero(out == b)))
            d = w[in_a][:, None] - np.where(in_b >= 0, w[in_b], 0)[None, :]
            pair_max = np.where(d > 0, np.maximum(la - d, int(loads[b]) + d), la)
            x, y = np.unravel_index(int(np.argmin(pair_max)), pair_max.shape)
            if pair_max[x, y] < best:
                best, move = int(pair_max[x, y]), (int(in_a[x]), int(in_b[y]), int(b))
        x_item, y_item, dest = move
        if x_item < 0:
            return out
        delta = int(w[x_item]) - (int(w[y_item]) if y_item >= 0 else 0)
        out[x_item] = dest
        if y_item >= 0:
            out[y_item] = a
        loads[a] -= delta
        loads[dest] += delta


def brute_streamrl(batch: GroupBatch, replicas: int, curve: TpotCurve) -> tuple[int, float]:
    flat = batch.lengths.ravel()
    n = flat.size
    k = min(n, max(1, math.ceil(0.2 * n - 1e-9)))
    by_rank = np.argsort(-flat, kind="stable")
    ds = np.arange(1, replicas)
    lanes_by_rank = np.stack([_pools(np.arange(n) < k, int(d), replicas) for d in ds])
    lanes = np.empty_like(lanes_by_rank)
    lanes[:, by_rank] = lanes_by_rank
    spans = many_makespans(flat, lanes, replicas, curve).max(axis=1)
    return int(ds[int(np.argmin(spans))]), float(spans.min())


# ---------------------------------------------------------------- batches
@st.composite
def tied_batches(draw: st.DrawFn, max_groups: int = 24, max_size: int = 5) -> GroupBatch:
    """Random batches, often with many ties (a small length alphabet or a cap every long response hits)."""
    n = draw(st.integers(1, max_groups))
    g = draw(st.integers(1, max_size))
    hi = draw(st.sampled_from([2, 6, 60, 5000]))
    cells = np.asarray(draw(st.lists(st.integers(0, hi), min_size=n * g, max_size=n * g)))
    if draw(st.booleans()):
        cells = np.minimum(cells * 3, hi)  # a length cap
    return GroupBatch(cells.reshape(n, g))


def assert_same_topq(batch: GroupBatch, replicas: int, curve: TpotCurve) -> None:
    q, m, t = brute_topq_best(batch, replicas, curve)
    a = TopQBest().assign(batch, replicas, curve)
    assert (int(a.info["q"]), int(a.info["m"])) == (q, m)
    assert a.makespan_s == pytest.approx(t, rel=1e-12, abs=1e-12)
    assert np.array_equal(a.replica[:, 0], topq_lanes(group_tail_rank(batch), np.array([q]), m, replicas)[0])


@settings(max_examples=300, deadline=None)
@given(tied_batches(), st.integers(2, 9), curves())
def test_topq_best_equals_exhaustive(batch: GroupBatch, replicas: int, curve: TpotCurve) -> None:
    assert_same_topq(batch, replicas, curve)


@pytest.mark.parametrize("seed", range(6))
def test_topq_best_equals_exhaustive_on_trace_shapes(seed: int) -> None:
    """Seeded sweep over N, G, R and the built-in curves, lognormal lengths capped like the bundled traces."""
    rng = np.random.default_rng(seed)
    names = list(builtin_curves())
    for _ in range(8):
        n, g, r = int(rng.integers(8, 97)), int(rng.integers(1, 9)), int(rng.integers(2, 17))
        lengths = np.minimum(rng.lognormal(7.0, 1.1, size=(n, g)).astype(np.int64), int(rng.choice([4096, 16384])))
        assert_same_topq(GroupBatch(lengths), r, load_curve(names[int(rng.integers(len(names)))]))


def test_topq_best_equals_exhaustive_at_256_groups() -> None:
    rng = np.random.default_rng(11)
    lengths = np.minimum(rng.lognormal(7.4, 1.0, size=(256, 8)).astype(np.int64), 16384)
    assert_same_topq(GroupBatch(lengths), 16, load_curve("h100-llama3-8b"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 200), max_size=40), st.integers(1, 8), st.booleans(), st.integers(0, 2**31))
def test_improve_equals_exhaustive(weights: list[int], bins: int, from_lpt: bool, seed: int) -> None:
    w = np.asarray(weights, dtype=np.int64)
    start = lpt(w, bins) if from_lpt else np.random.default_rng(seed).integers(0, bins, size=w.size)
    assert np.array_equal(improve(w, start, bins), brute_improve(w, start, bins))


@settings(max_examples=150, deadline=None)
@given(tied_batches(), st.integers(2, 9), curves())
def test_streamrl_equals_exhaustive(batch: GroupBatch, replicas: int, curve: TpotCurve) -> None:
    d, t = brute_streamrl(batch, replicas, curve)
    a = StreamRLOracle().assign(batch, replicas, curve)
    assert int(a.info["dedicated"]) == d
    assert a.makespan_s == t


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=50), st.integers(1, 7), curves())
def test_dealt_makespans_match_lane_makespans_bitwise(lengths: list[int], lanes: int, curve: TpotCurve) -> None:
    desc = np.sort(np.asarray(lengths, dtype=np.int64))[::-1]
    want = lane_makespans(desc, np.arange(desc.size) % lanes, lanes, curve)
    assert np.array_equal(dealt_makespans(desc, lanes, curve), want)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=40), curves())
def test_replica_bounds_bracket_the_makespan(lengths: list[int], curve: TpotCurve) -> None:
    arr = np.asarray(lengths, dtype=np.float64)
    t = float(lane_makespans(arr, np.zeros(arr.size, dtype=np.int64), 1, curve)[0])
    longest, total = np.array([arr.max()]), np.array([arr.sum()])
    assert replica_bound(longest, total, curve, arr.size)[0] <= t * (1 + 1e-12) + 1e-12
    assert replica_upper(longest, total, curve, arr.size)[0] >= t * (1 - 1e-12) - 1e-12


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-40000, 40000).map(float), st.floats(-50, 50, allow_nan=False),
                          st.sampled_from([0.0, -0.0])), max_size=60), st.integers(1, 9))
def test_lane_order_is_lexsort(keys: list[float], n_lanes: int) -> None:
    k = np.asarray(keys, dtype=np.float64)
    lanes = np.arange(k.size, dtype=np.int64) * 7 % n_lanes
    assert np.array_equal(lane_order(k, lanes, n_lanes), np.lexsort((k, lanes)))
