"""`tailsieve workloads`: list the bundled workloads."""

from __future__ import annotations

import argparse
from typing import Any

from tailsieve.cli._common import print_json, print_table
from tailsieve.workloads import bundled_workloads, generator_names
from tailsieve.workloads.traces import DEFAULT_TRACE


def register(sub: Any) -> None:
    """Add the `workloads` command."""
    p = sub.add_parser("workloads", help="list bundled workloads (traces and synthetic generators)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List bundled workloads with a one-line description."""
    listing = bundled_workloads()
    generated = set(generator_names())
    kinds = {n: "synthetic" if n in generated else "trace" for n in listing}
    if args.json:
        print_json({"default": DEFAULT_TRACE, "workloads": [
            {"name": n, "kind": kinds[n], "description": d} for n, d in listing.items()]})
        return 0
    rows: list[tuple[object, ...]] = [
        (n + (" (default)" if n == DEFAULT_TRACE else ""), kinds[n], d) for n, d in listing.items()
    ]
    print_table("Bundled workloads (a path to a CSV/JSONL/Parquet trace works too)", ["name", "kind", "description"],
                rows)
    return 0
