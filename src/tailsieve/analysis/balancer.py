"""TailSieve against verl's request balancer (`verl-lif`), the alternative a verl user already runs.

`plan`'s answer, `simulate`'s summary sentence and `rollout`'s report judge a policy against the balancer, not only
against uniform: "pays" means faster than the balancer beyond the noise band. The band is `analysis.fidelity`'s
paired rule with the balancer's run as the reference: the window's steps paired by step number (same prompt stream,
and in the simulator the same draws), 2·SE of the speedup from the per-step differences.

The result is `analysis.fidelity`'s `Verdict`, the one shape of every paired comparison. Standings (`Standing`),
decided in this order:
- SAME: the policy never placed a tail pool (q = m = 0 every steady step) and either dealt a group's requests over
  several replicas at some steady step (the uniform boundary's request dispatch, as the balancer deals) or took the
  balancer's step time at every paired step (to 1e-9 relative). It is verl's balancer then, and no speedup is
  claimed whatever the noise says.
- UNKNOWN: fewer than two paired steps.
- PAYS: faster than the balancer, outside the band.
- SLOWER: slower than the balancer, outside the band.
- WITHIN_NOISE: otherwise; the note then says about how many paired steps would resolve a difference of the size
  seen (n · (band / |speedup − 1|)², the difference at least `RESOLVE_FLOOR`), or, with a band of at most
  `RESOLVE_FLOOR`, that any difference of that size would have shown.

Every note carries the length bias in the same clause: the policy's mean consumed response length against the
balancer's over the same window ("1.086× verl's balancer, responses 3.5% shorter"). `runs` > 1: the runs were pooled
over independent replications (`analysis.replications`), and the band says so.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

import numpy as np

from tailsieve.analysis.fidelity import Standing, Verdict, left_uniform, paired_2sigma, tail_steps, window
from tailsieve.loop import SKIP_STEPS, PolicyRun
from tailsieve.policy.peers import PEERS

__all__ = ["BALANCER", "Standing", "against_balancer", "balancer_json", "balancer_verdicts",
           "length_phrase", "length_ratio", "sentence", "steps_to_resolve"]

BALANCER = "verl-lif"  # verl's request balancer (docs/peers.md)
SAME_TIME = 1e-9  # relative: step times this close are the same step time (float summation order)
RESOLVE_FLOOR = 0.02  # steps to resolve are counted for a difference of at least 2% (smaller decides nothing)


def _pm(band: float, n: int, runs: int = 1) -> str:
    return f"±{100 * band:.1f}% at 2σ over {n} paired steps" + (f" in {runs} runs" if runs > 1 else "")


def length_ratio(run: PolicyRun, balancer: PolicyRun, *, skip: int = SKIP_STEPS) -> float | None:
    """Mean consumed response length of `run` over the balancer's, same window (None without lengths)."""
    mine = [np.asarray(b).ravel() for b in window(run.batch_lengths, skip)]
    theirs = [np.asarray(b).ravel() for b in window(balancer.batch_lengths, skip)]
    a = np.concatenate(mine) if mine else np.zeros(0)
    b = np.concatenate(theirs) if theirs else np.zeros(0)
    if not a.size or not b.size or float(b.mean()) <= 0:
        return None
    return float(a.mean()) / float(b.mean())


def length_phrase(ratio: float | None) -> str:
    """", responses 3.5% shorter" (", responses as long" within 0.05%; "" when unknown)."""
    if ratio is None:
        return ""
    if abs(ratio - 1) < 0.0005:
        return ", responses as long"
    return f", responses {100 * abs(1 - ratio):.1f}% {'shorter' if ratio < 1 else 'longer'}"


def steps_to_resolve(speedup: float, band: float | None, n: int) -> int | None:
    """Paired steps at which the band (∝ 1/√n) falls to the difference seen, at least `RESOLVE_FLOOR`."""
    if band is None or n < 2:
        return None
    return math.ceil(n * (band / max(abs(speedup - 1.0), RESOLVE_FLOOR)) ** 2)


