"""TailSieve: partial-rollout-guided tail routing for synchronous LLM rollouts."""

from tailsieve.curves import TpotCurve, builtin_curves, load_curve
from tailsieve.errors import ConfigError, CurveError, TailSieveError, TraceError
from tailsieve.makespan import finish_times, lane_makespans, makespan

__version__ = "0.1.0"

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
