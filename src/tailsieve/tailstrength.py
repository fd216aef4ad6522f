"""Tail-strength transform (App. A.5): rescale the upper half so that P90/P50 = r, order preserved.

L′_i(r) = L_i if L_i ≤ M, else M + s_r (L_i − M) with s_r = (rM − M) / (P90 − M), where M and P90 are the
median and 90th percentile of the reference lengths. The lower half and the median are unchanged and P90 maps
to rM.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailsieve.errors import ConfigError

WEAK_TAIL_RATIO = 1.5  # App. A.5, weak-tail workload
STRONG_TAIL_RATIO = 6.0  # App. A.5, strong-tail workload


def tail_scale(median: float, p90: float, r: float) -> float:
    """s_r = (rM − M)/(P90 − M) of App. A.5."""
    if not np.isfinite(r) or r <= 1.0:
        raise ConfigError(f"tail ratio r must be a finite number > 1, got {r}")
    if not p90 > median:
        raise ConfigError(f"tail transform needs P90 > P50, got P50={median:g} and P90={p90:g}")
    return (r * median - median) / (p90 - median)


def tail_transform(
    lengths: ArrayLike, r: float, *, median: float | None = None, p90: float | None = None
) -> NDArray[np.float64]:
    """L′(r) of App. A.5; `median`/`p90` default to those of `lengths` (pass the reference trace's to reuse them)."""
    arr = np.asarray(lengths, dtype=np.float64)
    m = float(np.median(arr)) if median is None else float(median)
    q90 = float(np.percentile(arr, 90)) if p90 is None else float(p90)
    s = tail_scale(m, q90, r)
    return np.where(arr > m, m + s * (arr - m), arr)
