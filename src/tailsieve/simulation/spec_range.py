"""Speculation verdicts across the published range (`simulate --spec`, `plan --spec`; docs/speculative.md): the
speedup of uniform + speculation, TailSieve d/d, tail-only speculation and the best split under each profile (low,
central, high, and a user's own fit), and which conclusions hold across the range and which flip."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tailsieve.simulation.spec_budget import BudgetTable

ROUTE_WIN = 0.01  # a split "beats" d/d, or tail-only "matches" it, by this relative margin


@dataclass(frozen=True, slots=True)
class Arm:
    """One arm at its best depth: the depth (bulk/tail for a split) and the speedup over uniform without speculation."""

    depth: str
    speedup: float


@dataclass(frozen=True, slots=True)
class RangeRow:
    """One profile's verdict inputs."""

    label: str
    no_spec: float  # TailSieve without speculation
    uniform: Arm
    symmetric: Arm  # TailSieve d/d
    tail_only: Arm | None  # TailSieve 0/d (None: no depth > 0 tried)
    split: Arm  # TailSieve's best (bulk, tail) pair
    split_places_tail: bool  # its run placed a tail pool (else a split's gain is a placement effect)


def row_from_table(label: str, table: BudgetTable) -> RangeRow:
    """A `simulate --spec` table's best of each arm."""
    ub, tb = table.best_baseline, table.best_tailsieve
    sym = min(table.rows, key=lambda r: (r.symmetric.mean_step_s, r.d_base))
    tails = [r for r in table.rows if r.tail_only is not None]
    tail = min(tails, key=lambda r: (r.tail_only.mean_step_s if r.tail_only else math.inf, r.d_base)) if tails else None
    zero = next((r for r in table.rows if r.d_base == 0), None)
    return RangeRow(
        label, table.speedup(zero.symmetric.mean_step_s) if zero else math.nan,
        Arm(str(ub.d_base), table.speedup(ub.baseline_s)),
        Arm(str(sym.d_base), table.speedup(sym.symmetric.mean_step_s)),
        None if tail is None or tail.tail_only is None else Arm(f"0/{tail.d_base}",
                                                                  table.speedup(tail.tail_only.mean_step_s)),
        Arm(f"{tb.best.d_bulk}/{tb.best.d_tail}", table.speedup(tb.best.mean_step_s)),
        not math.isnan(tb.best.tail_bound))


def row_from_grid(label: str, uniform: dict[int, float], grid: dict[tuple[int, int], float],
                  placed: dict[tuple[int, int], bool]) -> RangeRow:
    """`plan --spec`'s speedups: uniform per depth and TailSieve per (bulk, tail) depth pair (and whether that run
    placed a tail pool)."""
    ud = max(uniform, key=lambda d: (uniform[d], -d))
    diag = {d: s for (b, d), s in grid.items() if b == d}
    sd = max(diag, key=lambda d: (diag[d], -d))
    tails = {t: s for (b, t), s in grid.items() if b == 0 and t > 0}
    td = max(tails, key=lambda t: (tails[t], -t)) if tails else None
    best = max(grid, key=lambda k: (grid[k], -k[1], -k[0]))
    return RangeRow(label, grid.get((0, 0), math.nan), Arm(str(ud), uniform[ud]), Arm(str(sd), diag[sd]),
                    None if td is None else Arm(f"0/{td}", tails[td]), Arm(f"{best[0]}/{best[1]}", grid[best]),
                    placed[best])


Test = Callable[[RangeRow], bool]
CONCLUSIONS: tuple[tuple[str, Test], ...] = (
    ("speculation pays under uniform routing (its best depth > 0)", lambda r: r.uniform.depth != "0"),
    ("TailSieve d/d beats uniform + speculation, each at its best depth",
     lambda r: r.symmetric.speedup > r.uniform.speedup),
    ("speculation adds to TailSieve (its best d/d has depth > 0)", lambda r: r.symmetric.depth != "0"),
    (f"tail-only speculation comes within {100 * ROUTE_WIN:g}% of the best d/d",
     lambda r: r.tail_only is not None and r.tail_only.speedup * (1 + ROUTE_WIN) >= r.symmetric.speedup),
    (f"a route-specific split beats the best d/d by more than {100 * ROUTE_WIN:g}% with a tail pool in use",
     lambda r: r.split_places_tail and r.split.speedup > r.symmetric.speedup * (1 + ROUTE_WIN)),
)


@dataclass(frozen=True, slots=True)
class Conclusion:
    """One conclusion under every profile."""

    text: str
    values: tuple[bool, ...]

    @property
    def holds(self) -> bool:
        """True when every profile agrees."""
        return len(set(self.values)) == 1


def conclusions(rows: Sequence[RangeRow]) -> tuple[Conclusion, ...]:
    """Every conclusion, evaluated under each row."""
    return tuple(Conclusion(text, tuple(test(r) for r in rows)) for text, test in CONCLUSIONS)


def verdict_lines(rows: Sequence[RangeRow]) -> list[str]:
    """`holds (yes)` / `holds (no)` / `flips (low no, central yes, …)` per conclusion."""
    out = []
    for c in conclusions(rows):
        if c.holds:
            out.append(f"holds ({'yes' if c.values[0] else 'no'} under every profile): {c.text}")
        else:
            where = ", ".join(f"{r.label} {'yes' if v else 'no'}" for r, v in zip(rows, c.values, strict=True))
            out.append(f"flips ({where}): {c.text}")
    return out


def range_json(rows: Sequence[RangeRow]) -> dict[str, object]:
    """The rows and conclusions as JSON."""
    def arm(a: Arm | None) -> dict[str, object] | None:
        return None if a is None else {"depth": a.depth, "speedup": a.speedup}

    return {"profiles": [{"label": r.label, "tailsieve_no_spec": r.no_spec, "uniform": arm(r.uniform),
                          "tailsieve_dd": arm(r.symmetric), "tail_only": arm(r.tail_only), "best_split": arm(r.split),
                          "best_split_places_tail": r.split_places_tail}
                         for r in rows],
            "conclusions": [{"text": c.text, "values": list(c.values), "holds": c.holds} for c in conclusions(rows)],
            "verdicts": verdict_lines(rows)}