def against_balancer(run: PolicyRun, balancer: PolicyRun, *, skip: int = SKIP_STEPS, runs: int = 1) -> Verdict:
    """The standing of `run` against the balancer's run (module docstring), with its one-clause note."""
    ours = {s.step: s.makespan_s for s in window(run.steps, skip)}
    theirs = {s.step: s.makespan_s for s in window(balancer.steps, skip)}
    mean, ref = sum(ours.values()) / len(ours), sum(theirs.values()) / len(theirs)
    speedup = ref / mean if mean > 0 else math.inf
    band, n = paired_2sigma(run, balancer, skip=skip)
    steady = [s for s in run.steps if not s.warmup]
    tail = tail_steps(run)
    same_times = ours.keys() == theirs.keys() and all(math.isclose(t, theirs[k], rel_tol=SAME_TIME)
                                                      for k, t in ours.items())
    never = tail == 0 and all(s.q == 0 for s in steady)
    ratio = length_ratio(run, balancer, skip=skip)
    name, x = run.policy, f"{speedup:.3f}× verl's balancer{length_phrase(ratio)}"
    if never and (same_times or any(s.dealt for s in steady)):
        grouped = sum(not s.dealt for s in steady)  # e.g. the controller's probe of whole groups
        how = ("took verl-lif's step time at every step" if same_times
               else "dealt requests over the replicas as verl-lif does"
               + (f" on all but {grouped} step{'s' if grouped > 1 else ''}, which placed whole groups" if grouped
                  else ""))
        return Verdict(name, BALANCER, Standing.SAME, speedup, band, n, (
            f"{name} is the same as verl's balancer here: it never placed a tail pool (q = m = 0 every steady "
            f"step) and {how} ({mean:.2f} s a step, verl-lif {ref:.2f} s)"), left_uniform(run), tail, ratio, runs)
    needed = None
    if band is None:
        standing, note = Standing.UNKNOWN, f"too few paired steps ({n}) to tell {name} from verl's balancer"
    elif speedup > 1 and speedup - 1 > band:
        standing, note = Standing.PAYS, f"{name} pays here: {x} ({_pm(band, n, runs)})"
    elif speedup < 1 and 1 - speedup > band:
        standing, note = Standing.SLOWER, f"{name} does not pay here: it is slower ({x}, {_pm(band, n, runs)})"
    elif band <= RESOLVE_FLOOR:  # a difference that matters would have shown: nothing more to run
        standing, note = Standing.WITHIN_NOISE, (f"{name} does not pay here: {x}, within noise "
                                                 f"({_pm(band, n, runs)}), a band narrow enough to show any "
                                                 f"difference of {100 * RESOLVE_FLOOR:g}% or more")
    else:
        needed = steps_to_resolve(speedup, band, n)
        diff = 100 * max(abs(speedup - 1.0), RESOLVE_FLOOR)
        standing, note = Standing.WITHIN_NOISE, (f"{name} does not pay here: {x}, within noise "
                                                 f"({_pm(band, n, runs)}); about {needed} paired steps would resolve "
                                                 f"a {diff:.1f}% difference")
    if standing is not Standing.UNKNOWN and never:
        note += "; it never placed a tail pool"
    return Verdict(name, BALANCER, standing, speedup, band, n, note, left_uniform(run), tail, ratio, runs, needed)


def balancer_json(v: Verdict) -> dict[str, object]:
    """The verdict as the `vs_balancer` entry of `simulate --json`, report.json and `plan --json`."""
    return {"policy": v.policy, "balancer": v.reference, "standing": v.standing.value, "pays": v.pays,
            "speedup": v.speedup, "speedup_2sigma": v.speedup_2sigma, "paired_steps": v.paired_steps,
            "tail_steps": v.tail_steps, "length_ratio": v.length_ratio, "runs": v.runs,
            "steps_needed": v.steps_needed, "note": v.note}


def sentence(v: Verdict, uniform_speedup: float | None) -> str:
    """The verdict as a sentence, with the policy's speedup over uniform when uniform ran."""
    return v.note + ("." if uniform_speedup is None else f"; {uniform_speedup:.3f}× uniform.")


def balancer_verdicts(runs: Mapping[str, PolicyRun], *, skip: int = SKIP_STEPS,
                      oracles: Collection[str] = ()) -> dict[str, Verdict]:
    """The verdict of every two-pool policy that ran a step (not uniform, a peer or an oracle) against verl's
    balancer; empty when the balancer has not run a step (a rollout's report mid-run)."""
    if BALANCER not in runs or not runs[BALANCER].steps:
        return {}
    return {name: against_balancer(run, runs[BALANCER], skip=skip) for name, run in runs.items()
            if run.steps and name != "uniform" and name not in PEERS and name not in oracles}
