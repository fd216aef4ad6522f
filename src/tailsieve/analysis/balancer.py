"""TailSieve against verl's request balancer (`verl-lif`), the alternative a verl user already runs.

`plan`'s answer, `simulate`'s summary sentence and `rollout`'s report judge a policy against the balancer, not only
against uniform: "pays" means faster than the balancer beyond the noise band. The band is `analysis.fidelity`'s
paired rule with the balancer's run as the reference: the window's steps paired by step number (same prompt stream,
and in the simulator the same draws), 2·SE of the speedup from the per-step differences.

Standings (`Standing`), decided in this order:
- SAME: the policy never placed a tail pool (q = m = 0 every steady step) and either dealt a group's requests over
  several replicas at some steady step (the uniform boundary's request dispatch, as the balancer deals) or took the
  balancer's step time at every paired step (to 1e-9 relative). It is verl's balancer then, and no speedup is
  claimed whatever the noise says.
- UNKNOWN: fewer than two paired steps.
- PAYS: faster than the balancer, outside the band.
- SLOWER: slower than the balancer, outside the band.
- WITHIN_NOISE: otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum

from tailsieve.analysis.fidelity import paired_2sigma, window
from tailsieve.loop import SKIP_STEPS, PolicyRun
from tailsieve.policy.peers import PEERS

__all__ = ["BALANCER", "BalancerVerdict", "Standing", "against_balancer", "balancer_json", "balancer_verdicts",
           "sentence"]

BALANCER = "verl-lif"  # verl's request balancer (docs/peers.md)
SAME_TIME = 1e-9  # relative: step times this close are the same step time (float summation order)


class Standing(Enum):
    """Where a policy stands against verl's balancer."""

    PAYS = "pays"
    SAME = "same"
    WITHIN_NOISE = "within_noise"
    SLOWER = "slower"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class BalancerVerdict:
    """A policy against verl's balancer over the summary window."""

    policy: str
    standing: Standing
    speedup: float  # the balancer's mean step time / the policy's
    speedup_2sigma: float | None  # relative band (0.03 = ±3.0%); None with fewer than two paired steps
    paired_steps: int
    tail_steps: int  # steady steps with a tail pool (m > 0)
    note: str  # the verdict as one clause, "tailsieve …"

    @property
    def pays(self) -> bool:
        """Faster than the balancer beyond noise."""
        return self.standing is Standing.PAYS


def _pm(band: float, n: int) -> str:
    return f"±{100 * band:.1f}% at 2σ over {n} paired steps"


def against_balancer(run: PolicyRun, balancer: PolicyRun, *, skip: int = SKIP_STEPS) -> BalancerVerdict:
    """The standing of `run` against the balancer's run (module docstring), with its one-clause note."""
    ours = {s.step: s.makespan_s for s in window(run.steps, skip)}
    theirs = {s.step: s.makespan_s for s in window(balancer.steps, skip)}
    mean, ref = sum(ours.values()) / len(ours), sum(theirs.values()) / len(theirs)
    speedup = ref / mean if mean > 0 else math.inf
    band, n = paired_2sigma(run, balancer, skip=skip)
    steady = [s for s in run.steps if not s.warmup]
    tail = sum(1 for s in steady if s.m > 0)
    same_times = ours.keys() == theirs.keys() and all(math.isclose(t, theirs[k], rel_tol=SAME_TIME)
                                                      for k, t in ours.items())
    never = tail == 0 and all(s.q == 0 for s in steady)
    name, x = run.policy, f"{speedup:.3f}×"
    if never and (same_times or any(s.dealt for s in steady)):
        how = ("took verl-lif's step time at every step" if same_times
               else "dealt requests over the replicas as verl-lif does")
        return BalancerVerdict(name, Standing.SAME, speedup, band, n, tail, (
            f"{name} is the same as verl's balancer here: it never placed a tail pool (q = m = 0 every steady "
            f"step) and {how} ({mean:.2f} s a step, verl-lif {ref:.2f} s)"))
    if band is None:
        standing, note = Standing.UNKNOWN, f"too few paired steps ({n}) to tell {name} from verl's balancer"
    elif speedup > 1 and speedup - 1 > band:
        standing, note = Standing.PAYS, f"{name} pays here: {x} verl's balancer ({_pm(band, n)})"
    elif speedup < 1 and 1 - speedup > band:
        standing, note = Standing.SLOWER, (f"{name} does not pay here: it is slower than verl's balancer ({x}, "
                                           f"{_pm(band, n)})")
    else:
        standing, note = Standing.WITHIN_NOISE, (f"{name} does not pay here: {x} verl's balancer is within noise "
                                                 f"({_pm(band, n)})")
    if standing is not Standing.UNKNOWN and never:
        note += "; it never placed a tail pool"
    return BalancerVerdict(name, standing, speedup, band, n, tail, note)


def balancer_json(v: BalancerVerdict) -> dict[str, object]:
    """The verdict as the `vs_balancer` entry of `simulate --json`, report.json and `plan --json`."""
    return {"policy": v.policy, "balancer": BALANCER, "standing": v.standing.value, "pays": v.pays,
            "speedup": v.speedup, "speedup_2sigma": v.speedup_2sigma, "paired_steps": v.paired_steps,
            "tail_steps": v.tail_steps, "note": v.note}


def sentence(v: BalancerVerdict, uniform_speedup: float | None) -> str:
    """The verdict as a sentence, with the policy's speedup over uniform when uniform ran."""
    return v.note + ("." if uniform_speedup is None else f"; {uniform_speedup:.3f}× uniform.")


def balancer_verdicts(runs: Mapping[str, PolicyRun], *, skip: int = SKIP_STEPS,
                      oracles: Collection[str] = ()) -> dict[str, BalancerVerdict]:
    """The verdict of every two-pool policy that ran a step (not uniform, a peer or an oracle) against verl's
    balancer; empty when the balancer has not run a step (a rollout's report mid-run)."""
    if BALANCER not in runs or not runs[BALANCER].steps:
        return {}
    return {name: against_balancer(run, runs[BALANCER], skip=skip) for name, run in runs.items()
            if run.steps and name != "uniform" and name not in PEERS and name not in oracles}
