"""Fidelity beside every speedup (pure statistics over finished runs, same window as `metrics`):

- `redraws`: how many times each consumed group's prompt draw had been cut before it completed (max, mean).
- `truncation`: share of consumed responses at the length cap (explicit flags, else `length >= length_cap`), the
  policy's against uniform's on the same prompt stream; the ratio is None (with a reason) when uniform truncated
  nothing or the cap is unknown.
- `verdict`: whether the speedup is within noise of uniform (paired per-step rule below) and whether the controller
  ever left the uniform boundary (a steady step with m > 0), as a `Verdict` (a `Standing`, the speedup and its band):
  the one result shape of every paired comparison, against verl's balancer too (`analysis.balancer`).

Noise rule: pair the window's steps of the policy and uniform by step number (same prompt stream, and in the
simulator the same draws), d_i = T_uniform,i − T_policy,i. The speedup is mean(T_uniform) / mean(T_policy), so
speedup − 1 ≈ mean(d) / mean(T_policy), whose standard error is SE = std(d, ddof=1) / √n / mean(T_policy).
`speedup_2sigma` = 2·SE (relative: 0.009 = ±0.9%); the speedup is within noise when |speedup − 1| ≤ 2·SE.
Fewer than two paired steps cannot be told from noise (within noise, `speedup_2sigma` None).
- `batch_fidelity`: what a policy does to the update batches beyond their lengths (issue 16, docs/peers.md):
  `off_policy_token_share` = consumed tokens generated in an earlier step than the one that consumed them (a
  partial rollout's resumed prefixes: an older policy's tokens) / all consumed tokens; `dropped_prompt_share` =
  prompts dropped unconsumed / (consumed + dropped); `delayed_prompt_share` = consumed groups whose prompt was first
  dispatched two or more steps before the step that consumed it (delayed by more than one step; TailSieve's
  regenerated cut group, consumed the step after its cut, has delay 1 and is not counted); `batch_length_cv` = the
  coefficient of variation (population std / mean) of the per-step mean consumed response length. All over the
  window; a run that carries no such data (uniform, oracles, older files) has zeros there and its own length CV.
Definitions: docs/simulate.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from tailsieve.loop import SKIP_STEPS, PolicyRun

T = TypeVar("T")


def window(per_step: Sequence[T], skip: int = SKIP_STEPS) -> list[T]:
    """The summary window of a per-step sequence: all but the first `skip` (all when not longer)."""
    return list(per_step[skip:]) or list(per_step)


@dataclass(frozen=True, slots=True)
class Redraws:
    """Times a consumed group had been cut before it completed, over the window's consumed groups."""

    max: int
    mean: float


NO_REDRAWS = Redraws(0, 0.0)


def redraws(run: PolicyRun, *, skip: int = SKIP_STEPS) -> Redraws:
    """Max and mean redraws of the window's consumed groups (0 for runs that carry none: uniform, old files)."""
    kept = [np.asarray(r, dtype=np.int64).ravel() for r in window(run.batch_redraws, skip)]
    flat = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    return Redraws(int(flat.max()), float(flat.mean())) if flat.size else NO_REDRAWS


def truncated_share(run: PolicyRun, *, skip: int = SKIP_STEPS) -> tuple[float | None, str]:
    """Share of the window's consumed responses that hit the length cap, or None and why it is unknown."""
    if run.batch_truncated:
        flags = window(run.batch_truncated, skip)
        if any(f is None for f in flags):
            return None, f"{run.policy}: steps without finish reasons or cap (written by an older version)"
        flat = np.concatenate([np.asarray(f, dtype=bool).ravel() for f in flags if f is not None])
        return (float(flat.mean()), "") if flat.size else (None, f"{run.policy}: no consumed responses")
    if run.length_cap is None:
        return None, "length cap unknown (the workload has no max_length)"
    lengths = [b.ravel() for b in window(run.batch_lengths, skip)]
    flat_l = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    return (float((flat_l >= run.length_cap).mean()), "") if flat_l.size else (None, "no consumed responses")


