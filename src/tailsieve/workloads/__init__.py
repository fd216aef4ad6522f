"""Workloads (§2.3, App. A.5, App. B): which prompts come and how long each generation of them is.

`workload.py` (replay modes, `load_workload`), `traces.py` (trace files), `synthetic.py` (the calibrated generator).
"""

from tailsieve.workloads.workload import (
    LengthSource,
    RecordedSource,
    ReplayMode,
    ResampleSource,
    Workload,
    bundled_workloads,
    load_workload,
    parse_mode,
    synthetic_workload,
    trace_workload,
)

__all__ = [
    "LengthSource",
    "RecordedSource",
    "ReplayMode",
    "ResampleSource",
    "Workload",
    "bundled_workloads",
    "load_workload",
    "parse_mode",
    "synthetic_workload",
    "trace_workload",
]
