"""Workloads (§2.3, App. A.5, App. B): which prompts come and how long each generation of them is.

`workload.py` (replay modes), `names.py` (`load_workload`: a bundled name, trace path or `family:SEED`), `traces.py`
(trace files), `synthetic.py` (the calibrated generator), `regimes.py` (video/VLM RL, multi-turn agentic search,
drifting low-prompt-share math, rare prompt-independent cap hits), `family.py` (the generated regime family
`family:SEED`, issue 40).
"""

from tailsieve.workloads.family import FamilyRegime, Split, family_regime, family_workload
from tailsieve.workloads.names import load_workload
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
    parse_mode,
    synthetic_workload,
    trace_workload,
)

__all__ = [
    "FamilyRegime",
    "GeneratorSource",
    "LengthSource",
    "MultiTurnSource",
    "RecordedSource",
    "ReplayMode",
    "ResampleSource",
    "Split",
    "Workload",
    "bundled_workloads",
    "family_regime",
    "family_workload",
    "generator_names",
    "load_workload",
    "parse_mode",
    "synthetic_workload",
    "trace_workload",
]
