"""`tailsieve plan`: "will TailSieve pay on my replicas, and with which (q, m)?" in one command, offline.

On the user's fleet (a cost model from `tailsieve profile`, or any curve; R replicas; N groups of G; a workload) it
simulates, on one prompt stream: uniform, every static (q, m) (`simulation.runs.static_grid`), the adaptive
`tailsieve` controller and the peers (verl's request balancer first), all through `run_policy` (the simulate
machinery), then prints `simulate`'s short table (`analysis.headline`) and an answer that follows from it
(`answer`): where the controller stands against verl's request balancer, the alternative a verl user already runs
(`analysis.balancer`: "pays" only beyond the paired noise band against it, "the same as verl's balancer" when it
never placed a tail pool), with its speedup over uniform, and failing that whether the best static split pays
against the balancer (`analysis.report`: the keys of `simulate --json`). docs/profile.md.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from rich.console import Console

from tailsieve.analysis.balancer import BALANCER, balancer_json, length_phrase
from tailsieve.analysis.fidelity import Verdict
from tailsieve.analysis.headline import headline_note, headline_rows, headline_table
from tailsieve.analysis.metrics import PolicySummary
from tailsieve.analysis.report import policy_json, summarize
from tailsieve.cli import plan_spec
from tailsieve.cli._common import add_trace_columns, console, print_json, progress_enabled
from tailsieve.cli.flags import add, add_controller_flags
from tailsieve.cli.sim_args import (
    add_replications,
    add_truth_flags,
    build_config,
    load_inputs,
    progress_bar,
    replicated_verdict,
    replications,
    runs_on,
    step_shape,
    truth_json,
    verdict_line,
)
from tailsieve.errors import ConfigError
from tailsieve.loop import SKIP_STEPS, PolicyRun
from tailsieve.model.costmodel import load_cost_model
from tailsieve.model.curves import TpotCurve
from tailsieve.policy.router_knobs import router_defaults
from tailsieve.simulation.runs import PEERS, SimConfig, run_policy, static_grid
from tailsieve.workloads import ReplayMode, Workload

ADAPTIVE = "tailsieve"


def register(sub: Any) -> None:
    """Add the `plan` command."""
    p = sub.add_parser(
        "plan", help="will TailSieve pay on this fleet? best static (q, m), the controller's speedup, the bias",
        description="Simulate uniform, every static split (q = 1..E, m = 1..R-1) and the adaptive tailsieve "
                    "controller on your fleet's cost model (`tailsieve profile --out model.json`) and workload, and "
                    "report the best static (q, m), the controller's expected speedup and its length bias at the "
                    "redraw limit.")
    add(p, "--curve")
    p.add_argument("--workload", help="bundled workload name or trace file (default: kodcode-r1)")
    add_trace_columns(p, "a --workload trace file")
    p.add_argument("--replay", default=ReplayMode.RESAMPLE.value, help="trace replay: recorded or resample (default)")
    add(p, "--replicas")
    add(p, "--groups")
    add(p, "--group-size")
    add(p, "--steps")
    add(p, "--rho")
    add(p, "--max-redraws")
    add(p, "--max-num-seqs")
    add(p, "--kv-ms-per-1k")
    add(p, "--prefill-ms-per-token")
    add_truth_flags(p)
    add(p, "--seed")
    add_replications(p)
    add(p, "--json")
    plan_spec.add_arguments(p)
    add_controller_flags(p)
    p.set_defaults(func=run, q=None, m=None, **router_defaults(),  # the router knobs plan has no flag for
                   shuffle=False, restart_s=0.0, config=None, tail_spec=None, bulk_spec=None)


def run(args: argparse.Namespace) -> int:
    """Simulate the three arms and print the answer."""
    model = load_cost_model(args.curve)
    config = build_config(args, ["static", ADAPTIVE], model)
    if not runs_on(ADAPTIVE, args.replicas):  # the user named no policy: the error names their --replicas
        raise ConfigError(f"--replicas {args.replicas}: plan weighs a tail pool against the bulk, which needs at least "
                          "2 replicas (a tail and a bulk pool)")
    workload = load_inputs(args)
    grid_size = max(config.router.extra, 1) * (args.replicas - 1)
    with progress_bar(config.steps * (grid_size + 2 + len(PEERS)), enabled=progress_enabled(),
                      command="plan") as tick:
        uniform = run_policy("uniform", workload, model.curve, config, on_step=tick)
        grid = static_grid(workload, model.curve, config, on_step=tick)
        adaptive = run_policy(ADAPTIVE, workload, model.curve, config, on_step=tick)
        peers = {name: run_policy(name, workload, model.curve, config, on_step=tick) for name in PEERS}
    static = f"static q={grid.q} m={grid.m}"
    runs = {"uniform": uniform, static: grid.best, ADAPTIVE: adaptive, **peers}
    summaries = summarize(runs)
    best = summaries[static]
    ada = summaries[ADAPTIVE]
    vs = _verdicts(args, runs, static, (grid.q, grid.m), model.curve, config, workload)
    doc = {
        "curve": model.curve.name, "kv_ms_per_1k": config.replica.kv_ms_per_1k_tokens,
        "prefill_ms_per_token": config.replica.prefill_ms_per_token, "workload": workload.name,
        "replicas": args.replicas, "groups": args.groups, "group_size": args.group_size, "steps": config.steps,
        "rho": args.rho, "extra": config.router.extra, "max_redraws": config.router.max_redraws, "seed": args.seed,
        "window_skip": SKIP_STEPS, "truth": truth_json(config),
        "uniform_mean_step_s": summaries["uniform"].mean_step_s,
        "best_static": {"q": grid.q, "m": grid.m} | policy_json(grid.best, best),
        "static_grid": [{"q": q, "m": m, "mean_step_s": v, "speedup": summaries["uniform"].mean_step_s / v}
                        for (q, m), v in sorted(grid.mean_s.items())],
        "tailsieve": policy_json(adaptive, ada),
        "peers": {name: policy_json(peers[name], summaries[name]) for name in PEERS},
        "vs_balancer": {ADAPTIVE: balancer_json(vs[ADAPTIVE]), "best_static": balancer_json(vs[static])},
        "pays": vs[ADAPTIVE].pays,
        "best_static_pays": vs[static].pays,
        "beats_uniform": {ADAPTIVE: beats_uniform(ada), "best_static": beats_uniform(best)},
        "answer": answer(summaries, static, vs),
    }
    if args.spec:
        doc["spec_depths"] = plan_spec.answer(args, workload, model.curve, config, ADAPTIVE)
    if args.json:
        for key in ("best_static", "tailsieve"):
            doc[key].pop("steps", None)
        for entry in doc["peers"].values():
            entry.pop("steps", None)
        print_json(doc)
        return 0
    con = console()
    con.print(headline_table(summaries, headline_rows(summaries, PEERS, bound=static), runs=runs, title=(
        f"Plan: {workload.name} on {model.curve.name} (kv {config.replica.kv_ms_per_1k_tokens:g} ms/1k ctx, prefill "
        f"{config.replica.prefill_ms_per_token:g} ms/token)\n"
        f"{step_shape(args.replicas, args.groups, args.group_size, config.steps, args.rho, config.router.extra)}, "
        f"max redraws {config.router.max_redraws}")))
    con.print(headline_note(runs), highlight=False)
    _details(con, doc)
    con.print(doc["answer"], highlight=False)
    if args.spec:
        plan_spec.print_answer(con, doc["spec_depths"])
    return 0


def _verdicts(args: argparse.Namespace, runs: dict[str, PolicyRun], static: str, qm: tuple[int, int],
              curve: TpotCurve, config: SimConfig, workload: Workload) -> dict[str, Verdict]:
    """The controller and the best static split against verl's balancer, pooled over --replications runs."""
    with progress_bar(2 * config.steps * (replications(args, workload) - 1) * 2, enabled=progress_enabled(),
                      command="plan") as tick:
        lif = runs[BALANCER]
        return {ADAPTIVE: replicated_verdict(args, runs[ADAPTIVE], lif, curve, config, workload, on_step=tick),
                static: replicated_verdict(args, runs[static], lif, curve, replace(config, q=qm[0], m=qm[1]),
                                           workload, on_step=tick)}


