"""What the makespan model forecasts for one step's actual work (§2.1 all-admit model, §3.2 calibration).

The controller's calibration factors (c_tail, c_bulk, c_uniform) are measured / predicted pool times. Against the
bootstrap forecast, that ratio mixes the model's error with the luck of the step's draw: one regenerated group
with a response at the length cap doubles T_tail and, through an EMA, makes every split look slow for many steps
(issue 22). Here the prediction is made on the step's own requests, on the lanes they ran on: the tail pool's
groups to completion, the bulk pool's consumed groups plus the cut ones stopped at their progress (in the
all-admit model a request that stops at the cutoff leaves its lane as an abort does, up to the one iteration its
progress, counted in whole tokens, leaves out). The ratio is then the model's error alone (1 for the simulator's
all-admit replicas, exactly or within one decode iteration when pinned groups outlast the cutoff), and the draw's
luck goes where it belongs, into the length history.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from tailsieve.model.curves import TpotCurve
from tailsieve.policy.control_state import StepWork
from tailsieve.policy.lanes import lane_finish_times, lane_prefill

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True, eq=False)
class PoolLanes:
    """One pool of a step as the model runs it: its rows of the step's work, its requests on dense replica ids, and
    the prompts each request's replica prefills (one per group per replica it reaches, `lanes.lane_prefill`)."""

    rows: slice
    lengths: NDArray[np.int64]  # (P, G)
    dense: NDArray[np.int64]  # (P, G) replica of each request, 0..n − 1
    n: int
    prompts: FloatArray  # (P, G) prompts prefilled on each request's replica

    @classmethod
    def of(cls, lengths: NDArray[np.int64], lanes: NDArray[np.int64], rows: slice = slice(None)) -> PoolLanes:
        """The pool of `lengths` on `lanes` (any replica ids)."""
        if lengths.size == 0:
            z = np.zeros(lengths.shape, dtype=np.int64)
            return cls(rows, lengths, z, 0, z.astype(np.float64))
        _, dense = np.unique(lanes.ravel(), return_inverse=True)
        dense = dense.reshape(lanes.shape).astype(np.int64)
        n = int(dense.max()) + 1
        return cls(rows, lengths, dense, n, lane_prefill(dense, n, 1.0)[dense])

    def finish(self, curve: TpotCurve, kv_s_per_token: float, prefill_s: float = 0.0) -> FloatArray:
        """(P, G) all-admit finish time of each request (§2.1) with `prefill_s` seconds per prompt its replica
        prefills."""
        if self.lengths.size == 0:
            return np.zeros(self.lengths.shape)
        fin = lane_finish_times(self.lengths.ravel().astype(np.float64), self.dense.ravel(), self.n, curve,
                                kv_s_per_token).reshape(self.lengths.shape)
        out: FloatArray = fin + prefill_s * self.prompts if prefill_s else fin
        return out


def pool_lanes(work: StepWork) -> tuple[PoolLanes, PoolLanes]:
    """The step's tail pool and bulk pool (the whole step at the uniform boundary) as the model runs them."""
    t = work.tail
    return (PoolLanes.of(work.lengths[:t], work.lanes[:t], slice(0, t)),
            PoolLanes.of(work.lengths[t:], work.lanes[t:], slice(t, None)))


def request_finish(lengths: NDArray[np.int64], lanes: NDArray[np.int64], curve: TpotCurve, kv_s_per_token: float,
                   prefill_s: float) -> FloatArray:
    """(P, G) all-admit finish time of each request of one pool, on the given replicas (any ids), with one prompt
    prefill per group per replica (`predictor.lane_prefill`)."""
    return PoolLanes.of(lengths, lanes).finish(curve, kv_s_per_token, prefill_s)


def pool_finish(lengths: NDArray[np.int64], lanes: NDArray[np.int64], curve: TpotCurve, kv_s_per_token: float,
                prefill_s: float) -> FloatArray:
    """(P,) all-admit completion time of each group of one pool (`request_finish`, the last of its requests)."""
    if lengths.size == 0:
        return np.zeros(0)
    out: FloatArray = request_finish(lengths, lanes, curve, kv_s_per_token, prefill_s).max(axis=1)
    return out


def observed_times(work: StepWork, *, tail_curve: TpotCurve, bulk_curve: TpotCurve, kv_s_per_token: float = 0.0,
                   prefill_s: float = 0.0) -> tuple[float, float]:
    """(T_tail, T_bulk) the model gives this step's requests: the last tail group's completion, and the last
    consumed bulk group's (with the cut groups running until the cutoff: the cutoff itself, or a later pinned
    group)."""
    pools = pool_lanes(work)
    fins = (pools[0].finish(tail_curve, kv_s_per_token), pools[1].finish(bulk_curve, kv_s_per_token))
    return pool_times(work, pools, fins, prefill_s)


def pool_times(work: StepWork, pools: tuple[PoolLanes, PoolLanes], fins: tuple[FloatArray, FloatArray],
               prefill_s: float) -> tuple[float, float]:
    """`observed_times` from the pools' request finishes without prefill (`PoolLanes.finish`), `prefill_s` added."""
    tail, bulk = ((f + prefill_s * p.prompts).max(axis=1) if f.size else np.zeros(0)
                  for p, f in zip(pools, fins, strict=True))
    kept = work.kept[work.tail:]
    return (float(tail.max()) if tail.size else 0.0, float(bulk[kept].max()) if kept.any() else 0.0)
