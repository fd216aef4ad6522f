"""`tailsieve simulate --spec METHOD`: the matched-budget speculative table (§4.3, Fig. 6a); docs/speculative.md."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from rich.table import Table

from tailsieve.cli._common import console, print_json, progress_enabled
from tailsieve.cli.flags import policy_names_given
from tailsieve.cli.sim_args import build_config, load_inputs, progress_bar
from tailsieve.cli.spec_range_view import print_range
from tailsieve.cli.suffix_view import print_suffix, run_suffix, suffix_brackets
from tailsieve.errors import ConfigError
from tailsieve.inputs import check_replicas, excerpt, int_list
from tailsieve.loop import SKIP_STEPS
from tailsieve.model.costmodel import load_cost_model
from tailsieve.model.spec_fit import context_for
from tailsieve.model.spec_keys import SpecContext
from tailsieve.model.spec_parse import parse_spec, spec_range
from tailsieve.model.speculative import MAX_TOKENS, SpecConfig, SpecMethod
from tailsieve.outputs import write_figure
from tailsieve.policy.controller import CONTROLLERS
from tailsieve.simulation.runs import ORACLES
from tailsieve.simulation.spec_budget import (
    DEFAULT_BUDGETS,
    BudgetTable,
    SplitRun,
    check_budgets,
    matched_budget,
)
from tailsieve.simulation.spec_range import range_json, row_from_table

NEAR_BEST = 0.02  # a budget is "useful" while its step time is within 2% of the best budget's
ROUTE_WIN = 0.01  # route-specific depths "win" when the best split is over 1% faster than d/d at the same budget


def parse_budgets(text: str) -> tuple[int, ...]:
    """`0,1,2,3` or `0..3` → (0, 1, 2, 3) (`inputs.int_list`), one-line error naming the bad item."""
    return check_budgets(int_list(text, "--spec-budgets", 0, MAX_TOKENS // 2))


def spec_policy(values: list[str] | None) -> str:
    """The one TailSieve variant to compare (default `tailsieve`); uniform is always the baseline."""
    names = [n for n in policy_names_given(values or None, "tailsieve") if n != "uniform"]
    if len(names) != 1 or names[0] in ORACLES or names[0] == "all":
        raise ConfigError(f"--spec compares one two-pool policy with uniform; give one --policy, got {values}")
    return names[0]


def spec_template(text: str, context: SpecContext | None = None) -> SpecConfig:
    """The method and constants the table sweeps (`--spec mtp`, `--spec mtp:low`, `--spec eagle3,acceptance=0.7`)."""
    spec = parse_spec(text, "--spec", context)
    if spec.method is SpecMethod.NONE:
        raise ConfigError("--spec needs a speculative method (mtp, eagle3, dflash, ngram, suffix), got none")
    if any(p.strip().isdigit() for p in text.split(",")[0].split(":")[1:]):
        raise ConfigError(f"--spec takes a method, not a depth (the table sweeps --spec-budgets), got {excerpt(text)}")
    return spec


def run_spec(args: argparse.Namespace, plot: Path | None) -> int:
    """Run the matched-budget comparison and print it (or JSON)."""
    if args.config or args.tail_spec is not None or args.bulk_spec is not None:
        raise ConfigError("--spec sweeps the depths itself; drop --config/--tail-spec/--bulk-spec")
    model = load_cost_model(args.curve)
    brackets = suffix_brackets(args.spec)
    if brackets is not None:  # model-free speculation from the rollout's history: the four-arm comparison
        policy = spec_policy(args.policy)
        depths = int_list(args.spec_budgets, "--spec-budgets", 0, MAX_TOKENS) if args.spec_budgets else None
        doc = run_suffix(load_inputs(args), model.curve, build_config(args, [policy], model), policy, brackets,
                         depths)
        if args.json:
            print_json(doc)
        else:
            print_suffix(console(), doc)
        return 0
    context = context_for(args.curve, model.curve)
    template = spec_template(args.spec, context)
    others = [(label, s) for label, s in spec_range(args.spec, context) if s != template]
    budgets = parse_budgets(args.spec_budgets) if args.spec_budgets is not None else DEFAULT_BUDGETS
    policy = spec_policy(args.policy)
    if args.policy is None:  # the user named no policy: a fleet too small for the default says so
        check_replicas(policy, CONTROLLERS[policy].min_replicas, args.replicas,
                       default_fix="--spec compares it with uniform: give --replicas 2 or more")
    config = build_config(args, [policy], model)
    curve = model.curve
    workload = load_inputs(args)
    runs = sum(2 * (d > 0) + d + 1 for d in budgets)
    with progress_bar((1 + runs * (1 + len(others))) * config.steps, enabled=progress_enabled()) as tick:
        table = matched_budget(template, budgets, workload, curve, config, policy=policy, on_step=tick)
        tables = {label: (table if s == template else
                          matched_budget(s, budgets, workload, curve, config, policy=policy, on_step=tick,
                                         shared=table))
                  for label, s in spec_range(args.spec, context)}
    ranged = [row_from_table(label, t) for label, t in tables.items()]
    replay = "synthetic" if workload.is_synthetic else args.replay
    setting = (f"{workload.name} ({replay}), curve {curve.name}, R={args.replicas}, N={args.groups} × "
               f"G={args.group_size}, {config.steps} steps, ρ={args.rho}")
    if plot is not None:
        save_plot(table, plot, f"{args.spec}: {setting}")
    if args.json:
        print_json({"workload": workload.name, "replay": replay, "curve": curve.name, "replicas": args.replicas,
                    "groups": args.groups, "group_size": args.group_size, "steps": config.steps, "rho": args.rho,
                    "seed": args.seed, "window_skip": SKIP_STEPS, "spec_text": args.spec, **table_json(table),
                    "range": range_json(ranged) if ranged else None})
        return 0
    print_table(table, f"{args.spec}: {setting}")
    print_side_by_side(table)
    if ranged:
        print_range(console(), range_json(ranged), policy, f"{args.spec} on {curve.name}, same stream and steps")
    if plot is not None:
        console().print(f"plot saved to {plot}")
    return 0


def useful(table: BudgetTable, tailsieve: bool) -> list[int]:
    """Budgets within NEAR_BEST of the best one (uniform's or TailSieve's)."""
    times = [(r.best.mean_step_s if tailsieve else r.baseline_s, r.d_base) for r in table.rows]
    best = min(t for t, _ in times)
    return [d for t, d in times if t <= best * (1 + NEAR_BEST)]


def table_json(table: BudgetTable) -> dict[str, Any]:
    """The comparison as JSON (structure in docs/speculative.md)."""
    return {
        "spec": {k: v for k, v in table.spec.to_json().items() if k not in ("tokens", "expected_tokens")},
        "policy": table.policy,
        "reference_s": table.reference_s,
        "budgets": [{
            "d_base": r.d_base, "uniform_s": r.baseline_s, "uniform_speedup": table.speedup(r.baseline_s),
            "best": {"d_bulk": r.best.d_bulk, "d_tail": r.best.d_tail, "mean_step_s": r.best.mean_step_s,
                     "speedup": table.speedup(r.best.mean_step_s)},
            "splits": [split_json(table, s) for s in r.splits],
            "tail_only": None if r.tail_only is None else split_json(table, r.tail_only),
            "route_credit": r.route_credit,
        } for r in table.rows],
        "best_uniform_budget": table.best_baseline.d_base, "best_tailsieve_budget": table.best_tailsieve.d_base,
        "useful_uniform_budgets": useful(table, False), "useful_tailsieve_budgets": useful(table, True),
    }


def split_json(table: BudgetTable, s: SplitRun) -> dict[str, Any]:
    """One TailSieve run at a split."""
    return {"d_bulk": s.d_bulk, "d_tail": s.d_tail, "mean_step_s": s.mean_step_s, "final_q": s.final_q,
            "final_m": s.final_m, "speedup": table.speedup(s.mean_step_s),
            "tail_bound_share": None if math.isnan(s.tail_bound) else s.tail_bound}


def side_by_side_verdict(table: BudgetTable) -> str:
    """Where route-specific depths win at a matched budget (> ROUTE_WIN over d/d), and against uniform's best."""
    wins = [r for r in table.rows if r.route_credit > 1 + ROUTE_WIN and not math.isnan(r.best.tail_bound)]
    placement = [r.d_base for r in table.rows if r.route_credit > 1 + ROUTE_WIN and math.isnan(r.best.tail_bound)]
    ub, tb = table.best_baseline, table.best_tailsieve
    best_sym = min(table.rows, key=lambda r: (r.symmetric.mean_step_s, r.d_base))
    head = (f"route-specific depths beat {table.policy} d/d by more than {100 * ROUTE_WIN:g}% at budgets "
            f"{[r.d_base for r in wins]} (best {max(r.route_credit for r in wins):.3f}×)" if wins else
            f"route-specific depths never beat {table.policy} d/d by more than {100 * ROUTE_WIN:g}% "
            f"with a tail pool in use: no Fig. 6a effect here")
    if placement:
        head += (f"; at budgets {placement} the best split beats d/d only because its run never placed a tail pool "
                 "(its tail depth made the predictor keep every replica bulk at d_bulk): a placement effect, "
                 "not route-specific depths")
    return (f"{head}; best of each: uniform d={ub.d_base} {table.speedup(ub.baseline_s):.3f}×, {table.policy} d/d "
            f"d={best_sym.d_base} {table.speedup(best_sym.symmetric.mean_step_s):.3f}×, best split d={tb.d_base} "
            f"{tb.best.d_bulk}/{tb.best.d_tail} {table.speedup(tb.best.mean_step_s):.3f}× "
            f"({best_sym.symmetric.mean_step_s / tb.best.mean_step_s:.3f}× its best d/d).")