def beats_uniform(s: PolicySummary) -> bool:
    """Faster than uniform beyond noise: speedup > 1, outside its ±2σ band, and off the uniform boundary."""
    return s.verdict is not None and s.verdict.pays


def answer(summaries: dict[str, PolicySummary], static: str, vs: dict[str, Verdict]) -> str:
    """The verdict, from the rows of the table: the controller against verl's balancer (`analysis.balancer`) with its
    speedup over uniform; when it does not pay, the best static split if that pays against the balancer, else the
    advice to keep the balancer."""
    ada, best, lif = summaries[ADAPTIVE], summaries[static], summaries[BALANCER]
    text = verdict_line(vs[ADAPTIVE], ada.speedup)
    if vs[ADAPTIVE].pays:
        return text
    split = vs[static]
    if split.pays:
        runs = f" over {split.runs} runs" if split.runs > 1 else ""
        return (f"{text} A static split pays: {static.removeprefix('static ')} gives {split.speedup:.3f}× verl's "
                f"balancer{length_phrase(split.length_ratio)} (±{100 * (split.speedup_2sigma or 0):.1f}% at 2σ{runs}) "
                f"and {best.speedup or 0:.3f}× uniform (set it with --policy static --q {best.final_q} --m "
                f"{best.final_m}).")
    return (f"{text} No static split beats verl's balancer beyond noise either: keep verl's balancer (verl-lif, "
            f"{lif.speedup or 0:.3f}× uniform).")


def _details(con: Console, doc: dict[str, Any]) -> None:
    """The best static split and the controller, with their length bias at the redraw limit."""
    b, t = doc["best_static"], doc["tailsieve"]
    tb = t["bias"] or {}
    sb = b["bias"] or {}
    con.print(
        f"best static split: q = {b['q']}, m = {b['m']} → {b['speedup']:.3f}× uniform "
        f"(length ratio {sb.get('mean_ratio') or float('nan'):.3f}); adaptive tailsieve: {t['speedup']:.3f}× "
        f"({t['verdict']['note'] if t['verdict'] else ''}), settles at q = {t['final_q']}, m = {t['final_m']}, length "
        f"ratio {tb.get('mean_ratio') or float('nan'):.3f}, length-distribution distance (KS) "
        f"{tb.get('ks') or 0.0:.3f} at max redraws "
        f"{doc['max_redraws']}.", highlight=False)
