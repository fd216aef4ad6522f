"""The model's time warp by batch size (issue 48, item 3; docs/controller.md, "The time warp"): what the controller's
model learns of the engine from the steps it sees, batch size by batch size, where one calibration factor per pool
class (`policy.calibration`) cannot tell a tail pool at batch 1–8 from a bulk pool at batch 60.

For each pool of a step, the all-admit model is run on the step's own requests on the lanes they ran on
(`observed.request_finish`, as calibration does), and the consumed groups' completions are compared in order: the
j-th observed completion with the j-th modelled one, from the first on (what delays every completion on a replica
alike, a prompt prefill, is learnt apart: `policy.prefill_fit`). The gap between the (j − 1)-th and the j-th
modelled completion ran, in the model, at a batch per replica b̄ (the pool's requests still running in the model at
the gap's midpoint, over the pool's replicas); the gap goes to b̄'s bin (powers of two: [1, 2), [2, 4), …, [1024,
∞)), and the observed gap with it. A bin's warp is Σ observed gaps / Σ modelled gaps, both sums decayed by 1 − `ema`
a step (`ControlState.warp_observed`, `warp_modelled`); the warp the predictor uses is the weighted least-squares
line through the bins' log warps (one level and one slope in log b, `warp_factors`). The curves the predictor
prices on are the believed τ(b) × the warp of b's bin. With the engine the model believes,
every warp is 1 (the model's completions are the engine's); a truth curve tilted from the belief, KV-bound queueing
and recompute at large batches, slower replicas: each shows as a warp at the batch sizes where it acts.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from tailsieve.model.curves import TpotCurve
from tailsieve.policy.control_state import ControlState, StepWork
from tailsieve.policy.observed import PoolLanes

__all__ = ["BINS", "bin_of", "learn_warp", "warp_factors", "warp_sums", "warped"]

FloatArray = NDArray[np.float64]
BINS = 11  # batch bins [2^k, 2^(k+1)) for k = 0..9, and [1024, ∞)


def bin_of(b: FloatArray) -> NDArray[np.int64]:
    """The warp bin of each batch per replica (below 1: the first bin)."""
    out: NDArray[np.int64] = np.clip(np.floor(np.log2(np.maximum(b, 1.0))), 0, BINS - 1).astype(np.int64)
    return out


def warp_sums(work: StepWork, pools: tuple[PoolLanes, PoolLanes], fins: tuple[FloatArray, FloatArray],
              prefill_s: float = 0.0) -> tuple[FloatArray, FloatArray]:
    """(observed, modelled) seconds of one step per batch bin, the consumed groups' completion gaps of each pool
    compared in order (module docstring); `fins`: each pool's request finishes on the believed curves without
    prefill (`PoolLanes.finish`), `prefill_s` added; zeros without the groups' completion times
    (`StepWork.done_s`)."""
    obs, mod = np.zeros(BINS), np.zeros(BINS)
    if work.done_s is None:
        return obs, mod
    for pool, f in zip(pools, fins, strict=True):
        kept = work.kept[pool.rows]
        if not kept.any():
            continue
        fin = f + prefill_s * pool.prompts if prefill_s else f
        modelled = np.sort(fin.max(axis=1)[kept])
        observed = np.sort(work.done_s[pool.rows][kept])
        dm, do = np.diff(modelled), np.diff(observed)  # from the first completion on: a prompt prefill delays every
        mid = modelled[1:] - dm / 2.0  # completion on its replica alike, and the gaps leave it out (`prefill_fit`)
        ends = np.sort(fin.ravel())
        running = ends.size - np.searchsorted(ends, mid, side="right")
        bins = bin_of(running / pool.n)
        np.add.at(obs, bins, do)
        np.add.at(mod, bins, dm)
    return obs, mod


def learn_warp(state: ControlState, sums: tuple[FloatArray, FloatArray], a: float) -> ControlState:
    """The state's decayed sums after one step (weight 1 − `a` on the past); a step that measured nothing keeps
    them."""
    obs, mod = sums
    if not mod.any():
        return state
    wo = np.asarray(state.warp_observed) if state.warp_observed else np.zeros(BINS)
    wm = np.asarray(state.warp_modelled) if state.warp_modelled else np.zeros(BINS)
    return replace(state, warp_observed=tuple(((1 - a) * wo + obs).tolist()),
                   warp_modelled=tuple(((1 - a) * wm + mod).tolist()))


def warp_factors(state: ControlState) -> FloatArray | None:
    """(BINS,) warp of each bin: exp(α + β·k) of the least-squares line through the measured bins' log warps
    (bin k, weighted by its modelled seconds; measured: both sums positive), k clamped to the measured range, so
    a tilt is learnt as one slope and a bin seen in a few gaps does not move alone; None before any measurement."""
    if not state.warp_modelled:
        return None
    wm, wo = np.asarray(state.warp_modelled), np.asarray(state.warp_observed)
    seen = np.flatnonzero((wm > 0) & (wo > 0))  # a bin the engine spent no time in measured nothing
    if seen.size == 0:
        return None
    y, w, k = np.log(wo[seen] / wm[seen]), wm[seen], seen.astype(np.float64)
    kbar = float(w @ k / w.sum())
    var = float(w @ (k - kbar) ** 2)
    beta = float(w @ ((k - kbar) * y)) / var if var > 0 else 0.0
    alpha = float(w @ y / w.sum()) - beta * kbar
    out: FloatArray = np.exp(alpha + beta * np.clip(np.arange(BINS), seen[0], seen[-1]))
    return out


def warped(curve: TpotCurve, factors: FloatArray | None) -> TpotCurve:
    """`curve` with each point's τ(b) × the warp of b's bin (`factors` None: the curve itself)."""
    if factors is None:
        return curve
    f = factors[bin_of(np.asarray(curve.batch, dtype=np.float64))]
    return replace(curve, tpot_ms=tuple(float(t) * float(x) for t, x in zip(curve.tpot_ms, f, strict=True)))