def print_side_by_side(table: BudgetTable) -> None:
    """The route credit, per budget on the same stream: uniform d/d, TailSieve d/d, 0/d and the best split."""
    name = table.policy
    out = Table(title=f"Route credit (same stream; speedup over uniform without speculation, {name} without "
                      f"speculation: {table.speedup(table.rows[0].symmetric.mean_step_s):.3f}×)")
    for i, col in enumerate(("budget d", "uniform d/d", f"{name} d/d", f"{name} 0/d (tail only)",
                             f"{name} best split", "best / d/d", "best / uniform d/d")):
        out.add_column(col, justify="left" if i == 0 else "right")
    for r in table.rows:
        to = "–" if r.tail_only is None else f"{table.speedup(r.tail_only.mean_step_s):.3f}×"
        out.add_row(str(r.d_base), f"{table.speedup(r.baseline_s):.3f}×",
                    f"{table.speedup(r.symmetric.mean_step_s):.3f}×", to,
                    f"{table.speedup(r.best.mean_step_s):.3f}× ({r.best.d_bulk}/{r.best.d_tail}"
                    f"{', no tail' if math.isnan(r.best.tail_bound) else ''})",
                    f"{r.route_credit:.3f}×", f"{r.baseline_s / r.best.mean_step_s:.3f}×")
    con = console()
    con.print(out)
    con.print(side_by_side_verdict(table), highlight=False)


