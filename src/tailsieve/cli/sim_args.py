"""Argument handling shared by `tailsieve simulate` and its `--spec` table (`simulate_cmd`, `simulate_spec` both
import it; it imports neither): policy names, the validated run configuration, per-pool speculation, the workload
and the stderr progress bar."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tailsieve.cli._common import progress_console, trace_columns, warn_few_prompts
from tailsieve.cli.flags import controller_config, policy_names_given
from tailsieve.cli.progress import heartbeat
from tailsieve.errors import ConfigError
from tailsieve.inputs import MAX_REPLICAS, MAX_STEP_REQUESTS, check_step_size, excerpt, finite, int_in
from tailsieve.model.costmodel import CostModel
from tailsieve.model.spec_fit import context_for
from tailsieve.model.spec_parse import SpecContext, load_config_file, parse_spec
from tailsieve.model.speculative import PoolSpec
from tailsieve.policy.peers import PeerConfig
from tailsieve.policy.router import RouterConfig, dispatch_of
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.simulation.runs import SimConfig, check_policy, policy_names
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
    """The replica model: the cost model file's kv and prefill terms (`--curve model.json`), each replaced by its flag
    when given (`--kv-ms-per-1k`, `--prefill-ms-per-token`), and the admission cap."""
    kv = args.kv_ms_per_1k if args.kv_ms_per_1k is not None else (model.kv_ms_per_1k if model else 0.0)
    pre = (args.prefill_ms_per_token if args.prefill_ms_per_token is not None
           else (model.prefill_ms_per_token if model else 0.0))
    finite(kv, "--kv-ms-per-1k", lo=0, hi=MAX_MS)
    finite(pre, "--prefill-ms-per-token", lo=0, hi=MAX_MS)
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        raise ConfigError(f"--max-num-seqs must be a positive integer, got {args.max_num_seqs}")
    if args.max_num_seqs is not None:
        int_in(args.max_num_seqs, "--max-num-seqs", 1, MAX_STEP_REQUESTS)
    return ReplicaConfig(max_num_seqs=args.max_num_seqs, kv_ms_per_1k_tokens=kv, prefill_ms_per_token=pre)


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
    replica = replica_config(args, model)
    if (args.q is not None or args.m is not None) and "static" not in policies:
        raise ConfigError("--q/--m set the static policy; add --policy static (or all)")
    if args.seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {args.seed}")
    dispatch = dispatch_of(args.dispatch)
    router = RouterConfig(groups=args.groups, group_size=args.group_size, replicas=args.replicas, rho=args.rho,
                          dispatch=dispatch, ranking=args.ranking, max_redraws=args.max_redraws)
    return SimConfig(router=router, replica=replica, controller=controller_config(args), steps=args.steps, q=args.q,
                     m=args.m, shuffle=args.shuffle, seed=args.seed, spec=pool_spec(args, spec_context(args, model)),
                     restart_s=args.restart_s,
                     bias_correction=getattr(args, "bias_correction", False), peers=peer_config(args, policies),
                     engine_scale=engine_scale)


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
