"""`tailsieve simulate`: every policy on one simulated prompt stream, Table-1-style (§4.2), with App. E bias and
the §2.3 capture rates. Defaults: the bundled KodCode R1 trace replayed in `resample` mode, h100-llama3-8b, R = 8,
N = 64 groups of G = 8, 30 steps. Definitions: docs/simulate.md. Per-pool speculative decoding (§3.4: `--tail-spec`,
`--bulk-spec`, `--config`) and the matched-budget table (§4.3: `--spec`): docs/speculative.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tailsieve.analysis.metrics import PolicySummary, summarize
from tailsieve.cli._common import console, plot_path, print_json
from tailsieve.errors import ConfigError
from tailsieve.loop import SKIP_STEPS, PolicyRun
from tailsieve.model.curves import load_curve
from tailsieve.model.speculative import PoolSpec, load_config_file, parse_spec
from tailsieve.policy.controller import ControllerConfig
from tailsieve.policy.router import Dispatch, RouterConfig
from tailsieve.simulation.capture import CaptureRate, capture_rates
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.simulation.runs import ORACLES, SimConfig, check_policy, policy_names, run_policies
from tailsieve.workloads import ReplayMode, Workload, load_workload

DEFAULT_REPLAY = ReplayMode.RESAMPLE
CAPTURE_STEPS = 10


def register(sub: Any) -> None:
    """Add the `simulate` command."""
    p = sub.add_parser(
        "simulate", help="simulate every routing policy on one prompt stream: step time, speedup, q/m, bias",
        description="Simulate synchronous rollout steps of every policy on the same prompt stream and length draws; "
                    "print a Table-1-style comparison (mean step time after warm-up, speedup over uniform, final "
                    "q and m, wasted tokens, length bias) and the partial-rollout capture rates.")
    p.error = _one_line_error(p.prog)
    p.add_argument("--workload", help="bundled workload name or trace file (default: kodcode-r1)")
    p.add_argument("--replay", default=DEFAULT_REPLAY.value,
                   help="trace replay mode: recorded (exact cyclic) or resample (i.i.d. per generation; default)")
    p.add_argument("--curve", default="h100-llama3-8b", help="TPOT curve: built-in name or file (default: %(default)s)")
    p.add_argument("--replicas", type=int, default=8, help="R replicas (default: %(default)s)")
    p.add_argument("--groups", type=int, default=64, help="N prompt groups per step (default: %(default)s)")
    p.add_argument("--group-size", type=int, default=8, help="G responses per group (default: %(default)s)")
    p.add_argument("--steps", type=int, default=30, help="rollout steps per policy (default: %(default)s)")
    p.add_argument("--rho", type=float, default=0.1, help="over-provisioning ρ, E = ⌈ρN⌉ (default: %(default)s)")
    p.add_argument("--policy", action="append", metavar="NAME",
                   help=f"repeatable (or comma-separated); 'all' (default) = {', '.join(policy_names())}")
    p.add_argument("--q", type=int, help="static: isolated groups q")
    p.add_argument("--m", type=int, help="static: tail replicas m (0 = uniform)")
    p.add_argument("--q0", type=int, help="adaptive controllers: initial q (default: ControllerConfig.q0)")
    p.add_argument("--m0", type=int, help="adaptive controllers: initial m (default: ControllerConfig.m0)")
    p.add_argument("--dispatch", default=Dispatch.REQUEST.value,
                   help="round-robin unit inside a pool: request (§3.1, default) or group")
    p.add_argument("--seed", type=int, default=0, help="seed of resampling / synthetic draws and --shuffle")
    p.add_argument("--shuffle", action="store_true", help="shuffle the prompt order each epoch (seeded)")
    p.add_argument("--max-num-seqs", type=int, help="replica admission cap (FCFS queue); default: all admitted")
    p.add_argument("--kv-ms-per-1k", type=float, default=0.0, help="KV-traffic ms per 1k context tokens per iteration")
    p.add_argument("--prefill-ms-per-token", type=float, default=0.0, help="prefill stall per prompt token (ms)")
    p.add_argument("--restart-s", type=float, default=0.0,
                   help="seconds a step pays when m changes (a launcher restarting the moved replicas because the "
                        "pools' flags differ; default 0: restart-free moves)")
    p.add_argument("--config", metavar="FILE", help="TOML/JSON file with [spec.tail] and [spec.bulk] speculative "
                   "configurations (docs/speculative.md); --tail-spec/--bulk-spec override it")
    p.add_argument("--tail-spec", metavar="SPEC", help="tail pool speculation METHOD[:TOKENS][,key=value…], "
                   "METHOD in none, mtp, eagle3, dflash, ngram, suffix; keys acceptance, decay, draft_cost, "
                   "verify_cost, draft_share")
    p.add_argument("--bulk-spec", metavar="SPEC", help="bulk pool speculation (also every replica in uniform and "
                   "warm-up steps), same form as --tail-spec")
    p.add_argument("--spec", metavar="METHOD", help="print the matched-budget table instead (§4.3, Fig. 6a): uniform "
                   "with depth d on every replica vs TailSieve with d_bulk + d_tail = 2d; METHOD[,key=value…]")
    p.add_argument("--spec-budgets", metavar="LIST", help="--spec: comma-separated budgets d (default: 0,1,…,6)")
    p.add_argument("--json", action="store_true", help="machine-readable output (structure in docs/simulate.md)")
    p.add_argument("--plot", help="save step times and q/m trajectories (Fig. 6b) to this .png/.pdf/.svg")
    p.set_defaults(func=run)


def _one_line_error(prog: str) -> Callable[[str], NoReturn]:
    def error(message: str) -> NoReturn:
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    return error


def parse_policies(values: list[str] | None, replicas: int) -> list[str]:
    """Policy names in canonical order (uniform first); 'all' or nothing means every policy."""
    names = [n.strip() for v in values or ["all"] for n in v.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"--policy is empty; valid: {', '.join(policy_names())}, or all")
    chosen = list(policy_names()) if "all" in names else names
    for name in chosen:
        check_policy(name, replicas)
    order = {n: i for i, n in enumerate(policy_names())}
    return sorted(dict.fromkeys(["uniform", *chosen]), key=lambda n: order[n])


def build_config(args: argparse.Namespace, policies: list[str]) -> SimConfig:
    """Validate the numeric flags (one-line errors naming the flag) and build the run configuration."""
    for flag, value in (("--replicas", args.replicas), ("--groups", args.groups), ("--group-size", args.group_size),
                        ("--steps", args.steps)):
        if value < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {value}")
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        raise ConfigError(f"--max-num-seqs must be a positive integer, got {args.max_num_seqs}")
    if (args.q is not None or args.m is not None) and "static" not in policies:
        raise ConfigError("--q/--m set the static policy; add --policy static (or all)")
    if args.q is not None and args.q < 0:
        raise ConfigError(f"--q must be >= 0, got {args.q}")
    for flag, m in (("--m", args.m), ("--m0", args.m0)):
        if m is not None and not 0 <= m < args.replicas:
            raise ConfigError(f"{flag} must lie in 0..{args.replicas - 1} (R={args.replicas}), got {m}")
    if args.q0 is not None and args.q0 < 0:
        raise ConfigError(f"--q0 must be >= 0, got {args.q0}")
    if args.seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {args.seed}")
    if not (args.restart_s >= 0 and math.isfinite(args.restart_s)):
        raise ConfigError(f"--restart-s must be >= 0 and finite, got {args.restart_s}")
    try:
        dispatch = Dispatch(args.dispatch)
    except ValueError:
        raise ConfigError(f"--dispatch must be request or group, got '{args.dispatch}'") from None
    router = RouterConfig(groups=args.groups, group_size=args.group_size, replicas=args.replicas, rho=args.rho,
                          dispatch=dispatch)
    replica = ReplicaConfig(max_num_seqs=args.max_num_seqs, kv_ms_per_1k_tokens=args.kv_ms_per_1k,
                            prefill_ms_per_token=args.prefill_ms_per_token)
    ctl = ControllerConfig(**{k: v for k, v in (("q0", args.q0), ("m0", args.m0)) if v is not None})
    return SimConfig(router=router, replica=replica, controller=ctl, steps=args.steps, q=args.q, m=args.m,
                     shuffle=args.shuffle, seed=args.seed, spec=pool_spec(args), restart_s=args.restart_s)


def pool_spec(args: argparse.Namespace) -> PoolSpec:
    """Per-pool speculation: the --config file's [spec] tables, then --tail-spec / --bulk-spec on top."""
    pools = load_config_file(Path(args.config)) if args.config else PoolSpec()
    if args.tail_spec is not None:
        pools = replace(pools, tail=parse_spec(args.tail_spec, "--tail-spec"))
    if args.bulk_spec is not None:
        pools = replace(pools, bulk=parse_spec(args.bulk_spec, "--bulk-spec"))
    return pools


