"""Workloads (§2.3, App. A.5, App. B): which prompts come and how long each generation of them is.

`workload.py` (replay modes, `load_workload`), `traces.py` (trace files), `synthetic.py` (the calibrated generator),
`regimes.py` (video/VLM RL, multi-turn agentic search, drifting low-prompt-share math, rare prompt-independent
cap hits).
"""

from tailsieve.workloads.workload import (
    GeneratorSource,
    LengthSource,
    MultiTurnSource,
    RecordedSource,
    ReplayMode,
    ResampleSource,
    Workload,
    bundled_workloads,
    generator_names,
    load_workload,
    parse_mode,
    synthetic_workload,
    trace_workload,
)

__all__ = [
    "GeneratorSource",
    "LengthSource",
    "MultiTurnSource",
    "RecordedSource",
    "ReplayMode",
    "ResampleSource",
    "Workload",
    "bundled_workloads",
    "generator_names",
    "load_workload",
    "parse_mode",
    "synthetic_workload",
    "trace_workload",
]
