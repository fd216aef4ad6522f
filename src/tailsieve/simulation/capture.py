"""Partial-rollout tail capture (§2.3, Fig. 3), measured by simulation.

Warm-up steps (N + E groups, all replicas bulk, cut at N) at ρ = 5/10/25%; the share of the ground-truth tail groups
that are among the E unfinished ones. Ground truth = the top ⌈f·(N + E)⌉ groups of the step (f = `tail_fraction`)
ranked by longest member (ties: larger total, earlier group) of the prompt's NEXT generation (what a candidate is
meant to predict), and, for reference, of the same generation that was cut. Documented in docs/simulate.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError
from tailsieve.model.baselines import GroupBatch, group_tail_rank
from tailsieve.model.curves import TpotCurve
from tailsieve.policy.router import Router, RouterConfig, RouterState
from tailsieve.policy.step import GroupStatus
from tailsieve.simulation.executor import SimExecutor
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.workloads import Workload

CAPTURE_RHOS: tuple[float, ...] = (0.05, 0.10, 0.25)  # the cutoff percentages of §2.3 / Fig. 3
TAIL_FRACTION = 0.05  # ground-truth tail: top 5% of the N + E groups (≤ E for every ρ ≥ 5%, so recall can reach 1)


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