def load_inputs(args: argparse.Namespace) -> Workload:
    """The workload under the validated --replay mode."""
    try:
        mode = ReplayMode(args.replay)
    except ValueError:
        mode = ReplayMode.SYNTHETIC
    if mode is ReplayMode.SYNTHETIC:
        raise ConfigError(f"--replay must be recorded or resample, got '{args.replay}'")
    return load_workload(args.workload, mode=mode, seed=args.seed)


@contextmanager
def progress_bar(total: int, enabled: bool) -> Iterator[Callable[[str, int], None]]:
    """A rich progress bar on stderr (never stdout); yields the per-step callback."""
    con = Console(stderr=True)
    bar = Progress(TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=con, transient=True, disable=not enabled)
    task = bar.add_task("simulating", total=total)
    with bar:
        yield lambda name, _i: bar.update(task, advance=1, description=name)


def policy_json(run: PolicyRun, s: PolicySummary) -> dict[str, Any]:
    """One policy's entry of the --json document."""
    return {
        "mean_step_s": s.mean_step_s, "speedup": s.speedup, "final_q": s.final_q, "final_m": s.final_m,
        "wasted_share": s.wasted_share, "bias": {"mean_ratio": s.bias.mean_ratio, "ks": s.bias.ks},
        "oracle": run.policy in ORACLES,
        "steps": [{"step": r.step, "makespan_s": r.makespan_s, "tail_s": r.tail_s, "bulk_s": r.bulk_s, "q": r.q,
                   "m": r.m, "candidates": r.candidates, "wasted_tokens": r.wasted_tokens,
                   "batch_mean_length": r.batch_mean_length, "warmup": r.warmup, "note": r.note}
                  for r in run.steps],
    }


