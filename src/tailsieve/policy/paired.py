"""The paired decision rule (issue 40; docs/controller.md, "The rule"): every option is priced on the same recent
steps' groups, so the lottery of a step cancels out of the comparison and what remains is the spread of the paired
difference.

The predictor draws pool k of every option from history step k mod H (`Predictor(blocks=)`), with the same fresh
groups and the same candidates for every option (common random numbers). For the current option a and an option o,
d_h is the mean over step h's pools of T̂_a − T̂_o (seconds per step), the paired gain is ḡ = mean_h d_h and its
standard error s = sd_h(d_h)/√H. A move to o is worth

    V(o) = horizon · (ḡ − z·s) − C(a → o),

C the one-time seconds of the move (restarts, a return step's waiting candidates). With fewer than two history
steps s is unknown and nothing moves. The controller moves to the option of largest V when it is positive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["Paired", "paired_gain", "value"]


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


def value(gain_s: float, se_s: float, dof: int, cost_s: float, z: float, horizon: int) -> Paired:
    """V = horizon·(ḡ − z·s) − C (module docstring) with its parts; no degree of freedom: s unknown, V = −∞."""
    margin = math.inf if dof < 1 else z * se_s
    v = horizon * (gain_s - margin) - cost_s if math.isfinite(margin) else -math.inf
    return Paired(gain_s, se_s, cost_s, v)
