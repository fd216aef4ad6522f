"""`tailsieve simulate --spec METHOD`: the matched-budget speculative table (§4.3, Fig. 6a); docs/speculative.md."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from tailsieve.cli._common import console, print_json
from tailsieve.cli.sim_args import build_config, load_inputs, progress_bar
from tailsieve.errors import ConfigError
from tailsieve.loop import SKIP_STEPS
from tailsieve.model.costmodel import load_cost_model
from tailsieve.model.speculative import SpecConfig, SpecMethod, parse_spec
from tailsieve.simulation.runs import ORACLES
from tailsieve.simulation.spec_budget import DEFAULT_BUDGETS, BudgetTable, check_budgets, matched_budget

NEAR_BEST = 0.02  # a budget is "useful" while its step time is within 2% of the best budget's


def parse_budgets(text: str) -> tuple[int, ...]:
    """`0,1,2,3` → (0, 1, 2, 3), one-line error naming the bad item."""
    out: list[int] = []
    for item in (t.strip() for t in text.split(",")):
        try:
            out.append(int(item))
        except ValueError:
            raise ConfigError(f"--spec-budgets must be comma-separated integers, got {item!r}") from None
    return check_budgets(out)


def spec_policy(values: list[str] | None) -> str:
    """The one TailSieve variant to compare (default `tailsieve`); uniform is always the baseline."""
    names = [n.strip() for v in values or ["tailsieve"] for n in v.split(",") if n.strip() and n.strip() != "uniform"]
    if len(names) != 1 or names[0] in ORACLES or names[0] == "all":
        raise ConfigError(f"--spec compares one two-pool policy with uniform; give one --policy, got {values}")
    return names[0]


def spec_template(text: str) -> SpecConfig:
    """The method and constants the table sweeps (`--spec mtp`, `--spec eagle3,acceptance=0.7`)."""
    spec = parse_spec(text, "--spec")
    if spec.method is SpecMethod.NONE:
        raise ConfigError("--spec needs a speculative method (mtp, eagle3, dflash, ngram, suffix), got none")
    if spec.tokens is not None:
        raise ConfigError(f"--spec takes a method, not a depth (the table sweeps --spec-budgets), got {text!r}")
    return spec


def run_spec(args: argparse.Namespace, plot: Path | None) -> int:
    """Run the matched-budget comparison and print it (or JSON)."""
    if args.config or args.tail_spec is not None or args.bulk_spec is not None:
        raise ConfigError("--spec sweeps the depths itself; drop --config/--tail-spec/--bulk-spec")
    template = spec_template(args.spec)
    budgets = parse_budgets(args.spec_budgets) if args.spec_budgets is not None else DEFAULT_BUDGETS
    policy = spec_policy(args.policy)
    model = load_cost_model(args.curve)
    config = build_config(args, [policy], model)
    curve = model.curve
    workload = load_inputs(args)
    runs = 1 + sum((d > 0) + d + 1 for d in budgets)
    with progress_bar(runs * config.steps, enabled=sys.stderr.isatty()) as tick:
        table = matched_budget(template, budgets, workload, curve, config, policy=policy, on_step=tick)
    replay = "synthetic" if workload.is_synthetic else args.replay
    setting = (f"{workload.name} ({replay}), curve {curve.name}, R={args.replicas}, N={args.groups} × "
               f"G={args.group_size}, {config.steps} steps, ρ={args.rho}")
    if plot is not None:
        save_plot(table, plot, f"{template.method.value}: {setting}")
    if args.json:
        print_json({"workload": workload.name, "replay": replay, "curve": curve.name, "replicas": args.replicas,
                    "groups": args.groups, "group_size": args.group_size, "steps": config.steps, "rho": args.rho,
                    "seed": args.seed, "window_skip": SKIP_STEPS, **table_json(table)})
        return 0
    print_table(table, setting)
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
            "splits": [{"d_bulk": s.d_bulk, "d_tail": s.d_tail, "mean_step_s": s.mean_step_s, "final_q": s.final_q,
                        "final_m": s.final_m, "speedup": table.speedup(s.mean_step_s),
                        "tail_bound_share": None if math.isnan(s.tail_bound) else s.tail_bound} for s in r.splits],
        } for r in table.rows],
        "best_uniform_budget": table.best_baseline.d_base, "best_tailsieve_budget": table.best_tailsieve.d_base,
        "useful_uniform_budgets": useful(table, False), "useful_tailsieve_budgets": useful(table, True),
    }


def print_table(table: BudgetTable, setting: str) -> None:
    """Uniform and TailSieve's best split per budget, then TailSieve at every split (d − k, d + k)."""
    s, name = table.spec, table.policy
    share = "" if s.share == 1.0 else f", draft share {s.share:g}"
    out = Table(title=f"Matched-budget speculation (§4.3, Fig. 6a): {s.method.value} (α={s.alpha:g}, γ={s.gamma:g}, "
                      f"draft cost {s.cost:g}, verify cost {s.verify:g}{share}), {name} vs uniform\n{setting}")
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
    fig.savefig(path)
    plt.close(fig)