def run(args: argparse.Namespace) -> int:
    """Simulate the chosen policies and print the comparison (or JSON)."""
    plot = plot_path(args.plot) if args.plot else None
    if args.spec is not None:
        from tailsieve.cli.simulate_spec import run_spec

        return run_spec(args, plot)
    if args.spec_budgets is not None:
        raise ConfigError("--spec-budgets belongs to the matched-budget table; add --spec METHOD")
    policies = parse_policies(args.policy, args.replicas)
    config = build_config(args, policies)
    curve = load_curve(args.curve)
    workload = load_inputs(args)
    total = config.steps * len(policies) + 1  # + the capture measurement
    with progress_bar(total, enabled=sys.stderr.isatty()) as tick:
        runs = run_policies(policies, workload, curve, config, on_step=tick)
        capture = capture_rates(workload, config.spec.bulk.curve(curve), config.router, steps=CAPTURE_STEPS,
                                replica=config.replica, shuffle=config.shuffle, seed=config.seed)
        tick("capture", 1)
    summaries = summarize(runs)
    replay = "synthetic" if workload.is_synthetic else args.replay
    if plot is not None:
        save_plot(runs, plot, f"{workload.name} ({replay}), {curve.name}, R={args.replicas}, N={args.groups}")
    if args.json:
        print_json({
            "workload": workload.name, "replay": replay, "curve": curve.name, "replicas": args.replicas,
            "groups": args.groups, "group_size": args.group_size, "steps": config.steps, "rho": args.rho,
            "extra": config.router.extra, "dispatch": config.router.dispatch.value, "seed": args.seed,
            "window_skip": SKIP_STEPS, "spec": config.spec.to_json(), "restart_s": config.restart_s,
            "policies": {name: policy_json(runs[name], summaries[name]) for name in runs},
            "capture": [_capture_json(c) for c in capture],
        })
        return 0
    print_tables(summaries, capture, title=(
        f"Simulated rollouts: {workload.name} (replay {replay}{', default' if args.replay == DEFAULT_REPLAY else ''})"
        f", curve {curve.name}\nR={args.replicas}, N={args.groups} groups × G={args.group_size}, "
        f"{config.steps} steps, ρ={args.rho} (E={config.router.extra}), dispatch {config.router.dispatch.value}"
        + (f"\nspeculation: tail {config.spec.tail.label}, bulk {config.spec.bulk.label} (uniform, warm-up and "
           "oracles: bulk on every replica)" if config.spec.enabled else "")))
    if plot is not None:
        console().print(f"plot saved to {plot}")
    return 0


