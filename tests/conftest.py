"""Shared test factories (keyword defaults) and paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from tailsieve.model.curves import TpotCurve

SHARED = Path(__file__).resolve().parents[2] / "shared"
if not SHARED.exists():  # CI clones main next to shared/ as well; fall back to the package copy
    SHARED = Path(__file__).resolve().parents[1] / "shared"


def make_curve(
    *, batch: tuple[int, ...] = (1, 16, 32, 64), tpot_ms: tuple[float, ...] = (7.9, 10.8, 12.8, 18.4),
    name: str = "test",
) -> TpotCurve:
    """A curve factory with H100-like defaults."""
    return TpotCurve(name=name, batch=batch, tpot_ms=tpot_ms)


@st.composite
def curves(draw: st.DrawFn, monotone: bool | None = None) -> TpotCurve:
    """Random valid curves; `monotone=True` gives non-decreasing τ, False/None anything valid."""
    n = draw(st.integers(1, 5))
    batch = sorted(draw(st.sets(st.integers(1, 20), min_size=n, max_size=n)))
    vals = draw(st.lists(st.floats(0.5, 50, allow_nan=False), min_size=n, max_size=n))
    if monotone:
        vals = list(np.maximum.accumulate(vals))
    return TpotCurve(name="rand", batch=tuple(batch), tpot_ms=tuple(vals))
