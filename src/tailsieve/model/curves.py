"""Throughput curves τ(b): seconds per output token of each request when b requests decode together (§2.1).

A curve is a validated table of measured points; `TpotCurve.table(n)` precomputes τ(0..n) as a read-only
array so every cost lookup downstream is an array index, never a per-token loop.

`model/curve_names.py` resolves a name, file or `family:SEED` to a curve (`load_curve`).

Between points τ is piecewise linear; below the first measured batch it is flat at the first value; past the
last point it extends linearly along the last two points, never below the last value; τ(0) = 0.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import CurveError
from tailsieve.inputs import excerpt, loads_json, read_text

FloatArray = NDArray[np.float64]
MAX_CURVE_POINTS = 100_000
MAX_BATCH = 1_000_000  # largest batch size a curve point may name
MIN_TPOT_MS, MAX_TPOT_MS = 1e-6, 1e6  # ms per token: a nanosecond to 1000 s


@dataclass(frozen=True, slots=True)
class TpotCurve:
    """A measured TPOT curve: `batch[i]` requests decoding together take `tpot_ms[i]` ms per token each."""

    name: str
    batch: tuple[int, ...]
    tpot_ms: tuple[float, ...]
    description: str = ""
    source: str = ""
    extension: str = ""
    licence: str = ""  # the licence of the measurements behind a built-in curve (data/ATTRIBUTION.md)
    derivation: str = ""  # how the points were computed from the source's rows

    def __post_init__(self) -> None:
        _validate_points(self.name, self.batch, self.tpot_ms)

    @property
    def is_monotone(self) -> bool:
        """True when τ(b) never decreases with b (the usual case; the exact oracle prunes harder then)."""
        return all(b >= a for a, b in zip(self.tpot_ms, self.tpot_ms[1:], strict=False))

    def scaled(self, factor: float) -> TpotCurve:
        """τ(b)·`factor` at every point (the extension past the last point follows): an engine slower (> 1) or
        faster (< 1) than this profile."""
        if factor == 1.0:
            return self
        return replace(self, name=f"{self.name}x{factor:g}", tpot_ms=tuple(t * factor for t in self.tpot_ms))

    def table(self, n: int) -> FloatArray:
        """τ(0..n) in seconds as a read-only array of length n + 1 (τ(0) = 0)."""
        if n < 0:
            raise CurveError(f"curve '{self.name}': table size must be >= 0, got {n}")
        return _table(self.batch, self.tpot_ms, _round_up(n))[: n + 1]

    def tpot_s(self, b: int) -> float:
        """τ(b) in seconds for one batch size."""
        return float(self.table(b)[b])

    def to_json(self) -> dict[str, Any]:
        """The file form accepted by `load_curve` (plus descriptive fields)."""
        return {
            "name": self.name,
            "batch": list(self.batch),
            "tpot_ms": list(self.tpot_ms),
            "description": self.description,
            "source": self.source,
            "extension": self.extension,
            "licence": self.licence,
            "derivation": self.derivation,
        }


def _round_up(n: int) -> int:
    """Table sizes are cached in powers of two so that growing lanes reuse one array."""
    size = 64
    while size < n:
        size *= 2
    return size


@lru_cache(maxsize=256)
def _table(batch: tuple[int, ...], tpot_ms: tuple[float, ...], n: int) -> FloatArray:
    xs = np.asarray(batch, dtype=np.float64)
    ys = np.asarray(tpot_ms, dtype=np.float64) / 1000.0
    b = np.arange(n + 1, dtype=np.float64)
    out = np.interp(b, xs, ys)  # flat below the first point and above the last
    if len(xs) >= 2:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        past = b > xs[-1]
        out[past] = np.maximum(ys[-1] + slope * (b[past] - xs[-1]), ys[-1])
    out[0] = 0.0
    out.setflags(write=False)
    return out


def _check_size(where: str, n: int) -> None:
    """At most `MAX_CURVE_POINTS` points: the one limit of every curve, file or model every command reads."""
    if n > MAX_CURVE_POINTS:
        raise CurveError(f"{where}: {n:,} points, more than the {MAX_CURVE_POINTS:,} allowed")


def _validate_points(name: str, batch: tuple[int, ...], tpot_ms: tuple[float, ...]) -> None:
    where = f"curve '{name}'"
    if len(batch) == 0:
        raise CurveError(f"{where}: needs at least one (batch, tpot_ms) point")
    if len(batch) != len(tpot_ms):
        raise CurveError(f"{where}: {len(batch)} batch sizes but {len(tpot_ms)} tpot_ms values")
    _check_size(where, len(batch))
    for b in batch:
        if isinstance(b, bool) or not isinstance(b, int):
            raise CurveError(f"{where}: batch sizes must be integers, got {excerpt(b)}")
        if b <= 0:
            raise CurveError(f"{where}: batch sizes must be positive, got {excerpt(b)}")
        if b > MAX_BATCH:
            raise CurveError(f"{where}: batch sizes must be at most {MAX_BATCH:,}, got {excerpt(b)}")
    for a, b in itertools.pairwise(batch):
        if b <= a:
            raise CurveError(f"{where}: batch sizes must be strictly increasing, got {excerpt(a)} then {b}")
    for t in tpot_ms:
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            raise CurveError(f"{where}: tpot_ms must be positive and finite, got {excerpt(t)}")
        if not MIN_TPOT_MS <= t <= MAX_TPOT_MS:
            raise CurveError(f"{where}: tpot_ms must lie in [{MIN_TPOT_MS:g}, {MAX_TPOT_MS:g}], got {excerpt(t)}")


def _as_int(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise CurveError(f"{where}: batch sizes must be integers, got {excerpt(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return _as_int(float(value), where) if "." in value else int(value)
        except ValueError:
            pass
    raise CurveError(f"{where}: batch sizes must be integers, got {excerpt(value)}")


def _as_float(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise CurveError(f"{where}: tpot_ms must be a number, got {excerpt(value)}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise CurveError(f"{where}: tpot_ms must be a number, got {excerpt(value)}") from None


def curve_from_points(name: str, batch: Any, tpot_ms: Any, **meta: str) -> TpotCurve:
    """Build a curve from loosely typed points (JSON or CSV cells), with one-line errors naming the problem."""
    where = f"curve '{name}'"
    if not isinstance(batch, list | tuple) or not isinstance(tpot_ms, list | tuple):
        raise CurveError(f"{where}: 'batch' and 'tpot_ms' must be lists")
    _check_size(where, len(batch))  # before converting a huge list cell by cell
    bs = tuple(_as_int(b, where) for b in batch)
    ts = tuple(_as_float(t, where) for t in tpot_ms)
    return TpotCurve(name=name, batch=bs, tpot_ms=ts, **meta)


def read_curve_file(path: Path) -> TpotCurve:
    """Read a curve from JSON `{"batch": [...], "tpot_ms": [...]}` or CSV with header `batch,tpot_ms` (UTF-8, a BOM
    allowed); errors are one line naming the file (and line)."""
    name = str(path)
    text = read_text(path, "curve file", CurveError)
    if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        obj = loads_json(text, f"curve file {path}", CurveError)
        if not isinstance(obj, dict) or "batch" not in obj or "tpot_ms" not in obj:
            raise CurveError(f"curve file {path}: JSON must be an object with 'batch' and 'tpot_ms' lists")
        return curve_from_points(name, obj["batch"], obj["tpot_ms"], description=str(obj.get("description", "")))
    try:
        rows = list(csv.reader(line for line in text.splitlines() if line.strip()))
    except csv.Error as exc:
        raise CurveError(f"curve file {path}: malformed CSV ({exc})") from None
    if not rows:
        raise CurveError(f"curve file {path}: empty file")
    header = [h.strip() for h in rows[0]]
    if "batch" not in header or "tpot_ms" not in header:
        raise CurveError(f"curve file {path}: CSV header must contain 'batch,tpot_ms', got {excerpt(','.join(header))}")
    ib, it = header.index("batch"), header.index("tpot_ms")
    batch, tpot = [], []
    for lineno, row in enumerate(rows[1:], start=2):
        if len(row) <= max(ib, it):
            raise CurveError(f"curve file {path}: line {lineno} has {len(row)} fields, expected {len(header)}")
        batch.append(row[ib].strip())
        tpot.append(row[it].strip())
    return curve_from_points(name, batch, tpot)


@lru_cache(maxsize=1)
def builtin_curves() -> dict[str, TpotCurve]:
    """The named curves shipped with the package (derived from published measurements; see data/ATTRIBUTION.md)."""
    raw = json.loads(resources.files("tailsieve").joinpath("data/curves.json").read_text(encoding="utf-8"))
    out: dict[str, TpotCurve] = {}
    for entry in raw["curves"]:
        out[entry["name"]] = curve_from_points(
            entry["name"],
            entry["batch"],
            entry["tpot_ms"],
            description=entry["description"],
            source=entry["source"],
            extension=entry["extension"],
            licence=entry["licence"],
            derivation=entry.get("derivation", ""),
        )
    return out