def _capture_json(c: CaptureRate) -> dict[str, Any]:
    return {"rho": c.rho, "candidates": c.candidates, "tail_groups": c.tail_groups, "next_generation":
            c.next_generation, "same_generation": c.same_generation, "longest_group": c.longest_group,
            "steps": c.steps}


def print_tables(summaries: dict[str, PolicySummary], capture: tuple[CaptureRate, ...], *, title: str) -> None:
    """The comparison table, the capture table and the notes."""
    con = console()
    table = Table(title=title)
    for i, col in enumerate(("policy", "mean step s", "speedup", "final q", "final m", "wasted tokens",
                             "length ratio", "KS")):
        table.add_column(col, justify="left" if i == 0 else "right")
    for name, s in summaries.items():
        star = "*" if name in ORACLES else ""
        table.add_row(f"{name}{star}", f"{s.mean_step_s:.2f}", f"{s.speedup:.3f}×", str(s.final_q), str(s.final_m),
                      f"{100 * s.wasted_share:.1f}%", f"{s.bias.mean_ratio:.3f}", f"{s.bias.ks:.3f}")
    con.print(table)
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
              "and replays uniform's batches (App. A.2). q/m: last step's; streamrl-oracle's m = dedicated "
              "replicas. wasted: aborted-group tokens / all generated. length ratio, KS: consumed response "
              "lengths vs uniform (App. E). capture: share of the top-k groups (longest member) found among the "
              "unfinished, k = ⌈5%·(N+E)⌉, ranked by the prompt's next generation or the cut one.")


def save_plot(runs: dict[str, PolicyRun], path: Path, title: str) -> None:
    """Step makespan per policy, and the q/m trajectories of the two-pool policies (like Fig. 6b)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    color = {name: f"C{i % 10}" for i, name in enumerate(runs)}  # one colour per policy in both panels
    for name, r in runs.items():
        ax1.plot([s.step for s in r.steps], [s.makespan_s for s in r.steps], label=name, color=color[name],
                 linestyle="--" if name in ORACLES else "-", linewidth=1.2)
    ax1.set_xlabel("step")
    ax1.set_ylabel("step makespan (s)")
    ax1.set_title("step time")
    ax1.legend(fontsize=7)
    ax_m = ax2.twinx()
    adaptive = [n for n in runs if n != "uniform" and n not in ORACLES]
    for name in adaptive:
        steps = [s.step for s in runs[name].steps]
        ax2.plot(steps, [s.q for s in runs[name].steps], color=color[name], label=f"{name} q")
        ax_m.plot(steps, [s.m for s in runs[name].steps], color=color[name], linestyle=":", label=f"{name} m")
    ax2.set_xlabel("step")
    ax2.set_ylabel("isolated groups q (solid)")
    ax_m.set_ylabel("tail replicas m (dotted)")
    for ax in (ax2, ax_m):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_title("controller trajectories")
    if adaptive:
        h1, l1 = ax2.get_legend_handles_labels()
        h2, l2 = ax_m.get_legend_handles_labels()
        ax2.legend(h1 + h2, l1 + l2, fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
