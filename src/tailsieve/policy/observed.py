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

import numpy as np
from numpy.typing import NDArray

from tailsieve.model.curves import TpotCurve
from tailsieve.policy.control_state import StepWork
from tailsieve.policy.lanes import lane_finish_times, lane_prefill

FloatArray = NDArray[np.float64]


def pool_finish(lengths: NDArray[np.int64], lanes: NDArray[np.int64], curve: TpotCurve, kv_s_per_token: float,
                prefill_s: float) -> FloatArray:
    """(P,) all-admit completion time of each group of one pool, its requests on the given replicas (any ids), with
    one prompt prefill per group per replica (`predictor.lane_prefill`)."""
    if lengths.size == 0:
        return np.zeros(0)
    _, dense = np.unique(lanes.ravel(), return_inverse=True)
    dense = dense.reshape(lanes.shape).astype(np.int64)
    n = int(dense.max()) + 1
    fin = lane_finish_times(lengths.ravel().astype(np.float64), dense.ravel(), n, curve, kv_s_per_token)
    fin = fin + lane_prefill(dense, n, prefill_s)[dense.ravel()]
    out: FloatArray = fin.reshape(lengths.shape).max(axis=1)
    return out


def observed_times(work: StepWork, *, tail_curve: TpotCurve, bulk_curve: TpotCurve, kv_s_per_token: float = 0.0,
                   prefill_s: float = 0.0) -> tuple[float, float]:
    """(T_tail, T_bulk) the model gives this step's requests: the last tail group's completion, and the last
    consumed bulk group's (with the cut groups running until the cutoff: the cutoff itself, or a later pinned
    group)."""
    t = work.tail
    tail = pool_finish(work.lengths[:t], work.lanes[:t], tail_curve, kv_s_per_token, prefill_s)
    bulk = pool_finish(work.lengths[t:], work.lanes[t:], bulk_curve, kv_s_per_token, prefill_s)
    kept = work.kept[t:]
    return (float(tail.max()) if tail.size else 0.0, float(bulk[kept].max()) if kept.any() else 0.0)
