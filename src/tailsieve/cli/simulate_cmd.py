"""`tailsieve simulate`: every policy on one simulated prompt stream, Table-1-style (§4.2), with App. E bias and
the §2.3 capture rates. Defaults: the bundled KodCode R1 trace replayed in `resample` mode, h100-llama3-8b, R = 8,
N = 64 groups of G = 8, 30 steps. Definitions: docs/simulate.md. Per-pool speculative decoding (§3.4: `--tail-spec`,
`--bulk-spec`, `--config`) and the matched-budget table (§4.3: `--spec`): docs/speculative.md. The comparison table
and the JSON come from `tailsieve.analysis.report` (shared with `rollout`); the flags' handling from `sim_args`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.table import Table

from tailsieve.analysis.balancer import BALANCER, balancer_verdicts
from tailsieve.analysis.fidelity import Verdict
from tailsieve.analysis.headline import headline_note, headline_rows, headline_table
from tailsieve.analysis.metrics import PolicySummary, summarize
from tailsieve.analysis.report import batch_columns, fidelity_notes, report_json, summary_table
from tailsieve.cli._common import add_trace_columns, console, plot_path, print_json, progress_enabled
from tailsieve.cli._plots import legend_outside, policy_styles, pyplot, save_figure
from tailsieve.cli.flags import add, add_controller_flags
from tailsieve.cli.sim_args import (
    DEFAULT_REPLAY,
    add_replications,
    add_truth_flags,
    build_config,
    load_inputs,
    parse_policies,
    progress_bar,
    replicated_verdict,
    replications,
    step_shape,
    truth_json,
    verdict_line,
)
from tailsieve.cli.simulate_spec import run_spec
from tailsieve.errors import ConfigError
from tailsieve.loop import SKIP_STEPS, PolicyRun
from tailsieve.model.costmodel import load_cost_model
from tailsieve.policy.ranking import DEFAULT_RANKING
from tailsieve.policy.router import DEFAULT_REDRAWS
from tailsieve.simulation.capture import CaptureRate, capture_rates
from tailsieve.simulation.runs import ORACLES, PEERS, policy_names, run_policies

CAPTURE_STEPS = 10
PLOTTED = ("tailsieve", "verl-lif", "topq-best")  # `--plot` by default (topq-best: the best static split in hindsight)
JUDGED = "tailsieve"  # the policy whose verdict against verl's balancer is pooled over --replications runs


def register(sub: Any) -> None:
    """Add the `simulate` command."""
    p = sub.add_parser(
        "simulate", help="simulate every routing policy on one prompt stream: step time, speedup, q/m, bias",
        description="Simulate synchronous rollout steps of every policy on the same prompt stream and length draws; "
                    "print a Table-1-style comparison (mean step time after warm-up, speedup over uniform, final "
                    "q and m, wasted tokens, length bias) and the partial-rollout capture rates.")
    p.add_argument("--workload", help="bundled workload name or trace file (default: kodcode-r1)")
    add_trace_columns(p, "a --workload trace file")
    p.add_argument("--replay", default=DEFAULT_REPLAY.value,
                   help="trace replay mode: recorded (exact cyclic) or resample (i.i.d. per generation; default)")
    add(p, "--curve")
    add(p, "--replicas")
    add(p, "--groups")
    add(p, "--group-size")
    add(p, "--steps")
    add(p, "--rho")
    p.add_argument("--policy", action="append", metavar="NAME",
                   help=f"repeatable (or comma-separated); 'all' (default) = {', '.join(policy_names())}")
    add(p, "--q")
    add(p, "--m")
    add(p, "--ranking")
    add(p, "--max-redraws")
    add(p, "--dispatch")
    add(p, "--seed")
    add(p, "--shuffle")
    add(p, "--max-num-seqs")
    add(p, "--kv-ms-per-1k")
    add(p, "--prefill-ms-per-token")
    add(p, "--bias-correction")
    add_truth_flags(p)
    p.add_argument("--oversample", type=float, metavar="RATIO",
                   help="peers april-partial, april-drop, rollpacker: extra groups started per step, ⌈RATIO·N⌉ "
                        "(slime's over-sampling, RollPacker's over-provisioning; default: --rho; docs/peers.md)")
    p.add_argument("--long-round-period", type=int, metavar="K",
                   help="rollpacker: a long round of deferred prompts every K steps (default: whenever N deferred "
                        "prompts wait)")
    p.add_argument("--restart-s", type=float, default=0.0,
                   help="seconds a step pays when m changes (a launcher restarting the moved replicas because the "
                        "pools' flags differ; default 0: restart-free moves)")
    p.add_argument("--engine-scale", type=float, default=1.0, metavar="X",
                   help="the simulated replicas decode at tau(b)*X while every policy keeps --curve: a fleet slower "
                        "(> 1) or faster (< 1) than its profile, a model error the controller must learn (default 1)")
    add_spec_and_output_args(p)
    add_controller_flags(p)
    p.set_defaults(func=run)


def add_spec_and_output_args(p: argparse.ArgumentParser) -> None:
    """`simulate`'s per-pool speculation (§3.4, §4.3) and output flags."""
    p.add_argument("--config", metavar="FILE", help="TOML/JSON file with [spec.tail] and [spec.bulk] speculative "
                   "configurations (docs/speculative.md); --tail-spec/--bulk-spec override it")
    add(p, "--tail-spec")
    add(p, "--bulk-spec")
    p.add_argument("--spec", metavar="METHOD", help="print the matched-budget table instead (§4.3, Fig. 6a): uniform "
                   "with depth d on every replica vs TailSieve with d_bulk + d_tail = 2d; NAME[:BRACKET][,key=value…] "
                   "(mtp, dflash: also under the published range's low, central and high profiles; suffix: drafts from "
                   "the rollout's history, four arms against verl-lif under each bracket, depths from --spec-budgets)")
    p.add_argument("--spec-budgets", metavar="LIST",
                   help="--spec: budgets d, comma-separated and/or ranges A..B (default: 0..6)")
    add_replications(p)
    add(p, "--json")
    p.add_argument("--plot", help="save step times and q/m trajectories (Fig. 6b) to this .png/.pdf/.svg")
    p.add_argument("--plot-policies", metavar="LIST",
                   help="--plot: the policies drawn, comma-separated, or all (default: "
                        f"{', '.join(PLOTTED)}: TailSieve, verl's balancer and the best static split in hindsight)")


