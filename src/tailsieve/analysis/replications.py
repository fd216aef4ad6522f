"""The verdict against verl's balancer over independent replications (issue 50): a narrower noise band.

One run of 30 steps pairs a policy with the balancer step by step on common random numbers (the same prompt stream
and length draws), but on a heavy-tailed workload the paired differences still swing with the step's longest
response, and 28 pairs can leave a ±18% band. More independent runs (seed, seed + 1, ...: a new prompt order and
new draws each, both policies on the same ones) add pairs: the band shrinks as 1/√(paired steps). `replicate` adds
runs of the policy and the balancer only (the other rows of the table keep the first run) until it settles: stop when
|speedup − 1| > band (resolved) and the band is at most `RESOLVE` (10%: a 10% difference would resolve too), when the
band is at most `FLOOR` (a difference that small does not decide anything), or at `max_runs`. The number of runs is
a count, never a clock, so the answer is reproducible. Where it still does not resolve, the verdict says how many
paired steps would (`analysis.balancer`).

Pooling: each later run drops its own first `skip` steps (warm-up) and is appended with its step numbers shifted
past the earlier runs', so `against_balancer` (the paired rule of `analysis.fidelity`) pairs step k of run r of the
policy with step k of run r of the balancer and skips only the first run's warm-up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from typing import Any

from tailsieve.analysis.balancer import against_balancer
from tailsieve.analysis.fidelity import Standing, Verdict
from tailsieve.loop import SKIP_STEPS, PolicyRun

__all__ = ["DEFAULT_RUNS", "FLOOR", "PER_STEP", "RESOLVE", "pool_runs", "replicate", "unpooled_fields"]

DEFAULT_RUNS = 4  # at most this many runs by default (`--replications`): 4 × 28 pairs halve a one-run band
FLOOR = 0.02  # a band (or a difference) of 2% or less: more runs would not change a decision
RESOLVE = 0.10  # a resolved verdict still gets runs while its band is wider than this: a 10% difference must show
PER_STEP = ("batch_lengths", "batch_prompts", "batch_redraws", "batch_truncated", "batch_weights", "batch_delays",
            "batch_offpolicy", "step_dropped")


def pool_runs(runs: Sequence[PolicyRun], skip: int = SKIP_STEPS) -> PolicyRun:
    """One run of `runs` (same policy): the first whole, each later one without its first `skip` steps and with its
    step numbers after the previous ones (module docstring)."""
    first = runs[0]
    steps = list(first.steps)
    per_step = {f: list(getattr(first, f)) for f in PER_STEP}
    for run in runs[1:]:
        offset = (steps[-1].step + 1) if steps else 0
        kept = run.steps[skip:]
        base = kept[0].step if kept else 0
        steps.extend(replace(s, step=offset + s.step - base) for s in kept)
        for f in PER_STEP:
            per_step[f].extend(getattr(run, f)[skip:])
    pooled: dict[str, Any] = {f: tuple(v) for f, v in per_step.items()}
    return replace(first, steps=tuple(steps), **pooled)


def _settled(v: Verdict) -> bool:
    band = v.speedup_2sigma
    if v.standing in (Standing.SAME, Standing.UNKNOWN) or band is None or band <= FLOOR:
        return True
    return v.standing is not Standing.WITHIN_NOISE and band <= RESOLVE  # resolved, and a 10% difference would be


def replicate(first: PolicyRun, balancer: PolicyRun, more: Callable[[int], tuple[PolicyRun, PolicyRun]], *,
              max_runs: int = DEFAULT_RUNS, skip: int = SKIP_STEPS) -> Verdict:
    """The verdict of `first` against `balancer`, adding runs `more(1)`, `more(2)`, ... ((policy, balancer) on the
    r-th independent stream) until it settles or `max_runs` runs are pooled (module docstring)."""
    mine, theirs = [first], [balancer]
    v = against_balancer(first, balancer, skip=skip)
    while not _settled(v) and len(mine) < max_runs:
        run, bal = more(len(mine))
        mine.append(run)
        theirs.append(bal)
        v = against_balancer(pool_runs(mine, skip), pool_runs(theirs, skip), skip=skip, runs=len(mine))
    return v


def unpooled_fields() -> set[str]:
    """`PolicyRun` fields neither pooled per step nor kept from the first run (empty: a new per-step field must be
    added to `PER_STEP`)."""
    kept = {"policy", "steps", "consumed_uids", "length_cap", "own_routing"}
    return {f.name for f in fields(PolicyRun)} - kept - set(PER_STEP)