def print_table(table: BudgetTable, setting: str) -> None:
    """Uniform and TailSieve's best split per budget, then TailSieve at every split (d − k, d + k)."""
    s, name = table.spec, table.policy
    share = "" if s.share == 1.0 else f", draft share {s.share:g}"
    terms = "" if not s.concurrency_terms else (f", token cost {s.token_cost:.3g} + {s.token_cost_slope:.3g}·log2 b, "
                                                f"acceptance slope {s.acceptance_slope:g}")
    out = Table(title=f"Matched-budget speculation (§4.3, Fig. 6a): {s.method.value} (α={s.alpha:.3g}, γ={s.gamma:g}, "
                      f"draft cost {s.cost:.3g}, verify cost {s.verify:.3g}{share}{terms}), {name} vs uniform"
                      f"\n{setting}")
    for i, col in enumerate(("budget d", "uniform d/d step s", "speedup", f"{name} best bulk/tail", "step s",
                             "speedup", "vs uniform d/d", "final q/m", "tail-bound steps")):
        out.add_column(col, justify="left" if i == 0 else "right")
    for r in table.rows:
        b = r.best
        out.add_row(str(r.d_base), f"{r.baseline_s:.2f}", f"{table.speedup(r.baseline_s):.3f}×",
                    f"{b.d_bulk}/{b.d_tail}", f"{b.mean_step_s:.2f}", f"{table.speedup(b.mean_step_s):.3f}×",
                    f"{r.baseline_s / b.mean_step_s:.3f}×", f"{b.final_q}/{b.final_m}",
                    "–" if math.isnan(b.tail_bound) else f"{100 * b.tail_bound:.0f}%")
    shifts = max(r.d_base for r in table.rows) + 1
    grid = Table(title=f"{name} step s at every split: bulk/tail = (d − k)/(d + k), final m in brackets")
    grid.add_column("budget d")
    for k in range(shifts):
        grid.add_column(f"k={k}", justify="right")
    for r in table.rows:
        cells = [f"{x.mean_step_s:.1f} ({x.final_m})" for x in r.splits]
        grid.add_row(str(r.d_base), *cells, *[""] * (shifts - len(cells)))
    con = console()
    con.print(out)
    con.print(grid)
    ub, tb = table.best_baseline, table.best_tailsieve
    con.print(f"best budget: uniform d={ub.d_base} ({table.speedup(ub.baseline_s):.3f}×), {name} "
              f"d={tb.d_base} as {tb.best.d_bulk}/{tb.best.d_tail} ({table.speedup(tb.best.mean_step_s):.3f}×); "
              f"budgets within {100 * NEAR_BEST:g}% of the best: uniform {useful(table, False)}, {name} "
              f"{useful(table, True)}")
    con.print(f"step s: mean makespan over all steps but the first {SKIP_STEPS}; speedup over uniform without "
              "speculation (same prompts and draws); d/d = depth d on every replica; bulk/tail = per-pool depths "
              "with d_bulk + d_tail = 2d (uniform and warm-up steps run every replica at d_bulk); tail-bound steps: "
              "two-pool steps where the tail pool finished last, the only ones a deeper tail depth can shorten.")


def save_plot(table: BudgetTable, path: Path, title: str) -> None:
    """Speedup against the budget for uniform and TailSieve's best split (like Fig. 6a)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ds = [r.d_base for r in table.rows]
    ax.plot(ds, [table.speedup(r.baseline_s) for r in table.rows], marker="o", label="uniform (d, d)")
    ax.plot(ds, [table.speedup(r.best.mean_step_s) for r in table.rows], marker="s",
            label=f"{table.policy}, best d_bulk + d_tail = 2d")
    ax.set_xlabel("speculation budget d (tokens per replica)")
    ax.set_ylabel("speedup over uniform without speculation")
    ax.set_title(title, fontsize=8)
    ax.legend()
    fig.tight_layout()
    write_figure(fig, path)
    plt.close(fig)
