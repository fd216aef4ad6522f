"""Tail-strength transform (App. A.5): rescale the upper half so that P90/P50 = r, order preserved.

Paper: L′_i(r) = L_i if L_i ≤ M, else M + s_r (L_i − M) with s_r = (rM − M) / (P90 − M), where M and P90 are the
median and 90th percentile (numpy's default, linear interpolation) of the reference lengths.

For an even count whose two middle values differ, that map moves the upper middle value and with it the median
(by (s_r − 1)(upper − lower)/4), so P90/P50 misses r — the bundled KodCode trace is such a case. We therefore
anchor the map at A, the smallest reference length ≥ M: L′ = L for L ≤ A, else A + s (L − A) with
s = (rM − A)/(P90 − A). A = M whenever the count is odd or the middle values tie, and then this is the paper's
formula exactly. On the reference lengths the order, the lower half and the median are unchanged and P90 maps to
rM, so P90/P50 = r up to floating-point rounding. Results are floats; round them yourself if you need tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailsieve.errors import ConfigError

WEAK_TAIL_RATIO = 1.5  # App. A.5, weak-tail workload
STRONG_TAIL_RATIO = 6.0  # App. A.5, strong-tail workload


@dataclass(frozen=True, slots=True)
class TailStats:
    """Reference statistics of App. A.5: median M, 90th percentile P90 and anchor A (smallest length ≥ M)."""

    median: float
    p90: float
    anchor: float


def _as_lengths(lengths: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(lengths, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ConfigError(f"tail transform needs a non-empty one-dimensional array of lengths, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or arr.min() < 0:
        raise ConfigError("tail transform needs non-negative finite lengths")
    return arr


def tail_stats(reference: ArrayLike) -> TailStats:
    """M, P90 (numpy's default percentile) and the anchor A of a reference trace (App. A.5)."""
    arr = _as_lengths(reference)
    m = float(np.median(arr))
    return TailStats(median=m, p90=float(np.percentile(arr, 90)), anchor=float(arr[arr >= m].min()))


def tail_scale(median: float, p90: float, r: float, *, anchor: float | None = None) -> float:
    """s = (rM − A)/(P90 − A); with A = M (the default) this is s_r of App. A.5."""
    a = median if anchor is None else anchor
    if not np.isfinite(r) or r <= 1.0:
        raise ConfigError(f"tail ratio r must be a finite number > 1, got {r}")
    if not p90 > median:
        raise ConfigError(f"tail transform needs P90 > P50, got P50={median:g} and P90={p90:g}")
    if not p90 > a:
        raise ConfigError(f"tail transform needs P90 above the upper middle length {a:g}, got P90={p90:g}")
    if not r * median > a:
        raise ConfigError(f"tail ratio r={r:g} too small: r·P50={r * median:g} must exceed the upper middle "
                          f"length {a:g}")
    return (r * median - a) / (p90 - a)


def tail_transform(
    lengths: ArrayLike,
    r: float,
    *,
    reference: ArrayLike | TailStats | None = None,
    median: float | None = None,
    p90: float | None = None,
) -> NDArray[np.float64]:
    """L′(r) of App. A.5 with statistics of `reference` (default: `lengths`); P90/P50 = r on the reference.

    Explicit `median`/`p90` override those statistics; an explicit `median` is also the anchor (the paper's map).
    """
    arr = _as_lengths(lengths)
    stats = reference if isinstance(reference, TailStats) else tail_stats(arr if reference is None else reference)
    if median is not None or p90 is not None:
        m = stats.median if median is None else float(median)
        stats = TailStats(median=m, p90=stats.p90 if p90 is None else float(p90),
                          anchor=stats.anchor if median is None else m)
    s = tail_scale(stats.median, stats.p90, r, anchor=stats.anchor)
    out: NDArray[np.float64] = np.where(arr > stats.anchor, stats.anchor + s * (arr - stats.anchor), arr)
    return out