@dataclass(frozen=True, slots=True)
class Truncation:
    """Truncated shares of a policy and of uniform, their ratio, and why the ratio is missing when it is."""

    share: float | None
    reference_share: float | None
    ratio: float | None  # share / reference_share; None when unknown or uniform truncated nothing
    reason: str = ""  # why `ratio` is None ("" when it is set)


def truncation(run: PolicyRun, reference: PolicyRun, *, skip: int = SKIP_STEPS) -> Truncation:
    """The policy's truncated share against uniform's (`truncated_ratio` of the report)."""
    share, why = truncated_share(run, skip=skip)
    ref, ref_why = truncated_share(reference, skip=skip)
    if share is None or ref is None:
        return Truncation(share, ref, None, why or ref_why)
    if ref == 0:
        return Truncation(share, ref, None, "uniform truncated no response: compare the two shares")
    return Truncation(share, ref, share / ref)


class Standing(Enum):
    """Where a policy stands against a reference run (uniform, verl's balancer), its steps paired by step number."""

    PAYS = "pays"  # faster than the reference, outside the band
    SAME = "same"  # routes as the reference does: no speedup is claimed whatever the noise says
    WITHIN_NOISE = "within_noise"
    SLOWER = "slower"  # slower than the reference, outside the band
    UNKNOWN = "unknown"  # fewer than two paired steps


@dataclass(frozen=True, slots=True)
class Verdict:
    """A policy against a reference run over the summary window, paired by step (the noise rule above): where it
    stands, the speedup with its paired band, and the verdict as one clause. Every verdict has this shape: against
    uniform (`verdict`) and against verl's balancer (`analysis.balancer.against_balancer`, pooled over replications
    by `analysis.replications`)."""

    policy: str
    reference: str  # the reference run's policy ("uniform", "verl-lif")
    standing: Standing
    speedup: float  # the reference's mean step time / the policy's
    speedup_2sigma: float | None  # 2 standard errors of the speedup, relative (0.009 = ±0.9%); None: < 2 pairs
    paired_steps: int
    note: str  # the verdict as one clause
    left_uniform: bool = True  # routed other than uniform at some steady step (`left_uniform`)
    tail_steps: int = 0  # steady steps with a tail pool (m > 0)
    length_ratio: float | None = None  # mean consumed response length / the reference's (None: not compared)
    runs: int = 1  # independent runs pooled (`analysis.replications`)
    steps_needed: int | None = None  # WITHIN_NOISE: paired steps that would resolve the difference seen

    @property
    def within_noise(self) -> bool:
        """|speedup − 1| within the band, or no band (fewer than two paired steps)."""
        return self.speedup_2sigma is None or abs(self.speedup - 1.0) <= self.speedup_2sigma

    @property
    def pays(self) -> bool:
        """Faster than the reference beyond noise."""
        return self.standing is Standing.PAYS


def left_uniform(run: PolicyRun) -> bool:
    """Did the run ever route other than uniform: its own routing (a peer), or a steady step with a tail pool or a
    group's requests dealt over several replicas (`StepRecord.dealt`)?"""
    return run.own_routing or any(s.m > 0 or s.dealt for s in run.steps if not s.warmup)


def tail_steps(run: PolicyRun) -> int:
    """Steady steps with a tail pool (m > 0)."""
    return sum(1 for s in run.steps if not s.warmup and s.m > 0)


def paired_2sigma(run: PolicyRun, reference: PolicyRun, *, skip: int = SKIP_STEPS) -> tuple[float | None, int]:
    """2·SE of the speedup from the window's per-step differences paired by step number, and the pair count."""
    mine = {s.step: s.makespan_s for s in window(run.steps, skip)}
    ref = {s.step: s.makespan_s for s in window(reference.steps, skip)}
    common = sorted(mine.keys() & ref.keys())
    if len(common) < 2:
        return None, len(common)
    p = np.array([mine[k] for k in common])
    d = np.array([ref[k] for k in common]) - p
    se = float(d.std(ddof=1)) / math.sqrt(len(common)) / float(p.mean())
    return 2 * se, len(common)


