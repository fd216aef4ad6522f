"""Shared CLI helpers: argument types, JSON output, rich tables, plot saving."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tailsieve.errors import TailSieveError


def positive_int(text: str) -> int:
    """argparse type: an integer > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def print_json(obj: Any) -> None:
    """Write one JSON document to stdout."""
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


def console(width: int = 120) -> Console:
    """A console for tables (plain when stdout is not a terminal), at least `width` columns wide."""
    return Console(soft_wrap=False, width=max(width, Console().width))


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Render a readable table; numbers right-aligned."""
    table = Table(title=title, show_lines=False)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(fmt(v) for v in row))
    console().print(table)


def fmt(value: Any) -> str:
    """Human formatting for table cells."""
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def plot_path(text: str) -> Path:
    """Validate a --plot destination before any work is done (so a bad path never wastes a run)."""
    path = Path(text)
    if path.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise TailSieveError(f"--plot {text}: use a .png, .pdf or .svg file name")
    if not path.parent.exists():
        raise TailSieveError(f"--plot {text}: folder {path.parent} does not exist")
    return path
