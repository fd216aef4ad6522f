"""TailSieve: partial-rollout-guided tail routing for synchronous LLM rollouts.

The curve and makespan names below are imported on first use (PEP 562), so that `tailsieve --help` and
`--version` load no numpy (bench/bench_startup.py measures it)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tailsieve.errors import ConfigError, CurveError, TailSieveError, TraceError

if TYPE_CHECKING:
    from tailsieve.model.curve_names import load_curve
    from tailsieve.model.curves import TpotCurve, builtin_curves
    from tailsieve.model.makespan import finish_times, lane_makespans, makespan

__version__ = "0.1.0"

_LAZY = {"TpotCurve": "tailsieve.model.curves", "builtin_curves": "tailsieve.model.curves",
         "load_curve": "tailsieve.model.curve_names", "finish_times": "tailsieve.model.makespan",
         "lane_makespans": "tailsieve.model.makespan", "makespan": "tailsieve.model.makespan"}


def __getattr__(name: str) -> Any:
    """The lazily imported names of `__all__`."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tailsieve' has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "CurveError",
    "TailSieveError",
    "TpotCurve",
    "TraceError",
    "__version__",
    "builtin_curves",
    "finish_times",
    "lane_makespans",
    "load_curve",
    "makespan",
]
