"""Appendix B analyses: length statistics, cross-checkpoint tail-ranking AUC, and the variance decomposition."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailsieve.errors import ConfigError

TAIL_FRACTION = 0.1  # App. B: tail set = the top ⌈0.1·I⌉ prompts


@dataclass(frozen=True, slots=True)
class LengthStats:
    """Length statistics of a trace or sample (App. A.5 Table A.3 columns plus P99 and truncation)."""

    n: int
    p50: float
    p90: float
    p99: float
    max: int
    truncated_share: float | None
    samples_per_prompt: float
    max_completed: int | None = None

    @property
    def p90_p50(self) -> float:
        """Tail ratio P90/P50 (A.5's r)."""
        return self.p90 / self.p50 if self.p50 > 0 else math.nan

    def to_json(self) -> dict[str, Any]:
        """JSON `stats` object of `tailsieve analyze`."""
        return {
            "n": self.n, "p50": self.p50, "p90": self.p90, "p99": self.p99, "max": self.max,
            "p90_p50": self.p90_p50, "truncated_share": self.truncated_share,
            "samples_per_prompt": self.samples_per_prompt, "max_completed": self.max_completed,
        }


def length_stats(
    lengths: ArrayLike, *, n_prompts: int | None = None, truncated: ArrayLike | None = None,
    max_length: int | None = None,
) -> LengthStats:
    """P50/P90/P99/max/P90÷P50 of the lengths; truncated share from flags, else from `length >= max_length`."""
    arr = np.asarray(lengths, dtype=np.int64).ravel()
    if arr.size == 0:
        raise ConfigError("length statistics need at least one length")
    q50, q90, q99 = (float(v) for v in np.percentile(arr, [50, 90, 99]))
    flags: NDArray[np.bool_] | None = None
    if truncated is not None:
        flags = np.asarray(truncated, dtype=bool).ravel()
    elif max_length is not None:
        flags = arr >= max_length
    share = None if flags is None else float(flags.mean())
    done = arr if flags is None else arr[~flags]
    return LengthStats(
        n=int(arr.size), p50=q50, p90=q90, p99=q99, max=int(arr.max()), truncated_share=share,
        samples_per_prompt=arr.size / (n_prompts or arr.size),
        max_completed=int(done.max()) if flags is not None and done.size else None,
    )


@dataclass(frozen=True, slots=True)
class VarianceShares:
    """App. B shares of SS_total (fractions summing to 1)."""

    prompt: float
    checkpoint: float
    interaction: float
    sampling: float

    def to_json(self) -> dict[str, float]:
        """JSON `variance_shares` object."""
        return {"prompt": self.prompt, "checkpoint": self.checkpoint, "interaction": self.interaction,
                "sampling": self.sampling}


def _grid(lengths: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(lengths, dtype=np.float64)
    if arr.ndim != 3 or min(arr.shape) < 1:
        raise ConfigError(f"expected an I×S×R array of lengths, got shape {arr.shape}")
    return arr


def variance_decomposition(lengths: ArrayLike) -> VarianceShares:
    """App. B two-factor decomposition of raw lengths L[i, s, r]: SS_total = prompt + checkpoint + inter. + sampling."""
    x = _grid(lengths)
    i_n, s_n, r_n = x.shape
    grand = x.mean()
    cell = x.mean(axis=2)
    ss_prompt = s_n * r_n * float(((cell.mean(axis=1) - grand) ** 2).sum())
    ss_ckpt = i_n * r_n * float(((cell.mean(axis=0) - grand) ** 2).sum())
    ss_cells = r_n * float(((cell - grand) ** 2).sum())
    ss_sampling = float(((x - cell[:, :, None]) ** 2).sum())
    total = float(((x - grand) ** 2).sum())
    if total <= 0:
        raise ConfigError("variance decomposition: all lengths are equal (SS_total = 0)")
    inter = max(ss_cells - ss_prompt - ss_ckpt, 0.0)  # ≥ 0 up to rounding
    parts = np.array([ss_prompt, ss_ckpt, inter, ss_sampling]) / total
    parts /= parts.sum()
    return VarianceShares(*(float(v) for v in parts))


def between_within_shares(groups: list[NDArray[np.int64]] | tuple[NDArray[np.int64], ...]) -> tuple[float, float]:
    """Single-checkpoint decomposition (App. B with S = 1): (between-prompt, within-prompt) shares of SS_total."""
    sizes = np.array([g.size for g in groups])
    if sizes.size == 0 or (sizes == 0).any():
        raise ConfigError("between/within shares need at least one non-empty prompt group")
    flat = np.concatenate(groups).astype(np.float64)
    grand = flat.mean()
    means = np.array([g.mean() for g in groups])
    between = float((sizes * (means - grand) ** 2).sum())
    total = float(((flat - grand) ** 2).sum())
    if total <= 0:
        raise ConfigError("between/within shares: all lengths are equal (SS_total = 0)")
    return between / total, 1.0 - between / total


def _pairwise_auc(scores: NDArray[np.float64], tail: NDArray[np.bool_]) -> float:
    """Pr(score_i > score_j | i ∈ tail, j ∉ tail), ties count one half (rank-based, O(I log I))."""
    n_pos = int(tail.sum())
    n_neg = tail.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    ranks = np.empty(scores.size, dtype=np.float64)
    # average ranks for ties (1-based)
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    u = ranks[tail].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def tail_auc_matrix(lengths: ArrayLike, tail_fraction: float = TAIL_FRACTION) -> NDArray[np.float64]:
    """App. B AUC(s, t): tail set = top ⌈f·I⌉ prompts by mean length at s, ranked by mean length at t."""
    x = _grid(lengths)
    if not 0 < tail_fraction < 1:
        raise ConfigError(f"tail fraction must be in (0, 1), got {tail_fraction}")
    means = x.mean(axis=2)  # I × S
    i_n, s_n = means.shape
    k = math.ceil(tail_fraction * i_n)
    if k >= i_n:
        raise ConfigError(f"tail-ranking AUC needs more than {k} prompts, got {i_n}")
    out = np.empty((s_n, s_n))
    for s in range(s_n):
        top = np.argsort(-means[:, s], kind="stable")[:k]
        tail = np.zeros(i_n, dtype=bool)
        tail[top] = True
        for t in range(s_n):
            out[s, t] = _pairwise_auc(means[:, t], tail)
    return out
