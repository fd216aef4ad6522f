"""`tailsieve plan --spec PROFILE`: "which speculative depth per pool?" on the user's fleet (docs/speculative.md).

Every (bulk depth, tail depth) pair of `--spec-depths` runs the adaptive controller (whose predictor reads both
pools' speculative curves), and uniform runs at each depth on every replica, all on plan's one prompt stream; the
answer is the fastest pair, against uniform at its best depth and against no speculation, then against verl's
balancer with speculation at uniform's best depth on every replica (its paired band, `analysis.balancer`).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

from tailsieve.analysis.balancer import BALANCER, against_balancer, balancer_json
from tailsieve.cli._common import progress_enabled
from tailsieve.cli.sim_args import progress_bar
from tailsieve.cli.spec_range_view import print_range
from tailsieve.cli.suffix_view import print_suffix, run_suffix, suffix_brackets
from tailsieve.errors import ConfigError
from tailsieve.inputs import int_list
from tailsieve.model.curves import TpotCurve
from tailsieve.model.spec_fit import context_for
from tailsieve.model.spec_parse import parse_spec, spec_range
from tailsieve.model.speculative import MAX_TOKENS, PoolSpec, SpecConfig, SpecMethod
from tailsieve.simulation.runs import SimConfig, run_policy
from tailsieve.simulation.spec_budget import tail_bound_share
from tailsieve.simulation.spec_range import range_json, row_from_grid
from tailsieve.workloads import Workload

DEFAULT_DEPTHS = "0,1,2,3"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """plan's `--spec` and `--spec-depths`."""
    p.add_argument("--spec", help="answer 'which speculative depth per pool?' for this method or built-in profile "
                                  "(mtp, dflash: the central profile for the curve's family, the low and high ones "
                                  "beside it; mtp:low, dflash-moe:high, …, or METHOD[,key=value…]; suffix: drafts "
                                  "from the rollout's history, four arms against verl-lif under each bracket)")
    p.add_argument("--spec-depths", default=DEFAULT_DEPTHS,
                   help="depths tried on each pool, comma-separated and/or ranges A..B (default: %(default)s)")


def parse_depths(text: str) -> tuple[int, ...]:
    """`0,1,2` or `0..2` → (0, 1, 2) (`inputs.int_list`); one-line error naming the bad item."""
    return int_list(text, "--spec-depths", 0, MAX_TOKENS)


