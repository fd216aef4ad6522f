"""Synthetic generator: purity, calibration to the paper's math workload, A.5 tails, config validation."""

from __future__ import annotations

import numpy as np
import pytest

from tailsieve.analysis.length_stats import length_stats, variance_decomposition
from tailsieve.errors import ConfigError
from tailsieve.hashing import stable_hash
from tailsieve.workloads import load_workload
from tailsieve.workloads.synthetic import PAPER_TARGETS, REFERENCE_P50, REFERENCE_P90, SyntheticConfig, SyntheticModel


def marginal(model: SyntheticModel, n: int, g: int = 8) -> np.ndarray:
    """Prompt i's first generation at step i·spacing: the generator's marginal length distribution."""
    step = model.checkpoint_spacing
    return np.stack([model.lengths(p, 0, i * step, g) for i, p in enumerate(model.prompts[:n])])


def test_stable_hash_is_fixed() -> None:
    assert stable_hash("a") == 0x2f42665b399ef840  # blake2b-64: the same in every process and Python version
    assert stable_hash("a") != stable_hash("b")


def test_pure_and_seeded() -> None:
    w = load_workload("synthetic-math", seed=3)
    again = load_workload("synthetic-math", seed=3)
    other = load_workload("synthetic-math", seed=4)
    p = w.prompts[10]
    assert np.array_equal(w.lengths(p, 2, 5, 8), again.lengths(p, 2, 5, 8))
    assert np.array_equal(w.lengths(p, 2, 5, 8), w.lengths(p, 2, 5, 8))
    assert not np.array_equal(w.lengths(p, 2, 5, 8), w.lengths(p, 3, 5, 8))
    assert not np.array_equal(w.lengths(p, 2, 5, 8), other.lengths(p, 2, 5, 8))
    # common random numbers: another step moves a generation through drift and interaction only, so the
    # order of its samples is kept (up to rounding ties)
    a, b = w.lengths(p, 2, 5, 64), w.lengths(p, 2, 40, 64)
    assert not np.array_equal(a, b)
    assert (np.diff(b[np.argsort(a, kind="stable")]) >= -2).all()


def test_calibrated_marginal_statistics_fixed_seed() -> None:
    """Defaults reproduce Table A.3 / §4.1 within 5 % (truncation within 10 %) on seed 0."""
    model = SyntheticModel(SyntheticConfig(n_prompts=8192), seed=0)
    s = length_stats(marginal(model, 8192), max_length=16384)
    assert s.p50 == pytest.approx(PAPER_TARGETS["p50"], rel=0.05)
    assert s.p90 == pytest.approx(PAPER_TARGETS["p90"], rel=0.05)
    assert s.p90_p50 == pytest.approx(PAPER_TARGETS["p90_p50"], rel=0.05)
    assert s.truncated_share == pytest.approx(PAPER_TARGETS["truncated_share"], rel=0.10)
    assert s.max == 16384
    assert s.max_completed is not None and s.max_completed < model.config.ceiling


def test_calibrated_variance_shares_over_designs() -> None:
    """App. B design (I=64, S=8, R=8), averaged over 32 seeds: shares within a few points of the paper's."""
    shares, longest = [], []
    for seed in range(32):
        grid = SyntheticModel(SyntheticConfig(), seed=seed).grid(64, 8, 8)  # first 64 of the 2048 prompts
        v = variance_decomposition(grid)
        shares.append([v.prompt, v.checkpoint, v.interaction, v.sampling])
        longest.append(grid[grid < 16384].max())
    mean = np.mean(shares, axis=0)
    assert mean[0] == pytest.approx(PAPER_TARGETS["prompt"], abs=0.05)
    assert mean[1] == pytest.approx(PAPER_TARGETS["checkpoint"], abs=0.015)
    assert mean[2] == pytest.approx(PAPER_TARGETS["interaction"], abs=0.025)
    assert mean[3] == pytest.approx(PAPER_TARGETS["sampling"], abs=0.05)
    assert float(np.median(longest)) == pytest.approx(PAPER_TARGETS["max_completed"], rel=0.05)


def test_reference_quantiles_match_generator() -> None:
    model = SyntheticModel(SyntheticConfig(n_prompts=8192), seed=1)
    s = length_stats(marginal(model, 8192))
    assert s.p50 == pytest.approx(REFERENCE_P50, rel=0.03)
    assert s.p90 == pytest.approx(REFERENCE_P90, rel=0.04)


@pytest.mark.parametrize(("name", "r"), [("synthetic-math-weak", 1.5), ("synthetic-math-strong", 6.0)])
def test_weak_and_strong_tails(name: str, r: float) -> None:
    w = load_workload(name)
    model = w.source
    assert isinstance(model, SyntheticModel)
    base = SyntheticModel(SyntheticConfig(), seed=0)
    x = marginal(model, 2048)
    y = marginal(base, 2048)
    low = y <= REFERENCE_P50
    assert np.array_equal(x[low], y[low]) and (x[~low] >= REFERENCE_P50).all()  # lower half untouched
    assert (np.diff(x.ravel()[np.argsort(y.ravel(), kind="stable")]) >= 0).all()  # order kept
    s = length_stats(x)
    assert s.p90 / REFERENCE_P50 == pytest.approx(r, rel=0.06)
    assert x.max() <= w.max_length and (x == w.max_length).mean() == pytest.approx((y == 16384).mean())


def test_drift_is_smooth_and_has_configured_sd() -> None:
    m = SyntheticModel(SyntheticConfig(), seed=0)
    b = np.array([m.checkpoint_effect(s) for s in range(4000)])
    assert b.std() == pytest.approx(m.config.sigma_checkpoint, rel=0.1)
    assert np.corrcoef(b[:-1], b[1:])[0, 1] > 0.95
    assert abs(np.corrcoef(b[:-24], b[24:])[0, 1]) < 0.1  # independent one window apart
    iid = SyntheticModel(SyntheticConfig(drift_window=1), seed=0)
    c = np.array([iid.checkpoint_effect(s) for s in range(4000)])
    assert abs(np.corrcoef(c[:-1], c[1:])[0, 1]) < 0.1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sigma_prompt": -0.1}, "sigma_prompt must be a finite number >= 0, got -0.1"),
        ({"mu": float("nan")}, "mu must be finite, got nan"),
        ({"ceiling": 0.0}, "ceiling must be > 0, got 0.0"),
        ({"max_length": 0}, "max_length must be >= 1, got 0"),
        ({"n_prompts": 0}, "n_prompts must be >= 1, got 0"),
        ({"tail_ratio": 1.0}, "tail_ratio must be a finite number > 1, got 1.0"),
        ({"drift_window": 0}, "drift_window must be >= 1 step, got 0"),
        ({"ceiling_sharpness": 0.0}, "ceiling_sharpness must be > 0, got 0.0"),
    ],
)
def test_config_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        SyntheticConfig(**kwargs)  # type: ignore[arg-type]


def test_model_validation() -> None:
    with pytest.raises(ConfigError, match="seed must be >= 0, got -1"):
        SyntheticModel(SyntheticConfig(), seed=-1)
    m = SyntheticModel(SyntheticConfig(n_prompts=4), seed=0)
    with pytest.raises(ConfigError, match="grid needs 5 prompts, the workload has 4"):
        m.grid(5, 1, 1)
