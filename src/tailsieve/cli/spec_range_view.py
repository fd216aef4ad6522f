"""The speculation range table that `simulate --spec` and `plan --spec` print (docs/speculative.md)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _cell(a: dict[str, Any] | None) -> str:
    return "–" if a is None else f"{a['speedup']:.3f}× ({a['depth']})"


def print_range(con: Console, doc: dict[str, Any], policy: str, setting: str) -> None:
    """Each profile's best of every arm (`spec_range.range_json`: speedup over uniform without speculation, depth in
    brackets), then which conclusions hold across the profiles and which flip."""
    table = Table(title=f"Across the published range ({setting}): speedup over uniform without speculation, "
                        "best depth in brackets")
    for i, col in enumerate(("profile", f"{policy}, no spec", "uniform + spec", f"{policy} d/d", "tail only 0/d",
                             "best split b/t")):
        table.add_column(col, justify="left" if i == 0 else "right")
    for r in doc["profiles"]:
        table.add_row(r["label"], f"{r['tailsieve_no_spec']:.3f}×", _cell(r["uniform"]), _cell(r["tailsieve_dd"]),
                      _cell(r["tail_only"]), _cell(r["best_split"]) + ("" if r["best_split_places_tail"] else
                                                                       " no tail"))
    con.print(table)
    for line in doc["verdicts"]:
        con.print(line, highlight=False)
