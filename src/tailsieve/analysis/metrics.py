"""Run metrics (pure statistics over finished runs): routing-induced length bias (App. E) and wasted tokens.

- `length_bias`: the responses a policy consumed against those `uniform` consumed on the same prompt stream, over
  the summary window (all steps but the first `SKIP_STEPS`): ratio of means and the exact two-sample KS distance.
- `wasted_share`: tokens of aborted (cut) groups over all tokens generated, same window.
The partial-rollout capture rate (§2.3) runs the simulator and lives in `tailsieve.simulation.capture`.
Definitions and the window are documented in docs/simulate.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailsieve.errors import ConfigError
from tailsieve.loop import SKIP_STEPS, PolicyRun


def ks_distance(a: ArrayLike, b: ArrayLike) -> float:
    """Exact two-sample Kolmogorov–Smirnov distance sup_x |F_a(x) − F_b(x)| of two empirical CDFs."""
    xa = np.sort(np.asarray(a, dtype=np.float64).ravel())
    xb = np.sort(np.asarray(b, dtype=np.float64).ravel())
    if xa.size == 0 or xb.size == 0:
        raise ValueError("KS distance needs two non-empty samples")
    grid = np.concatenate((xa, xb))  # both ECDFs are right-continuous steps jumping only at sample points
    fa = np.searchsorted(xa, grid, side="right") / xa.size
    fb = np.searchsorted(xb, grid, side="right") / xb.size
    return float(np.abs(fa - fb).max())


@dataclass(frozen=True, slots=True)
class LengthBias:
    """App. E: a policy's consumed response lengths against uniform's on the same prompt stream."""

    mean_ratio: float  # mean(policy) / mean(uniform); 1 = no shift toward shorter or longer responses
    ks: float  # two-sample KS distance between the two length distributions
    responses: int
    reference_responses: int


def _window(batches: Sequence[NDArray[np.int64]], skip: int) -> NDArray[np.int64]:
    kept = list(batches[skip:]) or list(batches)
    return np.concatenate([b.ravel() for b in kept]) if kept else np.zeros(0, np.int64)


def length_bias(run: PolicyRun, reference: PolicyRun, *, skip: int = SKIP_STEPS) -> LengthBias:
    """Ratio of mean lengths and KS distance of `run`'s consumed batches against `reference` (uniform)."""
    x, y = _window(run.batch_lengths, skip), _window(reference.batch_lengths, skip)
    if x.size == 0 or y.size == 0:
        raise ValueError("length bias needs consumed batches in both runs")
    ref_mean = float(y.mean())
    ratio = float(x.mean()) / ref_mean if ref_mean > 0 else math.nan
    return LengthBias(ratio, ks_distance(x, y), int(x.size), int(y.size))


def wasted_share(run: PolicyRun, *, skip: int = SKIP_STEPS) -> float:
    """Aborted-group tokens / all generated tokens (consumed + aborted) over the summary window."""
    steps = run.steps[skip:] or run.steps
    batches = run.batch_lengths[skip:] or run.batch_lengths
    wasted = sum(s.wasted_tokens for s in steps)
    total = wasted + sum(int(b.sum()) for b in batches)
    return wasted / total if total > 0 else 0.0


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """One row of the Table-1-style comparison."""

    policy: str
    mean_step_s: float
    speedup: float  # uniform's mean_step_s / this policy's (same stream, same draws)
    final_q: int
    final_m: int
    wasted_share: float
    bias: LengthBias


def summarize(runs: Mapping[str, PolicyRun], *, skip: int = SKIP_STEPS) -> dict[str, PolicySummary]:
    """Summaries of every run against `runs["uniform"]` (all over the same window)."""
    if "uniform" not in runs:
        raise ConfigError("summaries need the uniform run as the reference")
    base = runs["uniform"].mean_step_s(skip)
    out: dict[str, PolicySummary] = {}
    for name, run in runs.items():
        mean = run.mean_step_s(skip)
        out[name] = PolicySummary(
            name, mean, base / mean if mean > 0 else math.nan, run.final_q, run.final_m,
            wasted_share(run, skip=skip), length_bias(run, runs["uniform"], skip=skip),
        )
    return out
