"""Argument handling shared by `tailsieve simulate` and its `--spec` table (`simulate_cmd`, `simulate_spec` both
import it; it imports neither): policy names, the validated run configuration, per-pool speculation, the workload
and the stderr progress bar."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tailsieve.analysis.balancer import BALANCER, sentence
from tailsieve.analysis.fidelity import Verdict
from tailsieve.analysis.replications import DEFAULT_RUNS, FLOOR, RESOLVE, replicate
from tailsieve.cli._common import progress_console, trace_columns, warn_few_prompts
from tailsieve.cli.flags import add, controller_config, policy_names_given
from tailsieve.cli.progress import heartbeat
from tailsieve.errors import ConfigError
from tailsieve.inputs import MAX_REPLICAS, MAX_STEP_REQUESTS, check_step_size, excerpt, finite, int_in
from tailsieve.loop import PolicyRun
from tailsieve.model.costmodel import CostModel, load_cost_model
from tailsieve.model.curves import TpotCurve
from tailsieve.model.engine import MAX_BLOCK, MAX_DRIFT, MAX_KV_TOKENS, MAX_SPREAD, EngineTruth, FleetSpeed
from tailsieve.model.spec_fit import context_for
from tailsieve.model.spec_keys import SpecContext
from tailsieve.model.spec_parse import load_config_file, parse_spec
from tailsieve.model.speculative import PoolSpec
from tailsieve.policy.peers import PeerConfig
from tailsieve.policy.router import RouterConfig
from tailsieve.policy.router_knobs import router_values
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.simulation.runs import SimConfig, check_policy, policy_names, run_policy
from tailsieve.workloads import ReplayMode, Workload, load_workload

DEFAULT_REPLAY = ReplayMode.RESAMPLE
MAX_STEPS = 100_000
MAX_MS = 1e6  # per-token / per-1k-token stalls: at most 1000 s
MAX_SECONDS = 1e7  # a restart: at most ~4 months


def parse_policies(values: list[str] | None, replicas: int) -> list[str]:
    """Policy names in canonical order (uniform first); 'all' or nothing means every policy."""
    names = policy_names_given(values or None, "all")
    if not names:
        raise ConfigError(f"--policy is empty; valid: {', '.join(policy_names())}, or all")
    if "all" not in names:
        for name in names:
            check_policy(name, replicas)
        chosen = names
    else:  # the default: the user named no policy, so the error names the flag they gave (--replicas)
        chosen = list(policy_names())
        too_few = [n for n in chosen if not runs_on(n, replicas)]
        if too_few:
            ok = [n for n in chosen if n not in too_few]
            raise ConfigError(f"--replicas {replicas}: {len(too_few)} of the {len(chosen)} policies of --policy all "
                              "(the default) need at least 2 replicas (a tail and a bulk pool); give --replicas 2 or "
                              f"more, or choose with --policy among {', '.join(ok)}")
    order = {n: i for i, n in enumerate(policy_names())}
    return sorted(dict.fromkeys(["uniform", *chosen]), key=lambda n: order[n])


def runs_on(name: str, replicas: int) -> bool:
    """Whether policy `name` runs on `replicas` replicas (`check_policy`, the one check)."""
    try:
        check_policy(name, replicas)
    except ConfigError:
        return False
    return True


def replica_config(args: argparse.Namespace, model: CostModel | None = None) -> ReplicaConfig:
    """The replica model the policies believe: the cost model file's kv and prefill terms (`--curve model.json`),
    each replaced by its flag when given (`--kv-ms-per-1k`, `--prefill-ms-per-token`), the admission cap, and the
    file's engine keys (KV capacity, chunked prefill, prefix caching)."""
    kv = args.kv_ms_per_1k if args.kv_ms_per_1k is not None else (model.kv_ms_per_1k if model else 0.0)
    pre = (args.prefill_ms_per_token if args.prefill_ms_per_token is not None
           else (model.prefill_ms_per_token if model else 0.0))
    finite(kv, "--kv-ms-per-1k", lo=0, hi=MAX_MS)
    finite(pre, "--prefill-ms-per-token", lo=0, hi=MAX_MS)
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        raise ConfigError(f"--max-num-seqs must be a positive integer, got {args.max_num_seqs}")
    if args.max_num_seqs is not None:
        int_in(args.max_num_seqs, "--max-num-seqs", 1, MAX_STEP_REQUESTS)
    e = model.engine if model is not None else EngineTruth()
    return ReplicaConfig(max_num_seqs=args.max_num_seqs, kv_ms_per_1k_tokens=kv, prefill_ms_per_token=pre,
                         kv_tokens=e.kv_tokens, block_size=e.block_size,
                         max_num_batched_tokens=e.max_num_batched_tokens, prefix_caching=e.prefix_caching)


