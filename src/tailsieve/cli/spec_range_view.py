"""The speculation range table that `simulate --spec` and `plan --spec` print (docs/speculative.md)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from tailsieve.simulation.spec_range import Arm, RangeRow, verdict_lines


def _cell(a: Arm | None) -> str:
    return "–" if a is None else f"{a.speedup:.3f}× ({a.depth})"


def print_range(con: Console, rows: Sequence[RangeRow], policy: str, setting: str) -> None:
    """Each profile's best of every arm (speedup over uniform without speculation, depth in brackets), then which
    conclusions hold across the profiles and which flip."""
    table = Table(title=f"Across the published range ({setting}): speedup over uniform without speculation, "
                        "best depth in brackets")
    for i, col in enumerate(("profile", f"{policy}, no spec", "uniform + spec", f"{policy} d/d", "tail only 0/d",
                             "best split b/t")):
        table.add_column(col, justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(r.label, f"{r.no_spec:.3f}×", _cell(r.uniform), _cell(r.symmetric), _cell(r.tail_only),
                      _cell(r.split) + ("" if r.split_places_tail else " no tail"))
    con.print(table)
    for line in verdict_lines(rows):
        con.print(line, highlight=False)