def verdict(run: PolicyRun, reference: PolicyRun, speedup: float, *, skip: int = SKIP_STEPS) -> Verdict:
    """The noise rule (module docstring) and the uniform-boundary check, with the footnote that says why."""
    band, n = paired_2sigma(run, reference, skip=skip)
    left = left_uniform(run)
    pm = "?" if band is None else f"±{100 * band:.1f}%"
    if band is None:
        standing, note = Standing.UNKNOWN, f"too few paired steps ({n}) to tell the speedup from noise"
    elif not left:
        standing, note = Standing.SAME, ("never left the uniform boundary (q = m = 0 every steady step) — uniform's "
                                         f"routing, the difference is noise ({pm} at 2σ)")
    elif abs(speedup - 1.0) <= band:
        standing, note = Standing.WITHIN_NOISE, f"within noise of uniform ({pm} at 2σ over {n} paired steps)"
    else:
        standing = Standing.PAYS if speedup > 1 else Standing.SLOWER
        note = f"{speedup:.3f}× is outside noise ({pm} at 2σ over {n} paired steps)"
    return Verdict(run.policy, reference.policy, standing, speedup, band, n, note, left, tail_steps(run))


def fidelity_of(run: PolicyRun, reference: PolicyRun | None, speedup: float | None, *, skip: int = SKIP_STEPS,
                judge: bool = True) -> tuple[Redraws, Truncation, Verdict | None]:
    """Redraws, truncation (reference share None without uniform) and the verdict (None unless `judge`)."""
    if reference is None:
        share, why = truncated_share(run, skip=skip)
        return redraws(run, skip=skip), Truncation(share, None, None, why or "no uniform run"), None
    v = verdict(run, reference, speedup, skip=skip) if judge and speedup is not None else None
    return redraws(run, skip=skip), truncation(run, reference, skip=skip), v



@dataclass(frozen=True, slots=True)
class BatchFidelity:
    """Off-policy tokens, dropped and delayed prompts, and the spread of batch mean lengths (`batch_fidelity`)."""

    off_policy_token_share: float
    dropped_prompt_share: float
    delayed_prompt_share: float
    batch_length_cv: float


def _flat(per_step: Sequence[NDArray[np.int64]], skip: int) -> NDArray[np.int64]:
    kept = [np.asarray(x, dtype=np.int64).ravel() for x in window(per_step, skip)]
    return np.concatenate(kept) if kept else np.zeros(0, np.int64)


def batch_fidelity(run: PolicyRun, *, skip: int = SKIP_STEPS) -> BatchFidelity:
    """The four batch-fidelity shares of the window (module docstring)."""
    batches = window(run.batch_lengths, skip)
    tokens = sum(int(b.sum()) for b in batches)
    groups = sum(int(b.shape[0]) for b in batches)
    off = int(_flat(run.batch_offpolicy, skip).sum()) if run.batch_offpolicy else 0
    delayed = int((_flat(run.batch_delays, skip) >= 2).sum()) if run.batch_delays else 0
    dropped = sum(window(run.step_dropped, skip)) if run.step_dropped else 0
    means = np.array([float(b.mean()) for b in batches if b.size], dtype=np.float64)
    cv = float(means.std() / means.mean()) if means.size and means.mean() > 0 else 0.0
    return BatchFidelity(off_policy_token_share=off / tokens if tokens else 0.0,
                         dropped_prompt_share=dropped / (groups + dropped) if groups + dropped else 0.0,
                         delayed_prompt_share=delayed / groups if groups else 0.0, batch_length_cv=cv)
