"""The paired decision rule (issue 40; docs/controller.md, "The rule"): every option is priced on the same recent
steps' groups, so the lottery of a step cancels out of the comparison and what remains is the spread of the paired
difference.

The predictor draws pool k of every option from history step k mod H (`Predictor(blocks=)`), with the same fresh
groups and the same candidates for every option (common random numbers). For the current option a and an option o,
d_h is the mean over step h's pools of T̂_a − T̂_o (seconds per step), the paired gain is ḡ = mean_h d_h and its
standard error s = sd_h(d_h)/√H. A move to o is worth

    V(o) = horizon · (ḡ − t·s) − C(a → o),   t = `t_quantile`(z, H − 1),

C the one-time seconds of the move (restarts, a return step's waiting candidates), t Student's quantile at the
confidence Φ(z) of z normal standard errors: s is estimated from the same H steps, so a short history widens the
margin (issue 48: on the engine half's tuning split, moves on two or three steps of a wrong model). With fewer than
two history steps s is unknown and nothing moves. The controller moves to the option of largest V when it is positive.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["Paired", "paired_gain", "t_quantile", "value"]


@dataclass(frozen=True, slots=True)
class Paired:
    """An option's paired gain over the current one: seconds per step, its standard error, the one-time cost of
    moving there, and the value V of the move over the horizon (module docstring)."""

    gain_s: float
    se_s: float
    cost_s: float
    value_s: float

    @property
    def beyond_noise(self) -> bool:
        """The gain clears its noise margin (the value before the move's cost is positive)."""
        return self.value_s + self.cost_s > 0


def paired_gain(current: NDArray[np.float64], option: NDArray[np.float64], steps: int) -> tuple[float, float, int]:
    """(ḡ, s, dof) of T̂_current − T̂_option over pools drawn by history step (pool k from step k mod `steps`, in
    whole rounds of the steps). The spread that matters is between steps (which prompts a step draws), so with fewer
    than two steps, or pools not in whole rounds of them, the standard error is unknown (infinite, dof 0)."""
    d = np.asarray(current, dtype=np.float64) - np.asarray(option, dtype=np.float64)
    k = d.shape[0]
    if steps < 2 or k % steps:
        return float(d.mean()) if k else 0.0, math.inf, 0
    per = d.reshape(k // steps, steps).mean(axis=0)  # pool k is step k mod H: column h holds step h's pools
    return float(per.mean()), float(per.std(ddof=1) / math.sqrt(steps)), steps - 1


@functools.lru_cache(maxsize=256)
def t_quantile(z: float, dof: int) -> float:
    """Student's t quantile with `dof` degrees of freedom at the normal confidence Φ(z): the margin in standard errors
    that holds z's confidence when the standard error is itself estimated from dof + 1 steps (z beyond 200)."""
    if dof > 200 or z <= 0:
        return z
    target = 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
    lo, hi = 0.0, max(1.0, z)
    while _t_cdf(hi, dof) < target and hi < 1e300:  # Φ(z) rounds to 1 past z ≈ 8.3: the margin is then ~1e300
        lo, hi = hi, hi * 2.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _t_cdf(mid, dof) < target else (lo, mid)
    return 0.5 * (lo + hi)


def _t_cdf(t: float, dof: int) -> float:
    """P(T ≤ t) for t ≥ 0, Student's closed form for integer dof."""
    th = math.atan(t / math.sqrt(dof))
    c2, term, acc = math.cos(th) ** 2, 1.0, 1.0
    if dof % 2:
        for k in range(1, (dof - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            acc += term
        a = 2.0 / math.pi * (th + (math.sin(th) * math.cos(th) * acc if dof > 1 else 0.0))
    else:
        for k in range(1, dof // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            acc += term
        a = math.sin(th) * acc
    return 0.5 * (1.0 + a)


def value(gain_s: float, se_s: float, dof: int, cost_s: float, z: float, horizon: int) -> Paired:
    """V = horizon·(ḡ − t·s) − C, t = `t_quantile`(z, dof) (module docstring), with its parts; no degree of freedom:
    s unknown, V = −∞."""
    margin = math.inf if dof < 1 else t_quantile(z, dof) * se_s
    v = horizon * (gain_s - margin) - cost_s if math.isfinite(margin) else -math.inf
    return Paired(gain_s, se_s, cost_s, v)
