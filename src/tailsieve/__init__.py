"""TailSieve: partial-rollout-guided tail routing for synchronous LLM rollouts."""

from tailsieve import _compat
from tailsieve.errors import ConfigError, CurveError, TailSieveError, TraceError
from tailsieve.model.curves import TpotCurve, builtin_curves, load_curve
from tailsieve.model.makespan import finish_times, lane_makespans, makespan

__version__ = "0.1.0"

_compat.install()  # 0.1 module paths (tailsieve.sim, tailsieve.router, …) keep working, with a DeprecationWarning

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
