"""Matched-budget speculative comparison (§4.3, Fig. 6a): uniform with depth d_base on every replica against
TailSieve with d_bulk + d_tail = 2·d_base, on the same prompt stream and draws.

For each budget the baseline is `uniform` (every replica bulk, depth d_base); TailSieve runs every split with
d_tail ≥ d_bulk (the paper shifts depth from the high-concurrency bulk route to the tail route; the symmetric split
d_bulk = d_tail = d_base is included) and, for the side-by-side route credit, tail-only speculation (0, d_base).
Speedups are over uniform without speculation (Table 2's reference).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tailsieve.errors import ConfigError
from tailsieve.loop import SKIP_STEPS, PolicyRun
from tailsieve.model.curves import TpotCurve
from tailsieve.model.speculative import MAX_TOKENS, PoolSpec, SpecConfig
from tailsieve.simulation.runs import SimConfig, check_policy, run_policy
from tailsieve.workloads import Workload

DEFAULT_BUDGETS: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6)

OnRun = Callable[[str, int], None]  # (label, steps done) after every simulated step, like `sim.OnStep`


@dataclass(frozen=True, slots=True)
class SplitRun:
    """One TailSieve run at a split (d_bulk, d_tail)."""

    d_bulk: int
    d_tail: int
    mean_step_s: float
    final_q: int
    final_m: int
    tail_bound: float  # share of the measured two-pool steps where the tail pool set the makespan (NaN: none ran)


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """One budget d_base: the uniform baseline and TailSieve at every split of 2·d_base."""

    d_base: int
    baseline_s: float
    splits: tuple[SplitRun, ...]
    tail_only: SplitRun | None = None  # TailSieve with depth d_base on the tail pool only (None at d_base = 0)

    @property
    def symmetric(self) -> SplitRun:
        """TailSieve with depth d_base on every replica (d_base/d_base)."""
        return self.splits[0]

    @property
    def route_credit(self) -> float:
        """Symmetric step time over the best split's: > 1 when route-specific depths beat d/d at this budget."""
        return self.symmetric.mean_step_s / self.best.mean_step_s

    @property
    def best(self) -> SplitRun:
        """TailSieve's fastest split (ties: the more symmetric one)."""
        return min(self.splits, key=lambda s: (s.mean_step_s, s.d_tail))


@dataclass(frozen=True, slots=True)
class BudgetTable:
    """The whole comparison; `reference_s` is uniform without speculation."""

    spec: SpecConfig
    policy: str
    reference_s: float
    rows: tuple[BudgetRow, ...]

    def speedup(self, seconds: float) -> float:
        """Speedup over uniform routing without speculation."""
        return self.reference_s / seconds if seconds > 0 else float("nan")

    @property
    def best_baseline(self) -> BudgetRow:
        """The budget at which uniform is fastest (ties: the smaller budget)."""
        return min(self.rows, key=lambda r: (r.baseline_s, r.d_base))

    @property
    def best_tailsieve(self) -> BudgetRow:
        """The budget at which TailSieve's best split is fastest (ties: the smaller budget)."""
        return min(self.rows, key=lambda r: (r.best.mean_step_s, r.d_base))


def tail_bound_share(run: PolicyRun) -> float:
    """Share of the measured steps (after the first SKIP_STEPS) with a tail pool where T_tail ≥ T_bulk: only then
    can a deeper tail depth shorten the step (NaN when no such step ran)."""
    two_pool = [s for s in run.steps[SKIP_STEPS:] if s.m > 0 and s.q > 0]
    return sum(s.tail_s >= s.bulk_s for s in two_pool) / len(two_pool) if two_pool else math.nan


def check_budgets(budgets: Sequence[int]) -> tuple[int, ...]:
    """Sorted distinct budgets; each in 0..MAX_TOKENS/2 (the tail may take 2·d_base), one-line error otherwise."""
    if not budgets:
        raise ConfigError("--spec-budgets is empty; give depths such as 0,1,2,3")
    for d in budgets:
        if not 0 <= d <= MAX_TOKENS // 2:
            raise ConfigError(f"--spec-budgets values must lie in 0..{MAX_TOKENS // 2}, got {d}")
    return tuple(sorted(set(budgets)))


def matched_budget(
    spec: SpecConfig,
    budgets: Sequence[int],
    workload: Workload,
    curve: TpotCurve,
    config: SimConfig,
    *,
    policy: str = "tailsieve",
    on_step: OnRun | None = None,
    shared: BudgetTable | None = None,
) -> BudgetTable:
    """Run the baseline and every TailSieve split for each budget (method and constants from `spec`). `shared`, a
    table of another method profile on the same stream, lends its runs without speculation (the reference and the
    budget-0 row), which no profile changes."""
    budgets = check_budgets(budgets)
    if policy == "uniform":
        raise ConfigError("the matched-budget comparison needs a two-pool policy, not uniform")
    check_policy(policy, config.router.replicas)

    def run(name: str, pools: PoolSpec, label: str) -> PolicyRun:
        tick = None if on_step is None else (lambda _n, i: on_step(label, i))
        return run_policy(name, workload, curve, replace(config, spec=pools), on_step=tick)

    def split(d_bulk: int, d_tail: int) -> SplitRun:
        pools = PoolSpec(tail=spec.with_tokens(d_tail), bulk=spec.with_tokens(d_bulk))
        r = run(policy, pools, f"{policy} {d_bulk}/{d_tail}")
        return SplitRun(d_bulk, d_tail, r.mean_step_s(), r.final_q, r.final_m, tail_bound_share(r))

    off = spec.with_tokens(0)
    zero = next((r for r in shared.rows if r.d_base == 0), None) if shared is not None else None
    reference = (shared.reference_s if shared is not None else
                 run("uniform", PoolSpec.uniform(off), "uniform d=0").mean_step_s())
    rows: list[BudgetRow] = []
    for d in budgets:
        if d == 0 and zero is not None:
            rows.append(zero)
            continue
        base = reference if d == 0 else run("uniform", PoolSpec.uniform(spec.with_tokens(d)), f"uniform d={d}")
        splits = tuple(split(2 * d - d_tail, d_tail) for d_tail in range(d, 2 * d + 1))
        tail_only = split(0, d) if d > 0 else None
        rows.append(BudgetRow(d, base if isinstance(base, float) else base.mean_step_s(), splits, tail_only))
    return BudgetTable(spec, policy, reference, tuple(rows))
