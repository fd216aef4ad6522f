"""Exact small box-constrained solvers for the speculation profiles' linear fits (`model/spec_calibration.py`).

The profiles' unknowns (v, u0, u1) enter the cost of an iteration linearly, so each fit is a linear problem in three
bounded variables: least squares (the central profile) or a linear programme (the low and high brackets). With three
unknowns both are solved exactly by enumeration: every choice of which variables sit on a bound (least squares) or
which constraints are tight (a vertex of the linear programme) is tried, and the best feasible one is kept. Ties go to
the smaller solution, last variable first (the least concurrency penalty the data force).
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.typing import NDArray

EPS = 1e-9


def _snap(x: NDArray[np.float64], lo: NDArray[np.float64], hi: NDArray[np.float64]) -> NDArray[np.float64]:
    """Clip to the box; values within rounding of a bound sit on it (a vertex solve leaves 1e-17 residue)."""
    x = np.clip(x, lo, hi)
    x = np.where(np.abs(x - lo) < 1e-12, lo, x)
    return np.where(np.abs(x - hi) < 1e-12, hi, x)


def _key(obj: float, x: NDArray[np.float64]) -> tuple[float, ...]:
    return (round(obj, 10), *(round(float(v), 10) for v in x[::-1]))


def box_lstsq(a: NDArray[np.float64], r: NDArray[np.float64], lo: NDArray[np.float64],
              hi: NDArray[np.float64]) -> NDArray[np.float64]:
    """argmin ‖a·x − r‖² over lo ≤ x ≤ hi (each variable free, at its lower or at its upper bound)."""
    n = a.shape[1]
    best: tuple[tuple[float, ...], NDArray[np.float64]] | None = None
    for pattern in itertools.product((0, 1, 2), repeat=n):
        x = np.where(np.asarray(pattern) == 1, lo, hi).astype(np.float64)
        free = [j for j in range(n) if pattern[j] == 0]
        if free:
            fixed = [j for j in range(n) if pattern[j] != 0]
            rhs = r - a[:, fixed] @ x[fixed]
            x[free] = np.linalg.lstsq(a[:, free], rhs, rcond=None)[0]
        if np.any(x < lo - EPS) or np.any(x > hi + EPS):
            continue
        x = _snap(x, lo, hi)
        key = _key(float(np.sum((a @ x - r) ** 2)), x)
        if best is None or key < best[0]:
            best = (key, x)
    assert best is not None  # the all-lower-bound pattern is always feasible
    return best[1]


def box_lp(c: NDArray[np.float64], g: NDArray[np.float64], h: NDArray[np.float64], lo: NDArray[np.float64],
           hi: NDArray[np.float64]) -> NDArray[np.float64] | None:
    """argmin c·x subject to g·x ≥ h and lo ≤ x ≤ hi, by vertex enumeration; None when infeasible."""
    n = g.shape[1]
    eye = np.eye(n)
    rows = [*g, *eye, *(-eye)]
    rhs = [*h, *lo, *(-hi)]
    best: tuple[tuple[float, ...], NDArray[np.float64]] | None = None
    for idx in itertools.combinations(range(len(rows)), n):
        m = np.asarray([rows[i] for i in idx])
        if abs(np.linalg.det(m)) < 1e-12:
            continue
        x = np.linalg.solve(m, np.asarray([rhs[i] for i in idx]))
        if np.any(x < lo - EPS) or np.any(x > hi + EPS) or np.any(g @ x < h - EPS * np.maximum(1.0, np.abs(h))):
            continue
        x = _snap(x, lo, hi)
        key = _key(float(c @ x), x)
        if best is None or key < best[0]:
            best = (key, x)
    return None if best is None else best[1]
