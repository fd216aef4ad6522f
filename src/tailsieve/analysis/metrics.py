"""Run metrics (pure statistics over finished runs): routing-induced length bias (App. E) and wasted tokens.

- `length_bias`: the responses a policy consumed against those `uniform` consumed on the same prompt stream, over
  the summary window (all steps but the first `SKIP_STEPS`): ratio of means and the exact two-sample KS distance.
- `wasted_share`: tokens of aborted (cut) groups over all tokens generated, same window.
- `summarize`: one `PolicySummary` per run (mean step, speedup, final q/m, wasted share, bias, step spread, and
  the fidelity of `tailsieve.analysis.fidelity`: redraws, truncation, the within-noise verdict), which
  `tailsieve.analysis.report` turns into the JSON and the table of `simulate` and `rollout`.
The partial-rollout capture rate (§2.3) runs the simulator and lives in `tailsieve.simulation.capture`.
Definitions and the window are documented in docs/simulate.md.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailsieve.analysis.fidelity import (
    NO_REDRAWS,
    BatchFidelity,
    Redraws,
    Truncation,
    Verdict,
    batch_fidelity,
    fidelity_of,
    window,
)
from tailsieve.analysis.weights import Weighting, weighted_bias
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
    return LengthBias(mean_ratio=ratio, ks=ks_distance(x, y), responses=int(x.size), reference_responses=int(y.size))


def wasted_share(run: PolicyRun, *, skip: int = SKIP_STEPS) -> float:
    """Aborted-group tokens / all generated tokens (consumed + aborted) over the summary window."""
    steps = run.steps[skip:] or run.steps
    batches = run.batch_lengths[skip:] or run.batch_lengths
    wasted = sum(s.wasted_tokens for s in steps)
    total = wasted + sum(int(b.sum()) for b in batches)
    return wasted / total if total > 0 else 0.0


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """One policy's row of the comparison (`simulate` and `rollout`; serialized by `tailsieve.analysis.report`)."""

    policy: str
    mean_step_s: float
    speedup: float | None  # uniform's mean_step_s / this policy's (same stream, same draws); None without uniform
    final_q: int
    final_m: int
    wasted_share: float
    bias: LengthBias | None  # against uniform; None without uniform
    step_s_std: float  # spread of the step makespans over the window (population std, min, max)
    step_s_min: float
    step_s_max: float
    oracle: bool = False  # knows realized lengths (simulator baselines, App. A.2)
    redraws: Redraws = NO_REDRAWS
    truncation: Truncation | None = None  # reference share and ratio None without uniform
    verdict: Verdict | None = None  # non-uniform, non-oracle policies against uniform
    weighting: Weighting | None = None  # bias correction (opt-in): None when off or without uniform
    batch: BatchFidelity | None = None  # off-policy tokens, dropped / delayed prompts, batch length CV


def weighting_of(run: PolicyRun, reference: PolicyRun | None, *, skip: int = SKIP_STEPS) -> Weighting | None:
    """The weighted length ratio and ESS of a run that carries bias-correction weights, against uniform."""
    if reference is None or not run.batch_weights:
        return None
    ref = _window(reference.batch_lengths, skip)
    return weighted_bias(window(run.batch_lengths, skip), window(run.batch_weights, skip), float(ref.mean()))


def step_times(run: PolicyRun, *, skip: int = SKIP_STEPS) -> NDArray[np.float64]:
    """The step makespans of the summary window (all steps when the run is not longer than the window)."""
    steps = run.steps[skip:] or run.steps
    return np.array([s.makespan_s for s in steps], dtype=np.float64)


def summarize(runs: Mapping[str, PolicyRun], *, skip: int = SKIP_STEPS,
              oracles: Collection[str] = ()) -> dict[str, PolicySummary]:
    """Summaries of every run with steps, against `runs["uniform"]` when it ran (speedup, bias None otherwise)."""
    ref = runs.get("uniform")
    ref = ref if ref is not None and ref.steps else None
    base = ref.mean_step_s(skip) if ref is not None else None
    out: dict[str, PolicySummary] = {}
    for name, run in runs.items():
        if not run.steps:
            continue
        mean, times = run.mean_step_s(skip), step_times(run, skip=skip)
        speedup = base / mean if base is not None and mean > 0 else None
        redraws, trunc, verdict = fidelity_of(run, ref, speedup, skip=skip,
                                              judge=name != "uniform" and name not in oracles)
        out[name] = PolicySummary(
            policy=name, mean_step_s=mean, speedup=speedup,
            final_q=run.final_q, final_m=run.final_m, wasted_share=wasted_share(run, skip=skip),
            bias=None if ref is None else length_bias(run, ref, skip=skip), step_s_std=float(times.std()),
            step_s_min=float(times.min()), step_s_max=float(times.max()), oracle=name in oracles,
            redraws=redraws, truncation=trunc, verdict=verdict, weighting=weighting_of(run, ref, skip=skip),
            batch=batch_fidelity(run, skip=skip),
        )
    return out
