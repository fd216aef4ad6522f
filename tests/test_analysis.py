"""App. B analyses: variance decomposition, tail-ranking AUC, balanced subsets, length statistics."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailsieve.analysis.length_report import analyze_trace, balanced_grid
from tailsieve.analysis.length_stats import (
    _pairwise_auc,
    between_within_shares,
    length_stats,
    tail_auc_matrix,
    variance_decomposition,
)
from tailsieve.errors import ConfigError
from tailsieve.workloads.traces import Trace


def additive(
    shares: tuple[float, float, float, float], i: int, s: int, r: int, *, seed: int = 0, exact: bool = False
) -> np.ndarray:
    """Raw lengths = 5000 + prompt + checkpoint + interaction + sampling with the given variance fractions.

    With `exact`, each effect is centred (the interaction doubly, the noise within cells) and scaled to its exact
    population variance, so the App. B sums of squares equal the configured fractions.
    """
    rng = np.random.default_rng(seed)
    p, c = rng.standard_normal((i, 1, 1)), rng.standard_normal((1, s, 1))
    x, e = rng.standard_normal((i, s, 1)), rng.standard_normal((i, s, r))
    if exact:
        p, c = p - p.mean(), c - c.mean()
        x = x - x.mean(axis=0, keepdims=True) - x.mean(axis=1, keepdims=True) + x.mean()
        e = e - e.mean(axis=2, keepdims=True)
        p, c, x, e = (a / np.sqrt((a**2).mean()) for a in (p, c, x, e))
    sp, sc, si, se = (np.sqrt(v) * 1000 for v in shares)
    return np.asarray(5000 + sp * p + sc * c + si * x + se * e)


def test_decomposition_recovers_configured_shares() -> None:
    target = (0.648, 0.022, 0.069, 0.261)
    v = variance_decomposition(additive(target, 64, 8, 8, exact=True))
    assert (v.prompt, v.checkpoint, v.interaction, v.sampling) == pytest.approx(target, abs=1e-9)
    # with random effects the shares estimate the fractions up to finite-design noise
    v = variance_decomposition(additive(target, 2000, 40, 8, seed=1))
    got = (v.prompt, v.checkpoint, v.interaction, v.sampling)
    assert got == pytest.approx(target, abs=0.04)
    assert sum(got) == pytest.approx(1.0)


def test_decomposition_matches_the_definitions() -> None:
    x = np.random.default_rng(3).integers(0, 100, size=(4, 3, 5)).astype(float)
    i_n, s_n, r_n = x.shape
    g = x.mean()
    ss_p = sum(s_n * r_n * (x[i].mean() - g) ** 2 for i in range(i_n))
    ss_c = sum(i_n * r_n * (x[:, s].mean() - g) ** 2 for s in range(s_n))
    ss_e = sum((x[i, s, k] - x[i, s].mean()) ** 2 for i in range(i_n) for s in range(s_n) for k in range(r_n))
    total = ((x - g) ** 2).sum()
    v = variance_decomposition(x)
    assert v.prompt == pytest.approx(ss_p / total)
    assert v.checkpoint == pytest.approx(ss_c / total)
    assert v.sampling == pytest.approx(ss_e / total)
    assert v.interaction == pytest.approx(1 - (ss_p + ss_c + ss_e) / total)


def test_decomposition_errors() -> None:
    with pytest.raises(ConfigError, match=r"expected an I×S×R array of lengths, got shape \(3, 4\)"):
        variance_decomposition(np.ones((3, 4)))
    with pytest.raises(ConfigError, match="all lengths are equal"):
        variance_decomposition(np.ones((3, 2, 2)))


def test_auc_is_one_for_persistent_prompts() -> None:
    means = np.linspace(100, 10000, 64)
    x = np.broadcast_to(means[:, None, None], (64, 6, 8)) + np.random.default_rng(0).normal(0, 1, (64, 6, 8))
    auc = tail_auc_matrix(x)
    assert auc.shape == (6, 6)
    assert np.allclose(auc, 1.0)


def test_auc_is_half_for_shuffled_prompts() -> None:
    rng = np.random.default_rng(7)
    x = rng.lognormal(7, 1, size=(2000, 6, 8))  # prompts re-drawn at every checkpoint: no persistence
    auc = tail_auc_matrix(x)
    off = auc[~np.eye(6, dtype=bool)]
    assert np.allclose(np.diag(auc), 1.0)
    assert off.mean() == pytest.approx(0.5, abs=0.03)
    assert (np.abs(off - 0.5) < 0.08).all()


def test_auc_ties_count_one_half() -> None:
    assert _pairwise_auc(np.ones(5), np.array([True, False, False, False, False])) == 0.5
    assert _pairwise_auc(np.array([2.0, 2.0, 1.0]), np.array([True, False, False])) == 0.75


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=2, max_size=25), st.data())
def test_auc_matches_brute_force(scores: list[int], data: st.DataObject) -> None:
    n = len(scores)
    tail = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    if tail.all() or not tail.any():
        return
    pos = [s for s, t in zip(scores, tail, strict=True) if t]
    neg = [s for s, t in zip(scores, tail, strict=True) if not t]
    brute = np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a, b in itertools.product(pos, neg)])
    assert _pairwise_auc(np.array(scores, dtype=float), tail) == pytest.approx(brute)


def test_tail_set_is_top_tenth() -> None:
    # 20 prompts → tail of ⌈2⌉; at checkpoint 1 the two tail prompts of checkpoint 0 fall to the bottom
    m0 = np.arange(20, dtype=float)
    m1 = m0.copy()
    m1[[18, 19]] = [-2, -1]
    x = np.stack([m0, m1], axis=1)[:, :, None]
    auc = tail_auc_matrix(x)
    assert auc[0, 1] == 0.0 and auc[1, 1] == 1.0
    with pytest.raises(ConfigError, match="tail fraction must be in"):
        tail_auc_matrix(x, tail_fraction=1.5)


def test_between_within() -> None:
    b, w = between_within_shares([np.array([1, 1]), np.array([3, 3])])
    assert (b, w) == (1.0, 0.0)
    b, w = between_within_shares([np.array([1, 3]), np.array([1, 3])])
    assert (b, w) == (0.0, 1.0)


def test_length_stats() -> None:
    s = length_stats(np.array([1, 2, 3, 4, 100]), n_prompts=2, max_length=100)
    assert (s.p50, s.max, s.truncated_share, s.max_completed, s.samples_per_prompt) == (3.0, 100, 0.2, 4, 2.5)
    assert s.p90_p50 == pytest.approx(s.p90 / 3.0)
    flagged = length_stats([5, 6], truncated=[False, True])
    assert flagged.truncated_share == 0.5 and flagged.max_completed == 5
    assert length_stats([5, 6]).truncated_share is None
    assert set(s.to_json()) >= {"p50", "p90", "p99", "max", "p90_p50", "truncated_share", "samples_per_prompt"}


def test_balanced_grid_picks_largest_subset() -> None:
    # prompt a: 3 samples at both steps; b: 2 and 3; c: only step 0 → dropped
    rows = [("a", 0)] * 3 + [("a", 1)] * 3 + [("b", 0)] * 2 + [("b", 1)] * 3 + [("c", 0)] * 4
    pid = np.array([r[0] for r in rows])
    step = np.array([r[1] for r in rows])
    length = np.arange(len(rows), dtype=np.int64)
    grid, kept, steps, balanced = balanced_grid(pid, step, length)
    assert kept == ("a", "b") and steps == (0, 1) and not balanced
    assert grid.shape == (2, 2, 2)  # I·R = 4 with R = 2 beats 1 prompt × 3
    assert grid[0, 0].tolist() == [0, 1] and grid[1, 1].tolist() == [8, 9]


def test_analyze_trace_with_steps_names_the_balanced_subset() -> None:
    rng = np.random.default_rng(0)
    pid = np.repeat([f"p{i}" for i in range(30)], 3 * 4)
    step = np.tile(np.repeat([10, 20, 30], 4), 30)
    length = rng.integers(1, 1000, pid.size)
    keep = ~((pid == "p0") & (step == 30))  # p0 misses checkpoint 30
    t = Trace(source="x", prompt_id=pid[keep], length=length[keep], step=step[keep],
              meta={"prompt_column": "prompt_id"})
    a = analyze_trace(t)
    assert a.checkpoints == (10, 20, 30) and a.auc.shape == (3, 3)
    assert any("balanced subset of 29 prompts × 3 checkpoints × 4 samples" in n for n in a.notes)
    assert a.shares is not None
    assert sum(a.shares.to_json().values()) == pytest.approx(1.0)