def run(args: argparse.Namespace) -> int:
    """Simulate the chosen policies and print the comparison (or JSON)."""
    plot = plot_path(args.plot) if args.plot else None
    if args.plot_policies is not None and plot is None:
        raise ConfigError("--plot-policies chooses what --plot draws; add --plot FILE")
    if args.spec is not None:
        return run_spec(args, plot)
    if args.spec_budgets is not None:
        raise ConfigError("--spec-budgets belongs to the matched-budget table; add --spec METHOD")
    policies = parse_policies(args.policy, args.replicas)
    model = load_cost_model(args.curve)
    config = build_config(args, policies, model)
    curve = model.curve
    workload = load_inputs(args)
    judged = JUDGED in policies and BALANCER in policies
    more = 2 * config.steps * (replications(args, workload) - 1) if judged else 0  # at most: verdict runs
    total = config.steps * len(policies) + 1 + more  # + the capture measurement
    with progress_bar(total, enabled=progress_enabled(), steps=config.steps) as tick:
        runs = run_policies(policies, workload, curve, config, on_step=tick)
        capture = capture_rates(workload, config.spec.bulk.curve(config.truth_curve or curve), config.router,
                                steps=CAPTURE_STEPS, replica=config.replica, shuffle=config.shuffle, seed=config.seed)
        tick("capture", 1)
        verdicts = balancer_verdicts(runs, oracles=ORACLES)
        if judged and JUDGED in verdicts:
            verdicts[JUDGED] = replicated_verdict(args, runs[JUDGED], runs[BALANCER], curve, config, workload,
                                                  on_step=tick)
    replay = "synthetic" if workload.is_synthetic else args.replay
    plot_title = f"{workload.name} ({replay}), {curve.name}, R={args.replicas}, N={args.groups}"
    if args.json:
        print_json(report_json(runs, {
            "workload": workload.name, "replay": replay, "curve": curve.name, "replicas": args.replicas,
            "groups": args.groups, "group_size": args.group_size, "steps": config.steps, "rho": args.rho,
            "extra": config.router.extra, "dispatch": config.router.dispatch.value,
            "ranking": config.router.ranking, "max_redraws": config.router.max_redraws, "seed": args.seed,
            "window_skip": SKIP_STEPS, "spec": config.spec.to_json(), "restart_s": config.restart_s,
            "engine_scale": config.engine_scale, "truth": truth_json(config),
            "peers": {"oversample": config.peers.oversample, "extra": config.peers.extra(config.router),
                      "long_round_period": config.peers.long_round_period},
        } | ({"bias_correction": True} if config.bias_correction else {}), oracles=ORACLES, verdicts=verdicts)
            | {"capture": [_capture_json(c) for c in capture]})
        if plot is not None:
            save_plot(plotted(runs, args.plot_policies), plot, plot_title, quiet=True)
        return 0
    print_tables(summarize(runs, oracles=ORACLES), capture, verdicts, runs=runs,
                 full=args.policy is not None, title=(
        f"Simulated rollouts: {workload.name} (replay {replay}{', default' if args.replay == DEFAULT_REPLAY else ''})"
        f", curve {curve.name}\n"
        + step_shape(args.replicas, args.groups, args.group_size, config.steps, args.rho, config.router.extra)
        + f", dispatch {config.router.dispatch.value}"
        + ("" if config.router.ranking == DEFAULT_RANKING else f", ranking {config.router.ranking}")
        + ("" if config.router.max_redraws == DEFAULT_REDRAWS else f", max redraws {config.router.max_redraws}")
        + (", bias correction" if config.bias_correction else "")
        + (f", oversample {config.peers.oversample}" if config.peers.oversample is not None else "")
        + (f", long round every {config.peers.long_round_period}" if config.peers.long_round_period else "")
        + (f"\nspeculation: tail {config.spec.tail.label}, bulk {config.spec.bulk.label} (uniform, warm-up and "
           "oracles: bulk on every replica)" if config.spec.enabled else "")))
    if plot is not None:
        save_plot(plotted(runs, args.plot_policies), plot, plot_title)
    return 0