@dataclass(frozen=True, slots=True)
class Truth:
    """The engine a simulation runs: its curve (None: the belief's), replica model and replicas' speeds."""

    curve: TpotCurve | None
    replica: ReplicaConfig
    speed: FleetSpeed


def truth_config(args: argparse.Namespace, belief: ReplicaConfig, model: CostModel | None) -> Truth:
    """The truth: `--truth FILE` (its curve, terms and engine keys) or the belief (`--curve` and the replica flags),
    then `--kv-tokens`, `--block-size`, `--max-num-batched-tokens`, `--prefix-caching`, `--speed-spread`,
    `--speed-drift` on top. The controller never reads it."""
    path = getattr(args, "truth", None)
    if path and not Path(path).is_file():
        raise ConfigError(f"--truth {path}: no such file")
    tm = load_cost_model(Path(path)) if path else model
    if tm is not None and path:
        base = ReplicaConfig(max_num_seqs=args.max_num_seqs, kv_ms_per_1k_tokens=tm.kv_ms_per_1k,
                             prefill_ms_per_token=tm.prefill_ms_per_token, kv_tokens=tm.engine.kv_tokens,
                             block_size=tm.engine.block_size, max_num_batched_tokens=tm.engine.max_num_batched_tokens,
                             prefix_caching=tm.engine.prefix_caching)
    else:
        base = belief
    speed = tm.engine.speed if tm is not None else FleetSpeed()
    kv_tokens, block, mbt = (getattr(args, k, None) for k in ("kv_tokens", "block_size", "max_num_batched_tokens"))
    if block is not None:
        int_in(block, "--block-size", 1, MAX_BLOCK)
    if kv_tokens is not None:
        int_in(kv_tokens, "--kv-tokens", block or base.block_size, MAX_KV_TOKENS)
    if mbt is not None:
        int_in(mbt, "--max-num-batched-tokens", 1, MAX_KV_TOKENS)
    try:
        replica = replace(base, kv_tokens=base.kv_tokens if kv_tokens is None else kv_tokens,
                          block_size=base.block_size if block is None else block,
                          max_num_batched_tokens=base.max_num_batched_tokens if mbt is None else mbt,
                          prefix_caching=base.prefix_caching or bool(getattr(args, "prefix_caching", False)))
    except ConfigError as e:
        raise ConfigError(f"--truth/--kv-tokens/--block-size: {e}") from None
    spread, drift = getattr(args, "speed_spread", None), getattr(args, "speed_drift", None)
    if spread is not None:
        finite(spread, "--speed-spread", lo=0, hi=MAX_SPREAD)
    if drift is not None:
        finite(drift, "--speed-drift", lo=0, hi=MAX_DRIFT)
    if spread is not None or drift is not None:
        speed = FleetSpeed(() if spread is not None else speed.factors,
                           speed.spread if spread is None else spread, speed.drift if drift is None else drift)
    return Truth(tm.curve if (tm is not None and path) else None, replica, speed)


def truth_json(config: SimConfig) -> dict[str, object]:
    """The truth of a run for `--json` (what the simulated replicas were; the controller never read it)."""
    r = config.replica
    return {"curve": None if config.truth_curve is None else config.truth_curve.name, "kv_tokens": r.kv_tokens,
            "block_size": r.block_size, "max_num_batched_tokens": r.max_num_batched_tokens,
            "prefix_caching": r.prefix_caching, "kv_ms_per_1k": r.kv_ms_per_1k_tokens,
            "prefill_ms_per_token": r.prefill_ms_per_token, "speed_factors": list(config.speed.factors),
            "speed_spread": config.speed.spread, "speed_drift": config.speed.drift}


def add_truth_flags(p: argparse.ArgumentParser) -> None:
    """The truth's flags (`simulate`, `plan`)."""
    for name in ("--truth", "--kv-tokens", "--block-size", "--max-num-batched-tokens", "--prefix-caching",
                 "--speed-spread", "--speed-drift"):
        add(p, name)


