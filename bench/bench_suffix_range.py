"""Suffix decoding from the rollout's own history across the published range (issue 52), one command for the table of
docs/speculative.md: on the bundled long-tail workloads (math, video, agents) and the dense reference curve, verl's
balancer without speculation against uniform + suffix on every replica, TailSieve with suffix on the tail pool only and
TailSieve with suffix everywhere, each at its best depth, under the low, central and high brackets, all on one prompt
stream per workload (ratios measured in one run).

Targets (issue 52): under the central brackets TailSieve with tail-pool suffix ≥ 1.5× verl-lif and ≥ 1.10× uniform +
suffix everywhere; the low bracket's figures beside. The last column is the ceiling of any tail-pool drafter: the
best of the controller and every static split (q ∈ {E, E/2, E/4}, m ≤ R/2) with the ideal drafter on the tail pool
(every drafted token accepted at depth 32, drafting and verification free; `suffix_range.IDEAL_TAIL`).

Run: `PYTHONPATH=src python bench/bench_suffix_range.py [--steps 16] [--out FILE]` (R = 8, N = 64, G = 8, ρ = 0.1,
the default controller, seed 0; about a minute per workload on two cores). Prints markdown; `--out` writes JSON.

`--shapes [R:N:G:RHO,...]` sweeps the ceiling over shapes instead (`suffix_shapes.py`; default grid R ∈ {4, 8, 16, 32},
N = 8R, G = 8, ρ ∈ {0.1, 0.25}): per workload and shape, verl-lif's step time, the ceiling with its length ratio, the
best option at length ratio ≥ 0.95, and the low and central brackets' tail-pool suffix with their length ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tailsieve.cli import build_parser
from tailsieve.cli.sim_args import build_config, load_inputs
from tailsieve.model.costmodel import load_cost_model
from tailsieve.model.curves import TpotCurve
from tailsieve.simulation.runs import SimConfig
from tailsieve.simulation.suffix_range import (
    TAIL_TARGET,
    UNIFORM_TARGET,
    suffix_compare,
    table_json,
    tail_ceiling,
    verdict_lines,
)
from tailsieve.workloads import Workload

WORKLOADS = {"math": "synthetic-math", "video": "video-rl", "agents": "agent-search"}
CURVE, SEED = "h100-llama3-8b", 0


def setup(workload: str, steps: int, shape: Sequence[str] = ()) -> tuple[Workload, TpotCurve, SimConfig]:
    """The stream, curve and config of one run, as `simulate` builds them (`shape`: extra simulate flags)."""
    args = build_parser(only="simulate").parse_args(
        ["simulate", "--workload", workload, "--curve", CURVE, "--steps", str(steps), "--seed", str(SEED), *shape])
    model = load_cost_model(CURVE)
    return load_inputs(args), model.curve, build_config(args, ["tailsieve"], model)


def run(workload: str, steps: int, shape: Sequence[str] = ()) -> dict[str, Any]:
    """One workload's table as JSON."""
    inputs, curve, config = setup(workload, steps, shape)
    table = suffix_compare(inputs, curve, config)
    ceiling = tail_ceiling(inputs, curve, config, reference_s=table.reference_s)
    return table_json(table) | {"verdict_lines": verdict_lines(table.rows),
                                "ceiling": {"speedup": ceiling.speedup, "policy": ceiling.policy}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--shapes", nargs="?", const="default", metavar="R:N:G:RHO,...",
                    help="sweep the ceiling over shapes (default grid: suffix_shapes.DEFAULT_SHAPES)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="with --shapes: which of math, video, agents")
    args = ap.parse_args()
    if args.shapes is not None:
        from suffix_shapes import sweep_main  # beside this file

        sys.exit(sweep_main(args.shapes, args.workloads, args.steps, args.out))
    rows = ["| workload | bracket | tailsieve, no spec | uniform + suffix everywhere (best of verl-lif, uniform) | "
            "tailsieve, tail-pool suffix | tailsieve, suffix everywhere | tail-pool / uniform + suffix | "
            f"targets (≥ {TAIL_TARGET:g}× verl-lif, ≥ {UNIFORM_TARGET:g}× uniform + suffix) | "
            "ceiling: ideal tail drafter |",
            "|---|---|---|---|---|---|---|---|---|"]
    doc: dict[str, Any] = {}
    t0 = time.perf_counter()
    for label, workload in WORKLOADS.items():
        d = run(workload, args.steps)
        doc[label] = d
        for r in d["brackets"]:
            u, t, e = r["uniform_suffix"], r["tail_only"], r["everywhere"]
            ok = (f"{'met' if t['speedup'] >= TAIL_TARGET else 'missed'}, "
                  f"{'met' if r['tail_only_vs_uniform_suffix'] >= UNIFORM_TARGET else 'missed'}")
            rows.append(f"| {label} ({workload}) | {r['bracket']} | {r['tailsieve_no_spec']:.3f}× | "
                        f"{u['speedup']:.3f}× ({u['name'].split(' +')[0]}, d={u['depth']}) | "
                        f"{t['speedup']:.3f}× (d={t['depth']}) | {e['speedup']:.3f}× (d={e['depth']}) | "
                        f"{r['tail_only_vs_uniform_suffix']:.3f}× | {ok} | "
                        f"{d['ceiling']['speedup']:.3f}× ({d['ceiling']['policy']}) |")
    print("\n".join(rows))
    for label, d in doc.items():
        print(f"\n{label}:")
        print("\n".join(d["verdict_lines"]))
    print(f"\n({time.perf_counter() - t0:.0f} s; speedups over verl-lif without speculation, {args.steps} steps, "
          f"seed {SEED}, curve {CURVE})")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
