"""Large-fleet forecasts (`policy.mean_field`): the per-lane sums for uniform against the exact all-admit model, the
mean-field finish times against closed forms, and the predictor's switch between exact and mean field."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_curve
from tailsieve.policy import predictor as predictor_mod
from tailsieve.policy.lanes import group_completions
from tailsieve.policy.mean_field import GRID_POINTS, MeanFieldPools, uniform_makespan
from tailsieve.policy.predictor import Predictor, PredictorFacts

CURVE = make_curve()


def pools(*, k: int = 2, p: int = 30, g: int = 4, hi: int = 400, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, hi, size=(k, p, g)).astype(np.float64)


@pytest.mark.parametrize("kv", [0.0, 3e-6])
@pytest.mark.parametrize(("p", "lanes"), [(30, 7), (8, 8), (5, 9), (64, 4)])
def test_uniform_makespan_is_the_exact_last_completion(p: int, lanes: int, kv: float) -> None:
    x = pools(p=p, seed=p + lanes)
    exact = group_completions(x, lanes, CURVE, False, kv).max(axis=1)
    assert uniform_makespan(x, lanes, CURVE, kv) == pytest.approx(exact, rel=1e-12)


def test_equal_lengths_finish_at_length_times_tau_of_the_lane_count() -> None:
    x = np.full((1, 12, 4), 50.0)  # 48 requests on 6 lanes: 8 per lane, all running for 50 iterations
    mf = MeanFieldPools(x, x[:, :0])
    f = mf.completions(np.arange(0), True, 6, CURVE, 0.0)
    assert f == pytest.approx(np.full((1, 12), 50 * CURVE.tpot_s(8)))
    assert f == pytest.approx(group_completions(x, 6, CURVE, True))  # the exact model agrees here
    kv = 1e-5
    with_kv = mf.completions(np.arange(0), True, 6, CURVE, kv)
    assert with_kv[0, 0] == pytest.approx(50 * CURVE.tpot_s(8) + kv * 8 * 49 * 50 / 2)


def test_two_lengths_closed_form() -> None:
    # 20 requests of 10 tokens and 20 of 30 on 4 lanes (n = 10 per lane). Up to t = 10 all run: b = 10. After,
    # a 30-token request shares its lane with (n − 1)·(20 − 1)/(40 − 1) others still running.
    short, long_ = np.full((5, 4), 10.0), np.full((5, 4), 30.0)
    x = np.concatenate((short, long_))[None]
    f = MeanFieldPools(x, x[:, :0]).completions(np.arange(0), True, 4, CURVE, 0.0)[0]
    b = 1 + 9 * 19 / 39
    tab = CURVE.table(12)
    tau_b = tab[int(b)] + (b - int(b)) * (tab[int(b) + 1] - tab[int(b)])
    assert f[:5] == pytest.approx(10 * CURVE.tpot_s(10))
    assert f[5:] == pytest.approx(10 * CURVE.tpot_s(10) + 20 * tau_b)


def test_candidates_join_the_pool_in_queue_order() -> None:
    fresh, cand = pools(p=10, seed=1), pools(p=4, seed=2) + 500
    mf = MeanFieldPools(fresh, cand)
    both = mf.completions(np.array([1, 2]), True, 3, CURVE, 0.0)
    alone = MeanFieldPools(np.concatenate((cand[:, 1:3], fresh), axis=1), cand[:, :0])
    assert both.shape == (2, 12)
    assert both == pytest.approx(alone.completions(np.arange(0), True, 3, CURVE, 0.0))
    assert mf.completions(np.arange(0), False, 3, CURVE, 0.0).shape == (2, 0)


def test_long_lengths_use_bins_rounded_up() -> None:
    x = pools(p=40, hi=20 * GRID_POINTS, seed=3)
    mf = MeanFieldPools(x, x[:, :0])
    assert mf.grid.size <= GRID_POINTS + 1
    width = mf.grid[1]
    f = mf.completions(np.arange(0), True, 5, CURVE, 0.0)
    exact_grid = MeanFieldPools(np.ceil(x / width) * width, x[:, :0])  # the same pool with lengths pre-rounded
    assert np.all(np.diff(np.sort(f, axis=1), axis=1) >= 0)
    assert f == pytest.approx(exact_grid.completions(np.arange(0), True, 5, CURVE, 0.0), rel=1e-9)


def history(n: int, g: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = rng.lognormal(6.0, 0.5, size=(n, 1)) * rng.lognormal(0, 0.3, size=(n, g))
    out[: n // 10] *= 5
    return np.ceil(out).astype(np.int64)


def test_predictor_switches_to_mean_field_only_for_large_request_dispatched_pools() -> None:
    small = Predictor(history(64, 8), PredictorFacts(groups=64, extra=7, replicas=8, curve=CURVE))
    assert not small.large and not small.use_mean_field
    kw = dict(groups=2048, extra=205, replicas=256, curve=CURVE, pinned_candidates=True)
    big = Predictor(history(2048, 16), PredictorFacts(**kw))  # type: ignore[arg-type]
    assert big.large and big.use_mean_field
    grouped = Predictor(history(2048, 16), PredictorFacts(by_request=False, **kw))  # type: ignore[arg-type]
    assert grouped.large and not grouped.use_mean_field
    forced = Predictor(history(64, 8), PredictorFacts(groups=64, extra=7, replicas=8, curve=CURVE, mean_field=True))
    assert forced.use_mean_field
    assert predictor_mod.MEAN_FIELD_REQUESTS < 2 * (2048 + 205) * 16


def test_mean_field_forecast_tracks_the_exact_one_at_scale() -> None:
    h = history(2048, 16, seed=4)
    kw = dict(groups=2048, extra=205, replicas=256, curve=CURVE, pinned_candidates=True)
    mf = Predictor(h, PredictorFacts(**kw))  # type: ignore[arg-type]
    ex = Predictor(h, PredictorFacts(mean_field=False, **kw))  # type: ignore[arg-type]
    assert mf.use_mean_field and not ex.use_mean_field
    assert mf.makespan(0, 0) == pytest.approx(ex.makespan(0, 0), rel=1e-12)  # uniform stays exact
    for q, m in [(1, 1), (20, 2), (50, 4), (205, 8)]:
        assert mf.bulk_times(q, m).mean() == pytest.approx(ex.bulk_times(q, m).mean(), rel=0.10)
        assert mf.tail_times(q, m).mean() == pytest.approx(ex.tail_times(q, m).mean(), rel=0.10)
        assert mf.tail_times(q, m).mean() <= ex.tail_times(q, m).mean() * 1.01  # the spread it ignores


def test_tail_capacity_bisection_matches_the_scan() -> None:
    h = history(2048, 16, seed=5)
    kw = dict(groups=2048, extra=205, replicas=256, curve=CURVE)
    big = Predictor(h, PredictorFacts(**kw))  # type: ignore[arg-type]
    for m, deadline in [(2, 200.0), (4, 60.0), (8, 1e9), (3, 0.0)]:
        scan = 0
        for q in range(1, 220):
            if float(np.mean(big.tail_times(q, m))) > deadline:
                break
            scan = q
        assert big.tail_capacity(deadline, m, 219) == scan


def test_prefetch_gives_the_same_forecasts_as_one_at_a_time() -> None:
    h = history(2048, 16, seed=6)
    kw = dict(groups=2048, extra=205, replicas=256, curve=CURVE, pinned_candidates=True)
    one, many = Predictor(h, PredictorFacts(**kw)), Predictor(h, PredictorFacts(**kw))  # type: ignore[arg-type]
    qs = [1, 7, 50, 120, 205]
    many.prefetch(qs, 3)
    assert all((q, 3) in many._bulk_f for q in qs)  # the bulk pool's F, batched; the tail is exact per q
    for q in qs:
        assert many.tail_times(q, 3) == pytest.approx(one.tail_times(q, 3), rel=1e-12)
        assert many.bulk_times(q, 3) == pytest.approx(one.bulk_times(q, 3), rel=1e-12)
    small = Predictor(history(64, 8), PredictorFacts(groups=64, extra=7, replicas=8, curve=CURVE))
    small.prefetch(qs, 3)  # exact forecasts: nothing to batch
    assert not small._tail and not small._bulk_f and not small._bulk_t


def test_cached_counts_and_grid_lookups_equal_the_completions_they_replace() -> None:
    h = history(2048, 16, seed=7)
    p = Predictor(h, PredictorFacts(groups=2048, extra=205, replicas=256, curve=CURVE, pinned_candidates=True))
    mf = p.mean_field
    for q in [0, 1, 50, 205, 300, 450, 37]:  # past the width W = 205 the candidates cycle; then a q below a cached one
        assert (mf.prefix_counts(q) == mf.cand_counts([p._cand_idx(0, q)])[0]).all()
    for q, m in [(1, 3), (50, 7), (204, 2)]:
        raw = mf.completions(p._cand_idx(q, 205), True, 256 - m, CURVE, 0.0)  # (K, P): pinned candidates, then fresh
        pins, rest = 205 - q, 2048 - 205
        last_pin = raw[:, :pins].max(axis=1)
        cut = np.partition(raw[:, pins:], rest - 1, axis=1)[:, rest - 1]
        assert (p.bulk_times(q, m) == np.maximum(last_pin, cut)).all()
        assert (p.bulk_completions(q, m) == np.sort(raw, axis=1)).all()
        # the tail pool runs to completion: exact per-lane sums, the all-admit model's last finish, not the mean field
        exact = group_completions(p._cands(0, q), m, CURVE, True).max(axis=1)
        assert p.tail_times(q, m) == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize(("kv", "prefill"), [(0.0, 0.0), (3e-6, 0.0), (0.0, 0.7), (3e-6, 0.7)])
@pytest.mark.parametrize("by_request", [True, False])
def test_the_uniform_forecast_is_the_exact_last_completion_for_either_placement(kv: float, prefill: float,
                                                                                 by_request: bool) -> None:
    """Uniform (0, 0) from per-lane sums (dealt by request: one-member groups dealt round-robin) equals the
    all-admit model's last finish time, prefill per distinct prompt per lane included."""
    h = np.random.default_rng(4).integers(1, 900, size=(50, 6))
    p = Predictor(h, PredictorFacts(groups=37, extra=4, replicas=5, curve=CURVE, kv_s_per_token=kv, prefill_s=prefill))
    exact = group_completions(p.fresh, 5, CURVE, by_request, kv, prefill).max(axis=1)
    assert p.uniform_times(by_request) == pytest.approx(exact, rel=1e-12)