def _capture_json(c: CaptureRate) -> dict[str, Any]:
    return {"rho": c.rho, "candidates": c.candidates, "tail_groups": c.tail_groups, "next_generation":
            c.next_generation, "same_generation": c.same_generation, "longest_group": c.longest_group,
            "steps": c.steps}


def print_tables(summaries: dict[str, PolicySummary], capture: tuple[CaptureRate, ...],
                 verdicts: Mapping[str, Verdict], *, title: str, full: bool,
                 runs: Mapping[str, PolicyRun] | None = None) -> None:
    """Without --policy the short table of the deciding rows, its note and the summary sentence: tailsieve against
    verl's balancer (`analysis.headline`, `analysis.balancer`); with it the comparison table of the chosen policies,
    the fidelity lines, each two-pool policy against the balancer, the capture table and the notes."""
    con = console()
    if not full:
        con.print(headline_table(summaries, headline_rows(summaries, PEERS), title=title, runs=runs))
        con.print(f"{headline_note(runs or {})} *: knows each response's length in advance and splits uniform's "
                  "batches without over-provisioning (a heuristic, not a bound). --policy all: every policy, the "
                  "fidelity lines and the tail capture table.", highlight=False)
        if JUDGED in verdicts:
            con.print(verdict_line(verdicts[JUDGED], summaries[JUDGED].speedup), highlight=False)
        return
    con.print(summary_table(summaries, title=title, extra_columns=batch_columns(summaries)))
    for line in fidelity_notes(summaries):
        con.print(line, highlight=False)
    for name, v in verdicts.items():
        con.print(f"against {BALANCER}: {verdict_line(v, summaries[name].speedup)}", highlight=False)
    cap = Table(title="Partial-rollout tail capture (§2.3, Fig. 3): warm-up steps, N + E groups cut at N")
    for i, col in enumerate(("ρ", "unfinished E", "tail groups k", "next generation", "same generation",
                             "longest group")):
        cap.add_column(col, justify="left" if i == 0 else "right")
    for c in capture:
        cap.add_row(f"{100 * c.rho:g}%", str(c.candidates), str(c.tail_groups), f"{100 * c.next_generation:.1f}%",
                    f"{100 * c.same_generation:.1f}%", f"{100 * c.longest_group:.1f}%")
    con.print(cap)
    con.print(f"mean step: mean makespan over all steps but the first {SKIP_STEPS} (warm-up, first steady step); "
              "speedup = uniform's mean / the policy's, same prompts and draws. *oracle: knows realized lengths "
              "and replays uniform's batches (App. A.2); topq-best is a known-length top-q heuristic without "
              "over-provisioning, not a bound. q/m: last step's; streamrl-oracle's m = dedicated "
              "replicas. wasted: aborted-group tokens / all generated. length ratio: mean consumed response "
              "length vs uniform's; KS: the largest gap between the two length distributions (App. E). "
              "off-policy: consumed tokens generated in an earlier step (resumed "
              "prefixes); dropped: prompts dropped unconsumed; delayed: consumed groups first dispatched ≥ 2 steps "
              "earlier; batch CV: spread of the per-step mean length (docs/peers.md). ±2σ: "
              "two standard errors of the speedup from the per-step differences paired with uniform; ~: within "
              "noise or never off the uniform boundary (docs/simulate.md). capture: share of the top-k groups (longest "
              "member) found among the unfinished, k = ⌈5%·(N+E)⌉, ranked by the prompt's next generation or the "
              "cut one. Terms: docs/glossary.md.")


