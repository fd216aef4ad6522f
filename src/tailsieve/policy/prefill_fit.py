"""The prompt prefill the controller learns from the steps it sees (issue 48, item 3; docs/controller.md, "What the
model learns"): a prefill the model file does not hold (or holds wrong) decides how the uniform boundary should
place a group, dealt request by request (its prompt prefilled on up to G replicas) or whole (once).

In the all-admit model with a prefill term (`lanes.lane_prefill`) every completion on a replica is delayed by p × x,
x the prompts that replica prefills (one per group per replica it reaches) and p the seconds per prompt. Each
consumed group's residual r = observed completion − modelled completion (the warped curves, the current p, the
replica of its last modelled request) is regressed on x through the origin: p ← max(0, p + Σ r·x / Σ x²), one
least-squares correction per step over the step's groups (`ControlState.prefill_s`; NaN: the model file's p).
Only where the model file holds no prefill: a measured one (`tailsieve profile`) is kept, because the residual
also carries every other delay a replica adds (queueing under KV pressure, a slower replica), which the fit would
read as prefill (bench/README.md, the ledger row `no-prefill-fit` under both beliefs).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from tailsieve.policy.control_state import ControlState, StepWork
from tailsieve.policy.observed import PoolLanes

FloatArray = NDArray[np.float64]

__all__ = ["learn_prefill", "prefill_moments"]


def prefill_moments(work: StepWork, pools: tuple[PoolLanes, PoolLanes], fins: tuple[FloatArray, FloatArray],
                    prefill_s: float) -> tuple[float, float]:
    """(Σ r·x, Σ x²) over the step's consumed groups (module docstring); `fins`: each pool's request finishes on
    the warped curves without prefill (`PoolLanes.finish`); zeros without the groups' completion times."""
    rx = xx = 0.0
    if work.done_s is None:
        return rx, xx
    for pool, f in zip(pools, fins, strict=True):
        kept = work.kept[pool.rows]
        if not kept.any():
            continue
        fin = f + prefill_s * pool.prompts
        last = fin.argmax(axis=1)
        rows = np.arange(len(fin))
        x = pool.prompts[rows, last][kept]
        r = work.done_s[pool.rows][kept] - fin[rows, last][kept]
        rx += float(r @ x)
        xx += float(x @ x)
    return rx, xx


def learn_prefill(state: ControlState, moments: tuple[float, float], prior_s: float) -> ControlState:
    """The state's prefill seconds per prompt after one step: the current one (NaN: `prior_s`) corrected by the
    step's least-squares residual, never below 0; a step that measured nothing keeps it, and so does a model file
    that holds a prefill (`prior_s` > 0: `profile` measured it; the fit would read every delay a replica adds,
    queueing under KV pressure included, as prefill)."""
    rx, xx = moments
    if xx <= 0 or prior_s > 0:
        return state
    p = prior_s if math.isnan(state.prefill_s) else state.prefill_s
    return replace(state, prefill_s=max(0.0, p + rx / xx))
