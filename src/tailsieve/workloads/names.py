"""Workload names (§2.3, App. B): `load_workload` resolves a bundled name, a trace path or `family:SEED` to a
`Workload`, one floor above what it resolves to (`workloads/workload.py`, the replay modes and traces;
`workloads/family.py`, the generated family, which builds on `workload.py`), so neither imports the other back."""

from __future__ import annotations

import math
from pathlib import Path

from tailsieve.errors import ConfigError
from tailsieve.inputs import excerpt
from tailsieve.model.curve_family import FAMILY_PREFIX
from tailsieve.workloads.family import family_workload, parse_family_seed
from tailsieve.workloads.traces import DEFAULT_TRACE
from tailsieve.workloads.workload import (
    ReplayMode,
    Workload,
    generator_names,
    named_trace_workload,
    parse_mode,
    synthetic_workload,
)

__all__ = ["load_workload"]


def _refuse_columns(spec: str, length_column: str | None, prompt_column: str | None) -> None:
    """A generated workload reads no file: a length or prompt column is refused in one line."""
    if length_column is not None or prompt_column is not None:
        raise ConfigError(f"workload {excerpt(spec)} is generated, not read from a file: a length or prompt column "
                          "applies to trace files only")


def load_workload(
    spec: str | Path | None = None,
    *,
    mode: ReplayMode | str = "recorded",
    seed: int = 0,
    length_column: str | None = None,
    prompt_column: str | None = None,
) -> Workload:
    """A workload by bundled name, trace path or 'family:SEED' (a generated regime, `workloads.family`; None:
    kodcode-r1); generated names ignore `mode` and refuse columns."""
    m = parse_mode(mode)
    if seed < 0 or seed != math.floor(seed):
        raise ConfigError(f"seed must be a non-negative integer, got {seed}")
    if spec is None:
        spec = "synthetic-math" if m is ReplayMode.SYNTHETIC else DEFAULT_TRACE
    if isinstance(spec, str) and spec.startswith(FAMILY_PREFIX):
        _refuse_columns(spec, length_column, prompt_column)
        return family_workload(parse_family_seed(spec, "workload", ConfigError), draw_seed=int(seed))
    if isinstance(spec, str) and spec in generator_names():
        _refuse_columns(spec, length_column, prompt_column)
        return synthetic_workload(spec, seed=seed)
    if m is ReplayMode.SYNTHETIC:
        raise ConfigError(f"mode 'synthetic' needs a synthetic workload name ({', '.join(generator_names())}), "
                          f"got {excerpt(spec)}")
    return named_trace_workload(spec, mode=m, seed=seed, length_column=length_column, prompt_column=prompt_column)
