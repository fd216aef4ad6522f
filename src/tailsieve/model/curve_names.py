"""Curve names (§2.1): `load_curve` resolves a built-in name, a curve file or `family:SEED` to a `TpotCurve`, one
floor above both what it resolves to (`model/curves.py`, the curves and their files; `model/curve_family.py`, the
generated family's curves), so neither imports the other back."""

from __future__ import annotations

from pathlib import Path

from tailsieve.errors import CurveError
from tailsieve.inputs import excerpt
from tailsieve.model.curve_family import FAMILY_PREFIX, family_curve, parse_family_seed
from tailsieve.model.curves import TpotCurve, builtin_curves, read_curve_file

__all__ = ["load_curve"]


def load_curve(spec: str | Path | TpotCurve) -> TpotCurve:
    """A curve by built-in name, file path (JSON or CSV) or 'family:SEED' (a generated regime's curve,
    `model.curve_family`); the one entry point every command uses."""
    if isinstance(spec, TpotCurve):
        return spec
    if isinstance(spec, str) and spec.startswith(FAMILY_PREFIX):
        return family_curve(parse_family_seed(spec, "curve", CurveError))
    curves = builtin_curves()
    if isinstance(spec, str) and spec in curves:
        return curves[spec]
    path = Path(spec)
    if path.exists():  # a FIFO, device or folder is refused by the reader, not taken for a curve name
        return read_curve_file(path)
    names = ", ".join(sorted(curves))
    raise CurveError(f"unknown curve {excerpt(spec)}: not a built-in name ({names}) and no such file")
