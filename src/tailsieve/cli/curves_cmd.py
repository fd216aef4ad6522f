"""`tailsieve curves`: list the built-in throughput curves."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from tailsieve.cli._common import PIPE_WIDTH, print_json, print_table
from tailsieve.cli.curves_spec import lines, profile_doc
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import builtin_curves


def register(sub: Any) -> None:
    """Add the `curves` command."""
    p = sub.add_parser("curves", help="list built-in TPOT curves (or show one curve or file)")
    p.add_argument("curve", nargs="?", help="show this curve (built-in name or file) with τ(b) samples")
    p.add_argument("--spec", action="store_true", help="show the speculation profiles' speedup against concurrency "
                   "beside the published points (docs/speculative.md)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List curves, or tabulate one, or the speculation profiles (--spec)."""
    if args.spec:
        if args.json:
            print_json(profile_doc())
        else:
            print("\n".join(lines()[1:]))
            print("[fit]: the central profile's least-squares points; [range]: the low and high profiles contain it;\n"
                  "[check]: shown only. Sources: data/spec_measurements.json, docs/speculative.md.")
        return 0
    if args.curve:
        c = load_curve(args.curve)
        sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
        if args.json:
            print_json(c.to_json() | {"tpot_ms_at": {str(b): 1000 * c.tpot_s(b) for b in sizes}})
        else:
            rows: list[tuple[object, ...]] = [(b, 1000 * c.tpot_s(b), b / c.tpot_s(b)) for b in sizes]
            print_table(f"{c.name}: {c.description}", ["batch", "tpot_ms", "tokens/s (all)"], rows)
            for label, text in (("source", c.source), ("licence", c.licence), ("derivation", c.derivation),
                                ("past the last point", c.extension)):
                if text:
                    print(_wrapped(f"{label}: {text}"))
        return 0
    curves = builtin_curves()
    if args.json:
        print_json({"curves": [c.to_json() for c in curves.values()]})
        return 0
    listing: list[tuple[object, ...]] = [
        (c.name, c.description, f"{c.batch[0]}..{c.batch[-1]}", c.tpot_ms[0], c.tpot_ms[-1], c.extension, c.licence)
        for c in curves.values()
    ]
    print_table("Built-in TPOT curves", ["name", "hardware / model", "batches", "ms@first", "ms@last",
                                         "past the last point", "licence"], listing)
    print("sources (data/ATTRIBUTION.md; `tailsieve curves NAME` shows how the points were derived):")
    for c in curves.values():
        print(_wrapped(f"  {c.name}: {c.source}"))
    return 0


def _wrapped(line: str) -> str:
    """A prose line within the tables' pipe width (PIPE_WIDTH = 120), continued with an indent."""
    return textwrap.fill(line, PIPE_WIDTH, subsequent_indent="    ", break_on_hyphens=False, break_long_words=False)
