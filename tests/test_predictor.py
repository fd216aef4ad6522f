"""The predictor's bootstrap pools (`policy.predictor`): drawn within one history step each, so a step's mix of long
and short prompts is kept (issue 22: pooled draws put a long step's long groups into every pool)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_curve
from tailsieve.policy.pools import draw_rows
from tailsieve.policy.predictor import Predictor, PredictorFacts

FLAT = make_curve(batch=(1,), tpot_ms=(1.0,), name="flat")


def test_pools_drawn_by_step_take_every_row_from_one_step_in_turn() -> None:
    """Blocks of 3, 5 and 2 rows: pool k draws only rows of step k mod 3, and K = 4 rounds up to 6 (two rounds)."""
    rows = draw_rows(10, (3, 5, 2), 4, 50, np.random.default_rng(0))
    assert rows.shape == (6, 50)
    spans = [(0, 3), (3, 8), (8, 10)]
    for k, row in enumerate(rows):
        lo, hi = spans[k % 3]
        assert row.min() >= lo and row.max() < hi
        assert set(row.tolist()) == set(range(lo, hi))  # 50 draws reach every row of a block this small
    pooled = draw_rows(10, None, 4, 50, np.random.default_rng(0))
    assert pooled.shape == (4, 50) and set(pooled.ravel().tolist()) == set(range(10))
    assert draw_rows(10, (3, 5), 4, 5, np.random.default_rng(0)).shape == (4, 5)  # blocks that do not add up: pooled


def test_a_uniform_forecast_by_step_is_the_mean_of_the_steps_own_makespans() -> None:
    """Two history steps: one of 100-token groups, one of 10-token groups. N = 2 groups of 1 on R = 2 replicas at a
    flat τ = 1 ms: a pool from the long step takes 0.1 s, from the short one 0.01 s, so by step the forecast is
    exactly their mean, 0.055 s. Pooled draws mix the steps: a pool holding any long group takes 0.1 s, more than
    half of them do, and the forecast over-states the mean step."""
    history = np.array([[100]] * 3 + [[10]] * 3, dtype=np.int64)
    kw = {"groups": 2, "extra": 1, "replicas": 2, "curve": FLAT, "resamples": 8, "uniform_by_request": True}
    by_step = Predictor(history, PredictorFacts(**kw), blocks=(3, 3))
    assert float(np.mean(by_step.uniform_times())) == pytest.approx(0.055)
    pooled = Predictor(history, PredictorFacts(**kw))
    assert float(np.mean(pooled.uniform_times())) > 0.055


def test_a_pool_holds_its_steps_own_groups_without_replacement() -> None:
    """A pool no wider than its step is a permutation of the step's rows (its realized work: a step's one capped
    group is in every pool from that step); past the step's size the rest is drawn with replacement."""
    rows = draw_rows(12, (5, 7), 6, 5, np.random.default_rng(1))
    for k, row in enumerate(rows):
        lo, hi = ((0, 5), (5, 12))[k % 2]
        assert len(set(row.tolist())) == 5 and row.min() >= lo and row.max() < hi
    assert all(sorted(r.tolist()) == [0, 1, 2, 3, 4] for r in rows[::2])
    wide = draw_rows(12, (5, 7), 2, 9, np.random.default_rng(1))
    assert sorted(wide[0, :5].tolist()) == [0, 1, 2, 3, 4] and wide[0].max() < 5