def build_config(args: argparse.Namespace, policies: list[str], model: CostModel | None = None) -> SimConfig:
    """Validate the numeric flags (one-line errors naming the flag) and build the run configuration; `model` (the
    `--curve` file's cost model) supplies the replica's kv and prefill terms unless their flags are given."""
    for flag, value in (("--replicas", args.replicas), ("--groups", args.groups), ("--group-size", args.group_size),
                        ("--steps", args.steps)):
        if value < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {value}")
    int_in(args.replicas, "--replicas", 1, MAX_REPLICAS)
    int_in(args.steps, "--steps", 1, MAX_STEPS)
    check_step_size(args.groups, args.group_size)
    finite(args.restart_s, "--restart-s", lo=0, hi=MAX_SECONDS)
    engine_scale = finite(getattr(args, "engine_scale", 1.0), "--engine-scale", lo=0, lo_open=True, hi=100)
    belief = replica_config(args, model)
    truth = truth_config(args, belief, model)
    if (args.q is not None or args.m is not None) and "static" not in policies:
        raise ConfigError("--q/--m set the static policy; add --policy static (or all)")
    if args.seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {args.seed}")
    router = RouterConfig(groups=args.groups, group_size=args.group_size, replicas=args.replicas,
                          **router_values(args))
    return SimConfig(router=router, replica=truth.replica, controller=controller_config(args), steps=args.steps,
                     q=args.q,
                     m=args.m, shuffle=args.shuffle, seed=args.seed, spec=pool_spec(args, spec_context(args, model)),
                     restart_s=args.restart_s,
                     bias_correction=getattr(args, "bias_correction", False), peers=peer_config(args, policies),
                     engine_scale=engine_scale, truth_curve=truth.curve, speed=truth.speed, belief=belief)


def peer_config(args: argparse.Namespace, policies: list[str]) -> PeerConfig:
    """The peers' knobs (--oversample, --long-round-period); an error when no policy they set was selected."""
    over, period = getattr(args, "oversample", None), getattr(args, "long_round_period", None)
    if over is not None and not {"april-partial", "april-drop", "rollpacker"} & set(policies):
        raise ConfigError("--oversample sets april-partial, april-drop and rollpacker; add one (or --policy all)")
    if period is not None and "rollpacker" not in policies:
        raise ConfigError("--long-round-period sets rollpacker; add --policy rollpacker (or all)")
    try:
        return PeerConfig(oversample=over, long_round_period=period)
    except ConfigError as e:
        flag = "--oversample" if "oversample" in str(e) else "--long-round-period"
        raise ConfigError(f"{flag}: {e}") from None


def spec_context(args: argparse.Namespace, model: CostModel | None) -> SpecContext:
    """What a bare `mtp` / `dflash` means on this run's `--curve` (its family; a model file's own fit first)."""
    return SpecContext() if model is None else context_for(getattr(args, "curve", None), model.curve)


def pool_spec(args: argparse.Namespace, context: SpecContext | None = None) -> PoolSpec:
    """Per-pool speculation: the --config file's [spec] tables, then --tail-spec / --bulk-spec on top."""
    pools = load_config_file(Path(args.config)) if args.config else PoolSpec()
    if args.tail_spec is not None:
        pools = replace(pools, tail=parse_spec(args.tail_spec, "--tail-spec", context))
    if args.bulk_spec is not None:
        pools = replace(pools, bulk=parse_spec(args.bulk_spec, "--bulk-spec", context))
    return pools


def load_inputs(args: argparse.Namespace) -> Workload:
    """The workload under the validated --replay mode, with the trace's --length-column / --prompt-column."""
    try:
        mode = ReplayMode(args.replay)
    except ValueError:
        mode = ReplayMode.SYNTHETIC
    if mode is ReplayMode.SYNTHETIC:
        raise ConfigError(f"--replay must be recorded or resample, got {excerpt(args.replay)}")
    workload = load_workload(args.workload, mode=mode, seed=args.seed, **trace_columns(args))
    warn_few_prompts(args, len(workload.prompts), f"workload {workload.name}")
    return workload