def answer(args: argparse.Namespace, workload: Workload, curve: TpotCurve, config: SimConfig,
           policy: str) -> dict[str, Any]:
    """Run the depth grid and return the answer as JSON-ready data."""
    brackets = suffix_brackets(args.spec)
    if brackets is not None:  # model-free speculation from the rollout's history: the four-arm comparison
        depths = parse_depths(args.spec_depths) if args.spec_depths != DEFAULT_DEPTHS else None
        return run_suffix(workload, curve, config, policy, brackets, depths)
    context = context_for(getattr(args, "curve", None), curve)
    spec = parse_spec(args.spec, "--spec", context)
    if spec.method is SpecMethod.NONE:
        raise ConfigError("--spec needs a speculative method or profile, got none")
    depths = parse_depths(args.spec_depths)
    pairs = [(b, t) for b in depths for t in depths]
    others = [(label, s) for label, s in spec_range(args.spec, context) if s != spec]
    sweeps = 1 + len(others)
    total = config.steps * (sweeps * (len(pairs) + len(depths)) + 1)
    with progress_bar(total, enabled=progress_enabled(), command="plan") as tick:
        def run(name: str, pools: PoolSpec) -> Any:
            return run_policy(name, workload, curve, replace(config, spec=pools), on_step=tick)

        def sweep(s: SpecConfig) -> tuple[dict[int, float], dict[tuple[int, int], tuple[float, float, int, int]]]:
            uni = {d: run("uniform", PoolSpec.uniform(s.with_tokens(d))).mean_step_s() for d in depths}
            cells = {}
            for d_bulk, d_tail in pairs:
                r = run(policy, PoolSpec(tail=s.with_tokens(d_tail), bulk=s.with_tokens(d_bulk)))
                cells[(d_bulk, d_tail)] = (r.mean_step_s(), tail_bound_share(r), r.final_q, r.final_m)
            return uni, cells

        reference = run("uniform", PoolSpec()).mean_step_s()
        uniform, grid = sweep(spec)
        swept = {label: (uniform, grid) if s == spec else sweep(s) for label, s in spec_range(args.spec, context)}
    ranged = [row_from_grid(label, {d: reference / t for d, t in u.items()},
                            {k: reference / v[0] for k, v in g.items()},
                            {k: not math.isnan(v[1]) for k, v in g.items()}) for label, (u, g) in swept.items()]
    best = min(grid, key=lambda k: (grid[k][0], k[1], k[0]))
    ubest = min(uniform, key=lambda d: (uniform[d], d))
    t_best, share, q, m = grid[best]
    vs = against_balancer(run_policy(policy, workload, curve, replace(config, spec=PoolSpec(
        tail=spec.with_tokens(best[1]), bulk=spec.with_tokens(best[0])))), run_policy(
        BALANCER, workload, curve, replace(config, spec=PoolSpec.uniform(spec.with_tokens(ubest)))))
    return {
        "spec": args.spec, "policy": policy, "depths": list(depths), "reference_s": reference,
        "uniform": [{"depth": d, "mean_step_s": s, "speedup": reference / s} for d, s in uniform.items()],
        "grid": [{"d_bulk": b, "d_tail": t, "mean_step_s": v[0], "speedup": reference / v[0],
                  "tail_bound_share": None if math.isnan(v[1]) else v[1], "final_q": v[2], "final_m": v[3]}
                 for (b, t), v in grid.items()],
        "best": {"d_bulk": best[0], "d_tail": best[1], "mean_step_s": t_best, "speedup": reference / t_best,
                 "vs_best_uniform": uniform[ubest] / t_best, "uses_tail_pool": not math.isnan(share),
                 "final_q": q, "final_m": m, "vs_balancer": balancer_json(vs)},
        "best_uniform": {"depth": ubest, "speedup": reference / uniform[ubest]},
        "range": range_json(ranged) if ranged else None,
    }


def print_answer(con: Console, doc: dict[str, Any]) -> None:
    """The grid of speedups, then the one-line answer."""
    if "suffix" in doc:
        print_suffix(con, doc)
        return
    depths = doc["depths"]
    table = Table(title=f"{doc['policy']} with speculation {doc['spec']}: speedup over uniform without speculation "
                        "(rows: bulk depth, columns: tail depth)")
    table.add_column("bulk \\ tail")
    for d in depths:
        table.add_column(str(d), justify="right")
    cells = {(g["d_bulk"], g["d_tail"]): g for g in doc["grid"]}
    for b in depths:
        table.add_row(str(b), *[f"{cells[(b, t)]['speedup']:.3f}×" for t in depths])
    con.print(table)
    best, ub = doc["best"], doc["best_uniform"]
    where = ("" if best["uses_tail_pool"] else " (its run never placed a tail pool: every replica ran the bulk "
             "depth, so the tail depth is nominal)")
    con.print(f"which depth per pool: bulk {best['d_bulk']}, tail {best['d_tail']} → {best['speedup']:.3f}× uniform "
              f"without speculation, {best['vs_best_uniform']:.3f}× uniform at its best depth {ub['depth']} "
              f"({ub['speedup']:.3f}×); settles at q = {best['final_q']}, m = {best['final_m']}{where}.",
              highlight=False)
    con.print(f"against verl's balancer at depth {ub['depth']} on every replica: {best['vs_balancer']['note']}.",
              highlight=False)
    if doc.get("range"):
        print_range(con, doc["range"], doc["policy"], f"{doc['spec']}, same stream and steps")
