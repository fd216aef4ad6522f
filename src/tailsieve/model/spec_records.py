"""The published speculative-decoding record (`data/spec_measurements.json`) as typed data: one `Measurement` per
number, with its source, hardware, engine, model, family, method, depth, concurrency and task (docs/speculative.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from importlib import resources
from typing import Any

from tailsieve.errors import ConfigError
from tailsieve.inputs import excerpt, loads_json
from tailsieve.model.curves import TpotCurve
from tailsieve.model.speculative import SpecMethod


class Family(StrEnum):
    """The target model's family: its extra verified tokens cost differently (an MoE routes them to more experts)."""

    DENSE = "dense"
    MOE = "moe"


class Bracket(StrEnum):
    """Which end of the published range a profile stands for."""

    LOW = "low"
    CENTRAL = "central"
    HIGH = "high"


class Use(StrEnum):
    """What a measurement does in the calibration."""

    CENTRAL = "central"  # the central profile is fitted to it (least squares); the brackets contain it
    RANGE = "range"  # the low and high brackets contain it at its concurrency
    ACCEPTANCE = "acceptance"  # the method's acceptance record: its minimum, median and maximum α
    CHECK = "check"  # shown beside the profiles, not fitted (concurrency unknown, or derived)


class Metric(StrEnum):
    """The measured quantity."""

    SPEEDUP = "speedup"  # tok/s with speculation over tok/s without, same setup
    ACCEPTANCE_RATE = "acceptance_rate"  # accepted / drafted tokens
    ACCEPT_LENGTH = "accept_length"  # tokens per verification step (ā)


MOE_MARKERS = ("moe", "mixtral", "-a3b", "-a17b", "-a22b")  # a curve whose name or description says MoE


def family_of(curve: TpotCurve) -> Family:
    """The family of the model a curve measures (its name or description names an MoE), for bare `--spec mtp`."""
    text = f"{curve.name} {curve.description}".lower()
    return Family.MOE if any(m in text for m in MOE_MARKERS) else Family.DENSE


@dataclass(frozen=True, slots=True)
class Measurement:
    """One published number."""

    id: str
    method: SpecMethod
    family: Family
    use: Use
    metric: Metric
    concurrency: int | None
    depth: int | None  # speculative tokens per step (block size − 1 for DFlash); None: not stated
    value: float
    tolerance: float  # the precision the source states
    source: str
    hardware: str
    engine: str
    model: str
    task: str
    note: str

    @property
    def bracketed(self) -> bool:
        """True for the speedups the low and high profiles must contain at their concurrency."""
        return self.metric is Metric.SPEEDUP and self.use in (Use.CENTRAL, Use.RANGE) and self.concurrency is not None


DATA_FILE = "data/spec_measurements.json"
# the file's schema: each field's type (checked at the boundary, so a damaged install is one line, not a traceback)
_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,), "method": (str,), "family": (str,), "use": (str,), "metric": (str,), "concurrency": (int, type(None)),
    "depth": (int, type(None)), "value": (int, float), "tolerance": (int, float), "source": (str,), "hardware": (str,),
    "engine": (str,), "model": (str,), "task": (str,), "note": (str,)}
_ENUMS: dict[str, Any] = {"method": SpecMethod, "family": Family, "use": Use, "metric": Metric}


def _measurement(raw: Any, k: int) -> Measurement:
    """Entry `k` of the file, each field of its schema type (an enum value, a finite number); ConfigError otherwise."""
    where = f"{DATA_FILE}: measurements[{k}]"
    if not isinstance(raw, dict) or set(raw) != set(_FIELDS):
        missing = sorted(set(_FIELDS) - set(raw)) if isinstance(raw, dict) else []
        raise ConfigError(f"{where} must be an object with keys {', '.join(_FIELDS)}"
                          + (f" (missing {missing[0]})" if missing else f", got {excerpt(raw)}"))
    kw: dict[str, Any] = {}
    for key, types in _FIELDS.items():
        v = raw[key]
        if isinstance(v, bool) or not isinstance(v, types) or (isinstance(v, float) and not math.isfinite(v)):
            raise ConfigError(f"{where}.{key} has the wrong type or value: {excerpt(v)}")
        if key in _ENUMS:
            try:
                v = _ENUMS[key](v)
            except ValueError:
                raise ConfigError(f"{where}.{key}: unknown value {excerpt(v)}") from None
        kw[key] = v
    return Measurement(**kw)


@lru_cache(maxsize=1)
def measurements() -> tuple[Measurement, ...]:
    """Every shipped measurement, in file order; a damaged file (not JSON, empty, an entry off its schema) is a
    one-line ConfigError naming it."""
    text = resources.files("tailsieve").joinpath(DATA_FILE).read_bytes().decode("utf-8", "replace")
    doc = loads_json(text, f"{DATA_FILE} (reinstall tailsieve if it was changed)")
    rows = doc.get("measurements") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{DATA_FILE} holds no measurements list (the file is damaged: reinstall tailsieve)")
    return tuple(_measurement(m, k) for k, m in enumerate(rows))


def points(method: SpecMethod, family: Family | None = None, use: Use | None = None) -> tuple[Measurement, ...]:
    """The measurements of one method (and family, and use)."""
    return tuple(m for m in measurements() if m.method is method and (family is None or m.family is family)
                 and (use is None or m.use is use))