@contextmanager
def progress_bar(total: int, enabled: bool, steps: int | None = None,
                 command: str = "simulate") -> Iterator[Callable[[str, int], None]]:
    """A rich progress bar on stderr (never stdout); yields the per-step callback `(policy, steps done)`.

    With `steps` (steps per policy) the bar names the policy's step and a line per finished policy stays above the
    bar with its wall time, so a long run (`simulate --groups 4096 --replicas 256`) shows where it is. When `enabled`
    is false (stderr not a terminal) the bar is not drawn and `tailsieve COMMAND: …` heartbeat lines
    (`cli.progress`) say the steps done instead.
    """
    con = progress_console(enabled)
    bar = Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=con, transient=True, disable=not enabled)
    task = bar.add_task("simulating", total=total)
    started: dict[str, float] = {}
    last = [time.perf_counter()]  # when the previous step ended: the start of a policy's first step

    def tick(name: str, done: int) -> None:
        now = time.perf_counter()
        start = started.setdefault(name, last[0])
        last[0] = now
        where = name if steps is None else f"{name} {done}/{steps}"
        bar.update(task, advance=1, description=where)
        beat.update(advance=1, note=where)
        if enabled and steps is not None and done == steps:
            bar.console.print(f"{name}: {steps} steps in {now - start:.1f} s", highlight=False)

    with bar, heartbeat(command, "policy steps", total, bar_shown=enabled) as beat:
        yield tick


def add_replications(p: argparse.ArgumentParser) -> None:
    """`--replications K` (simulate, plan): independent runs pooled for the verdict against verl's balancer."""
    p.add_argument("--replications", type=int, default=DEFAULT_RUNS, metavar="K",
                   help="at most K independent runs (seeds SEED, SEED+1, ...) of tailsieve and verl's balancer pooled "
                        f"for the verdict against the balancer, added while its band is above {100 * FLOOR:g}%% and "
                        f"it is within noise or its band above {100 * RESOLVE:g}%% (default {DEFAULT_RUNS}; 1: one "
                        "run; docs/simulate.md)")


def replications(args: argparse.Namespace, workload: Workload) -> int:
    """The validated --replications; 1 where a new seed would replay the same draws (recorded replay, no shuffle:
    pooling copies of one run would narrow the band falsely)."""
    k = int_in(args.replications, "--replications", 1, 1000)
    same = workload.mode is ReplayMode.RECORDED and not getattr(args, "shuffle", False)
    return 1 if same else k


def replicated_verdict(args: argparse.Namespace, policy: PolicyRun, balancer: PolicyRun, curve: TpotCurve,
                       config: SimConfig, workload: Workload, *, name: str | None = None,
                       on_step: Callable[[str, int], None] | None = None) -> Verdict:
    """`policy` against verl's balancer pooled over up to --replications runs (`analysis.replications`); run r uses
    seed + r for the prompt order and the length draws, both policies on the same ones. `name`: the policy to run
    (default: `policy.policy`)."""
    run_name = name or policy.policy

    def more(r: int) -> tuple[PolicyRun, PolicyRun]:
        seeded = replace(config, seed=config.seed + r)
        w = load_workload(args.workload, mode=workload.mode, seed=args.seed + r, **trace_columns(args))
        mine = run_policy(run_name, w, curve, seeded, on_step=on_step)
        return replace(mine, policy=policy.policy), run_policy(BALANCER, w, curve, seeded, on_step=on_step)

    return replicate(policy, balancer, more, max_runs=replications(args, workload))


def verdict_line(v: Verdict, uniform_speedup: float | None) -> str:
    """The verdict sentence; the speedup over uniform only when the verdict is the table's one run (pooled runs: the
    table's uniform column is from the first run alone)."""
    line = sentence(v, uniform_speedup if v.runs == 1 else None)
    if v.steps_needed is not None and v.runs > 1:
        per_run = max(v.paired_steps // v.runs, 1)
        line = line[:-1] + f" (--replications {-(-v.steps_needed // per_run)})."
    return line


def step_shape(replicas: int, groups: int, group_size: int, steps: int, rho: float, extra: int) -> str:
    """A table title's run shape in plain words, the paper's symbols in parentheses (docs/glossary.md)."""
    return (f"{replicas} replicas (R), {groups} groups (N) of {group_size} responses (G), {steps} steps, "
            f"{100 * rho:g}% extra groups started (ρ, E={extra})")
