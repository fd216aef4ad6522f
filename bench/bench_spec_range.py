"""Speculation across the published range (issue 43), one command for the tables of docs/speculative.md:

- `--calibration`: the profiles' constants, and every published point against the low, central and high profile.
- `--table2`: the paper's Table 2 as a check. Every bundled regime on the bundled MoE curve (a100x4-mixtral-8x7b)
  with MTP and DFlash under the MoE profiles' low, central and high brackets: where TailSieve + speculation lands
  against Table 2's Qwen3.5-35B-A3B figures (routing + MTP 2.39–2.59×, + DFlash 2.18–2.38×), and what the gap is made
  of: the acceptance (ā at the bulk depth), the speedup of speculation at the bulk pool's concurrency and at the tail
  pool's (each at the run's final q, m: bulk b = (N − q)·G/(R − m), tail b = q·G/m per replica at the step's start).
- `--route-credit`: the route-credit table under the central profiles (dense: h100-llama3-8b with mtp-dense and
  dflash-dense; MoE: the MoE curve with mtp-moe and dflash-moe).

Run: `PYTHONPATH=src python bench/bench_spec_range.py --table2 --route-credit` (R = 8, N = 64, G = 8, ρ = 0.1, the
default controller, 16 steps, seed 0; a few minutes on two cores). Prints markdown; `--out FILE` also writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from tailsieve.cli import build_parser
from tailsieve.cli.sim_args import build_config, load_inputs
from tailsieve.model.costmodel import load_cost_model
from tailsieve.model.spec_calibration import calibration_rows, profile, profiles, speedup
from tailsieve.model.spec_records import Bracket, Family
from tailsieve.model.speculative import SpecConfig, SpecMethod
from tailsieve.simulation.spec_budget import BudgetTable, matched_budget

REGIMES = ("kodcode-r1", "kodcode-tests", "synthetic-math", "synthetic-math-weak", "synthetic-math-strong", "video-rl",
           "agent-search", "math-drift", "rare-cap")
MOE_CURVE, DENSE_CURVE = "a100x4-mixtral-8x7b", "h100-llama3-8b"
BUDGETS = {SpecMethod.MTP: (0, 1, 2, 3), SpecMethod.DFLASH: (0, 2, 4, 6)}
PAPER = {SpecMethod.MTP: (2.39, 2.59), SpecMethod.DFLASH: (2.18, 2.38)}  # Table 2, Qwen3.5-35B-A3B
STEPS, SEED = 16, 0


def _setting(workload: str, curve: str) -> tuple[Any, Any, Any]:
    args = build_parser(only="simulate").parse_args(
        ["simulate", "--workload", workload, "--curve", curve, "--steps", str(STEPS), "--seed", str(SEED)])
    model = load_cost_model(curve)
    return build_config(args, ["tailsieve"], model), model.curve, load_inputs(args)


def _sweep(workload: str, curve_name: str, method: SpecMethod, family: Family,
           brackets: tuple[Bracket, ...]) -> dict[Bracket, BudgetTable]:
    config, curve, wl = _setting(workload, curve_name)
    out: dict[Bracket, BudgetTable] = {}
    for b in brackets:
        shared = next(iter(out.values()), None)
        out[b] = matched_budget(profile(method, family, b).spec, BUDGETS[method], wl, curve, config, shared=shared)
    return out


def _decompose(table: BudgetTable, spec: SpecConfig, config: Any, curve: Any) -> dict[str, Any]:
    best = table.best_tailsieve.best
    r = config.router
    n, g, reps = r.groups, r.group_size, r.replicas
    q, m = best.final_q, best.final_m
    b_bulk = max(1, round((n - q) * g / (reps - m))) if m < reps else 0
    b_tail = max(1, round(q * g / m)) if m > 0 else 0
    return {"split": f"{best.d_bulk}/{best.d_tail}", "speedup": table.speedup(best.mean_step_s),
            "final_q": q, "final_m": m, "b_bulk": b_bulk, "b_tail": b_tail,
            "abar_bulk": spec.with_tokens(best.d_bulk).expected_tokens() if best.d_bulk else 1.0,
            "s_bulk": speedup(spec.with_tokens(best.d_bulk), curve, b_bulk) if best.d_bulk and b_bulk else 1.0,
            "s_tail": speedup(spec.with_tokens(best.d_tail), curve, b_tail) if best.d_tail and b_tail else math.nan,
            "no_spec": table.speedup(table.rows[0].symmetric.mean_step_s),
            "uniform_best": table.speedup(table.best_baseline.baseline_s), "uniform_d": table.best_baseline.d_base}


def table2() -> tuple[list[str], list[dict[str, Any]]]:
    """Markdown rows and JSON records of the Table 2 check."""
    rows = ["| regime | method | profile | TailSieve no spec | uniform + spec: d (×) | TailSieve + spec: split (×) "
            "| vs Table 2 | ā at bulk depth | S at bulk b | S at tail b | final q/m, bulk b / tail b |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    records = []
    for w in REGIMES:
        for method in BUDGETS:
            tables = _sweep(w, MOE_CURVE, method, Family.MOE, tuple(Bracket))
            config, curve, _ = _setting(w, MOE_CURVE)
            for b, t in tables.items():
                d = _decompose(t, profile(method, Family.MOE, b).spec, config, curve)
                lo, hi = PAPER[method]
                where = ("within" if lo <= d["speedup"] <= hi else
                         f"{d['speedup'] / lo:.2f}× of its low end" if d["speedup"] < lo else
                         f"{d['speedup'] / hi:.2f}× its high end")
                records.append({"regime": w, "method": method.value, "profile": b.value, **d})
                rows.append(f"| {w} | {method.value} | {b.value} | {d['no_spec']:.3f}× | {d['uniform_d']} "
                            f"({d['uniform_best']:.3f}×) | {d['split']} ({d['speedup']:.3f}×) | {where} | "
                            f"{d['abar_bulk']:.2f} | {d['s_bulk']:.2f} | "
                            f"{'–' if math.isnan(d['s_tail']) else format(d['s_tail'], '.2f')} | "
                            f"{d['final_q']}/{d['final_m']}, {d['b_bulk']} / {d['b_tail'] or '–'} |")
    return rows, records


def route_credit() -> tuple[list[str], list[dict[str, Any]]]:
    """The route-credit summary under the central profiles."""
    rows = ["| regime | curve, profile | tailsieve, no spec | uniform+spec: best d (×) | tailsieve d/d: best d (×) | "
            "tail only 0/d: best d (×) | best split: d, bulk/tail (×) | route credit (best / d/d) by budget; "
            "* = no tail pool placed |", "|---|---|---|---|---|---|---|---|"]
    records = []
    for w in REGIMES:
        for curve_name, family, label in ((DENSE_CURVE, Family.DENSE, "h100"), (MOE_CURVE, Family.MOE, "MoE")):
            for method in BUDGETS:
                t = _sweep(w, curve_name, method, family, (Bracket.CENTRAL,))[Bracket.CENTRAL]
                sym = min(t.rows, key=lambda r: (r.symmetric.mean_step_s, r.d_base))
                tails = [r for r in t.rows if r.tail_only is not None]
                to = min(tails, key=lambda r: (r.tail_only.mean_step_s if r.tail_only else 0, r.d_base))
                tb = t.best_tailsieve
                no_tail = math.isnan(tb.best.tail_bound)
                credit = "; ".join(f"{r.d_base}: {r.route_credit:.3f}{'*' if math.isnan(r.best.tail_bound) else ''}"
                                   for r in t.rows)
                name = f"{method.value}-{family.value}"
                assert to.tail_only is not None
                rows.append(f"| {w} | {label}, {name} | {t.speedup(t.rows[0].symmetric.mean_step_s):.3f}× | "
                            f"{t.best_baseline.d_base} ({t.speedup(t.best_baseline.baseline_s):.3f}×) | "
                            f"{sym.d_base} ({t.speedup(sym.symmetric.mean_step_s):.3f}×) | "
                            f"{to.d_base} ({t.speedup(to.tail_only.mean_step_s):.3f}×) | "
                            f"{tb.d_base}, {tb.best.d_bulk}/{tb.best.d_tail}{' (no tail)' if no_tail else ''} "
                            f"({t.speedup(tb.best.mean_step_s):.3f}×) | {credit} |")
                records.append({"regime": w, "curve": curve_name, "profile": name,
                                "best_split": t.speedup(tb.best.mean_step_s),
                                "best_dd": t.speedup(sym.symmetric.mean_step_s),
                                "uniform": t.speedup(t.best_baseline.baseline_s)})
    return rows, records


def calibration() -> tuple[list[str], list[dict[str, Any]]]:
    """The profiles' constants and every published point against the low, central and high profile."""
    rows = ["| profile | d | α | ā | c | v | u0 | u1 | reference curve |", "|---|---|---|---|---|---|---|---|---|"]
    for p in profiles().values():
        s = p.spec
        rows.append(f"| `{p.name}` | {s.depth} | {s.alpha:.4f} | {s.expected_tokens():.3f} | {s.cost:g} | "
                    f"{s.verify:.4f} | {s.token_cost:.4f} | {s.token_cost_slope:.4f} | {p.reference_curve} |")
    rows += ["", "| point | method, family | use | b | d | published (±) | low | central | high | central error | "
             "inside the brackets |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    records = []

    def f(x: float | None) -> str:
        return "–" if x is None else f"{x:.3f}"

    for r in calibration_rows():
        m = r.point
        err = "–" if r.central is None else f"{r.central - m.value:+.3f}"
        inside = ("yes" if r.contained else "NO") if m.bracketed else "–"
        rows.append(f"| {m.id} | {m.method.value}, {m.family.value} | {m.use.value} | {m.concurrency or '–'} | "
                    f"{m.depth or '–'} | {m.value:g} (±{m.tolerance:g}) | {f(r.low)} | {f(r.central)} | "
                    f"{f(r.high)} | {err} | {inside} |")
        records.append({"id": m.id, "low": r.low, "central": r.central, "high": r.high, "value": m.value})
    return rows, records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", action="store_true")
    ap.add_argument("--table2", action="store_true")
    ap.add_argument("--route-credit", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    doc: dict[str, Any] = {}
    for flag, fn in (("calibration", calibration), ("table2", table2), ("route_credit", route_credit)):
        if getattr(args, flag):
            t0 = time.perf_counter()
            rows, records = fn()
            print("\n".join(rows))
            print(f"\n({flag}: {time.perf_counter() - t0:.0f} s)\n")
            doc[flag] = records
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