def plotted(runs: dict[str, PolicyRun], request: str | None) -> dict[str, PolicyRun]:
    """The runs `--plot` draws: `PLOTTED` by default (those that ran; every run when none of them did), `all`, or the
    comma-separated names asked for (each must have run: one-line error otherwise)."""
    if request is None:
        chosen = [n for n in PLOTTED if n in runs] or list(runs)
    elif request.strip() == "all":
        chosen = list(runs)
    else:
        chosen = [n.strip() for n in request.split(",") if n.strip()]
        if not chosen:
            raise ConfigError("--plot-policies is empty; give policy names or all")
        if unknown := [n for n in chosen if n not in runs]:
            raise ConfigError(f"--plot-policies: {', '.join(unknown)} did not run; ran: {', '.join(runs)}")
    return {n: runs[n] for n in dict.fromkeys(chosen)}


def save_plot(runs: dict[str, PolicyRun], path: Path, title: str, *, quiet: bool = False) -> None:
    """Step makespan per policy, and the q/m trajectories of the two-pool policies (like Fig. 6b): one colour and
    style per policy in both panels, tailsieve emphasized, legends outside the data."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 4.8))
    style = policy_styles(list(runs), dashed=ORACLES)
    for name, r in runs.items():
        ax1.plot([s.step for s in r.steps], [s.makespan_s for s in r.steps], label=name, **style[name].kwargs())
    ax1.set_xlabel("step")
    ax1.set_ylabel("step makespan (s)")
    ax1.set_title("step time")
    legend_outside(ax1)
    ax_m = ax2.twinx()
    adaptive = [n for n in runs if n != "uniform" and n not in ORACLES and n not in PEERS]  # peers: m = 0
    for name in adaptive:
        steps = [s.step for s in runs[name].steps]
        kw = style[name].kwargs()
        ax2.plot(steps, [s.q for s in runs[name].steps], label=f"{name} q", **(kw | {"linestyle": "-"}))
        ax_m.plot(steps, [s.m for s in runs[name].steps], label=f"{name} m", **(kw | {"linestyle": ":"}))
    ax2.set_xlabel("step")
    ax2.set_ylabel("isolated groups q (solid)")
    ax_m.set_ylabel("tail replicas m (dotted)")
    for ax in (ax2, ax_m):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_title("controller trajectories")
    if adaptive:
        h1, l1 = ax2.get_legend_handles_labels()
        h2, l2 = ax_m.get_legend_handles_labels()
        legend_outside(ax_m, h1 + h2, l1 + l2, below=True)  # the right side holds m's axis
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, quiet=quiet)
