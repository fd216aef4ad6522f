"""Shared test factories (keyword defaults) and paths."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from tailsieve.model.curves import TpotCurve
from tailsieve.policy.controller import CONTROLLERS, Controller

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


def fixed_forecast(name: str, like: Controller, cost: Callable[[int, int], float]) -> Any:
    """A controller of registry `name`, with `like`'s router, curve and config, whose calibrated forecast T̂(q, m) is
    `cost(q, m)` and every move of m feasible: the outer loop's rules without the model."""

    class Fixed(CONTROLLERS[name]):  # type: ignore[misc,valid-type]
        def _calibrated(self, state: object, pred: object, q: int, m: int) -> float:
            return cost(q, m)

        def feasible(self, *a: object) -> bool:
            return True

    return Fixed(like.router, like.curve, like.config)
