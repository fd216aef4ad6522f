"""Run metrics: routing-induced length bias (App. E), partial-rollout tail capture (§2.3, Fig. 3), wasted tokens.

- `length_bias`: the responses a policy consumed against those `uniform` consumed on the same prompt stream, over
  the summary window (all steps but the first `SKIP_STEPS`): ratio of means and the exact two-sample KS distance.
- `wasted_share`: tokens of aborted (cut) groups over all tokens generated, same window.
- `capture_rates`: warm-up steps (N + E groups, all replicas bulk, cut at N) at ρ = 5/10/25%; the share of the
  ground-truth tail groups that are among the E unfinished ones. Ground truth = the top ⌈f·(N + E)⌉ groups of the
  step (f = `tail_fraction`) ranked by longest member (ties: larger total, earlier group) of the prompt's NEXT
  generation (what a candidate is meant to predict), and, for reference, of the same generation that was cut.
Definitions and the window are documented in docs/simulate.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailsieve.baselines import GroupBatch, group_tail_rank
from tailsieve.curves import TpotCurve
from tailsieve.errors import ConfigError
from tailsieve.replica import ReplicaConfig
from tailsieve.router import GroupStatus, Router, RouterConfig, RouterState
from tailsieve.sim import SKIP_STEPS, PolicyRun, SimExecutor
from tailsieve.workloads import Workload

CAPTURE_RHOS: tuple[float, ...] = (0.05, 0.10, 0.25)  # the cutoff percentages of §2.3 / Fig. 3
TAIL_FRACTION = 0.05  # ground-truth tail: top 5% of the N + E groups (≤ E for every ρ ≥ 5%, so recall can reach 1)


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


@dataclass(frozen=True, slots=True)
class CaptureRate:
    """§2.3 / Fig. 3: ground-truth tail groups caught among the unfinished groups at cutoff ρ (micro-averaged)."""

    rho: float
    candidates: int  # E = ⌈ρN⌉ unfinished groups per step
    tail_groups: int  # k ground-truth tail groups per step
    next_generation: float  # recall of the top-k by the prompt's next generation (the cross-round signal)
    same_generation: float  # recall of the top-k by the generation that was cut
    longest_group: float  # recall of the single longest group of the next generation
    steps: int


def _top(lengths: NDArray[np.int64], k: int) -> NDArray[np.bool_]:
    rank = group_tail_rank(GroupBatch(lengths))
    out: NDArray[np.bool_] = rank < k
    return out


def capture_rates(
    workload: Workload,
    curve: TpotCurve,
    router: RouterConfig,
    *,
    rhos: Sequence[float] = CAPTURE_RHOS,
    steps: int = 10,
    tail_fraction: float = TAIL_FRACTION,
    replica: ReplicaConfig | None = None,
    shuffle: bool = False,
    seed: int = 0,
) -> tuple[CaptureRate, ...]:
    """Run `steps` warm-up steps per ρ on consecutive prompts (fresh draws) and measure tail capture."""
    if steps < 1:
        raise ConfigError(f"capture steps must be >= 1, got {steps}")
    if not 0.0 < tail_fraction <= 1.0:
        raise ConfigError(f"tail_fraction must lie in (0, 1], got {tail_fraction}")
    out: list[CaptureRate] = []
    for rho in rhos:
        rc = replace(router, rho=rho)
        plan_router = Router(rc, workload.prompts, shuffle=shuffle, seed=seed)
        executor = SimExecutor(workload, curve, rc, replica)
        n_all = rc.groups + rc.extra
        k = max(1, math.ceil(tail_fraction * n_all - 1e-9))
        hits = np.zeros(3, dtype=np.int64)
        state = plan_router.initial_state()
        for s in range(steps):
            plan = plan_router.warmup(state)
            result = executor.execute(plan)
            cut = np.array([o.status is GroupStatus.ABORTED for o in result.outcomes])
            same = executor.last_lengths
            nxt = np.stack([
                workload.lengths(ref.prompt_id, executor.generation[ref.prompt_id], s + 1, rc.group_size)
                for ref in plan.bulk
            ])
            hits += [int((cut & _top(nxt, k)).sum()), int((cut & _top(same, k)).sum()), int((cut & _top(nxt, 1)).sum())]
            state = RouterState(step=s + 1, stream=plan.stream_after)  # cut groups are dropped: measurement only
        rates = hits / np.array([k * steps, k * steps, steps])
        out.append(CaptureRate(rho, rc.extra, k, float(rates[0]), float(rates[1]), float(rates[2]), steps))
    return tuple(out)
