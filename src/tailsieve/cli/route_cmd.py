"""`tailsieve route`: every known-length routing policy per trace step, makespan and speedup over uniform (§4.2).

Steps: rows sharing a `step` value form one step (its first N prompts in order of appearance); a trace without a
step column is cut into consecutive steps of N prompts in order of first appearance, and a last partial step is
dropped unless it is the only one. A prompt's group is G lengths taken cyclically from its recorded samples in
file order (KodCode R1 has 3 samples per prompt, so a group of 8 is s0 s1 s2 s0 s1 s2 s0 s1).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.table import Table

from tailsieve.cli._common import (
    add_trace_columns,
    console,
    print_json,
    progress_console,
    progress_enabled,
    trace_columns,
)
from tailsieve.cli.flags import add, policy_names_given
from tailsieve.cli.progress import Heartbeat, heartbeat
from tailsieve.errors import ConfigError
from tailsieve.inputs import MAX_REPLICAS, check_step_size, int_in
from tailsieve.model.baselines import POLICIES, GroupBatch, Policy, TopQ, assign_checked, get_policy
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve
from tailsieve.workloads.traces import DEFAULT_TRACE, Trace, load_trace, require_tokens

DEFAULT_POLICIES = ("uniform", "uniform-oracle", "streamrl-oracle", "seer-oracle", "topq-best")
SEER_MAX_PER_REPLICA = 4096  # seer-oracle's pairwise improvement holds (requests per replica)² cells


@dataclass(frozen=True, slots=True)
class Step:
    """One rollout step of a trace: its label (the `step` value, or 0, 1, … for cut traces) and its groups."""

    step: int
    batch: GroupBatch


def prompt_groups(prompt_id: NDArray[np.str_], length: NDArray[np.int64], group_size: int) -> GroupBatch:
    """Groups in order of first appearance; group = `group_size` of the prompt's lengths taken cyclically."""
    uniq, first, inverse = np.unique(prompt_id, return_index=True, return_inverse=True)
    appearance = np.argsort(first, kind="stable")  # appearance position → unique index
    pos = np.empty_like(appearance)
    pos[appearance] = np.arange(appearance.size)
    key = pos[inverse.ravel()]
    rows = np.argsort(key, kind="stable")  # rows grouped by prompt, file order within a prompt
    counts = np.bincount(key, minlength=appearance.size)
    starts = np.cumsum(counts) - counts
    idx = starts[:, None] + np.arange(group_size)[None, :] % counts[:, None]
    return GroupBatch(length[rows][idx], group_ids=tuple(str(u) for u in uniq[appearance]))


def trace_steps(trace: Trace, n_groups: int, group_size: int) -> tuple[list[Step], int]:
    """The trace's steps (see the module docstring) and the number of prompts left out."""
    if trace.step is not None:
        steps, left = [], 0
        for s in np.unique(trace.step):
            rows = np.flatnonzero(trace.step == s)
            batch = prompt_groups(trace.prompt_id[rows], trace.length[rows], group_size)
            left += max(0, batch.n_groups - n_groups)
            if batch.n_groups > n_groups:
                batch = GroupBatch(batch.lengths[:n_groups], (batch.group_ids or ())[:n_groups] or None)
            steps.append(Step(int(s), batch))
        return steps, left
    whole = prompt_groups(trace.prompt_id, trace.length, group_size)
    n_full = whole.n_groups // n_groups
    if n_full == 0:
        return [Step(0, whole)], 0
    ids = whole.group_ids or ()
    steps = [
        Step(i, GroupBatch(whole.lengths[i * n_groups:(i + 1) * n_groups], ids[i * n_groups:(i + 1) * n_groups]))
        for i in range(n_full)
    ]
    return steps, whole.n_groups - n_full * n_groups


def register(sub: Any) -> None:
    """Add the `route` command."""
    p = sub.add_parser("route", help="known-length routing baselines per trace step: makespan and speedup",
                       description="Run every known-length routing policy on each step of a trace under the "
                                   "all-admit model; report makespans and speedups over uniform group routing.")
    p.add_argument("--workload", metavar="TRACE",
                   help="bundled trace name or CSV/JSONL file (default: the bundled KodCode R1 trace)")
    add_trace_columns(p)
    p.add_argument("--curve", default="h100-llama3-8b", help="TPOT curve: built-in name or file (default: %(default)s)")
    add(p, "--replicas")
    add(p, "--group-size")
    add(p, "--groups")
    p.add_argument("--policy", action="append", metavar="NAME",
                   help=f"repeatable (or comma-separated) subset of: {', '.join(POLICIES)} "
                        f"(default: {','.join(DEFAULT_POLICIES)}, plus topq when --q/--m are given)")
    p.add_argument("--q", type=int, help="topq: number of isolated groups")
    p.add_argument("--m", type=int, help="topq: number of tail replicas")
    p.add_argument("--json", action="store_true", help="machine-readable output (structure in docs/baselines.md)")
    p.set_defaults(func=run)


def parse_policies(args: argparse.Namespace) -> list[Policy]:
    """Validate the policy list and its parameters; uniform (the baseline) always comes first."""
    for flag, value in (("--replicas", args.replicas), ("--group-size", args.group_size), ("--groups", args.groups)):
        if value <= 0:
            raise ConfigError(f"{flag} must be a positive integer, got {value}")
    int_in(args.replicas, "--replicas", 1, MAX_REPLICAS)
    check_step_size(args.groups, args.group_size)
    topq_given = args.q is not None or args.m is not None
    if args.policy is None:
        names = list(DEFAULT_POLICIES) + (["topq"] if topq_given else [])
    else:
        names = policy_names_given(args.policy, "")
        if not names:
            raise ConfigError(f"--policy is empty; valid: {', '.join(POLICIES.names())}")
        for n in names:
            POLICIES.check(n)
    names = list(dict.fromkeys(["uniform", *names]))
    if topq_given and "topq" not in names:
        raise ConfigError("--q/--m apply to policy topq; add --policy topq")
    policies: list[Policy] = []
    for name in names:
        if name == "topq":
            if args.q is None or args.m is None:
                raise ConfigError("policy topq needs both --q and --m")
            policies.append(TopQ(q=args.q, m=args.m))
        else:
            policies.append(get_policy(name))
    short = [p.name for p in policies if args.replicas < p.min_replicas]
    if short and args.policy is None:  # the user named no policy: say these came with the default
        ok = [p.name for p in policies if p.name not in short]
        raise ConfigError(f"--replicas {args.replicas}: {', '.join(short)} need at least 2 replicas (a tail pool) "
                          f"and come with the default --policy; give --replicas 2 or more, or choose with --policy "
                          f"among {', '.join(ok)}")
    if short:
        raise ConfigError(f"--replicas {args.replicas}: {', '.join(short)} need at least 2 replicas (a tail pool); "
                          "choose another --policy")
    return policies


def route_steps(steps: list[Step], policies: list[Policy], replicas: int, curve: TpotCurve,
                on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Every policy on every step: the `--json` document (see docs/baselines.md); uniform is always included.
    `on_step(steps done)` is called after each step (the progress bar)."""
    if not policies or policies[0].name != "uniform":
        policies = [get_policy("uniform"), *(p for p in policies if p.name != "uniform")]
    out_steps: list[dict[str, Any]] = []
    spans: dict[str, list[float]] = {p.name: [] for p in policies}
    for st in steps:
        row: dict[str, Any] = {}
        base = 0.0
        for p in policies:
            a = assign_checked(p, st.batch, replicas, curve)
            base = a.makespan_s if p.name == "uniform" else base
            row[p.name] = {"makespan_s": a.makespan_s, "speedup": base / a.makespan_s if a.makespan_s else 1.0,
                           **dict(a.info)}
            spans[p.name].append(a.makespan_s)
        out_steps.append({"step": st.step, "groups": st.batch.n_groups, "policies": row})
        if on_step is not None:
            on_step(len(out_steps))
    mean: dict[str, Any] = {}
    uni = np.asarray(spans["uniform"])
    for name, vals in spans.items():
        v = np.asarray(vals)
        per_step = np.divide(uni, v, out=np.ones_like(v), where=v > 0)
        mean[name] = {"makespan_s": float(v.mean()), "speedup": float(uni.sum() / v.sum()) if v.sum() else 1.0,
                      "min_speedup": float(per_step.min()), "max_speedup": float(per_step.max())}
    return {"steps": out_steps, "mean": mean}


def _choice(info: dict[str, Any]) -> str:
    if "q" in info:
        return f" q={info['q']} m={info['m']}"
    if "dedicated" in info:
        return f" d={info['dedicated']}"
    return ""


def _route_with_progress(steps: list[Step], policies: list[Policy], replicas: int, curve: TpotCurve,
                         beat: Heartbeat, enabled: bool) -> dict[str, Any]:
    """`route_steps` under a progress bar of steps on stderr when it is a terminal (`enabled`), else heartbeat
    lines (`beat`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    beat.update(0, total=len(steps), note="")
    bar = Progress(TextColumn("routing"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"), TimeElapsedColumn(),
                   console=progress_console(enabled), transient=True, disable=not enabled,
                   redirect_stdout=False, redirect_stderr=False)
    task = bar.add_task("routing", total=len(steps))

    def step(done: int) -> None:
        bar.update(task, completed=done)
        beat.update(done)

    with bar:
        return route_steps(steps, policies, replicas, curve, on_step=step)


def run(args: argparse.Namespace) -> int:
    """Route each step with every policy and print a table or JSON."""
    policies = parse_policies(args)
    curve = load_curve(args.curve)
    enabled = progress_enabled()
    with heartbeat("route", "steps", bar_shown=enabled) as beat:
        beat.update(note="reading the trace")
        trace = require_tokens(load_trace(args.workload, **trace_columns(args)))
        steps, left_out = trace_steps(trace, args.groups, args.group_size)
        per_replica = max(-(-st.batch.lengths.size // args.replicas) for st in steps)
        if per_replica > SEER_MAX_PER_REPLICA and any(p.name == "seer-oracle" for p in policies):
            raise ConfigError(f"seer-oracle balances requests pairwise, quadratic in requests per replica: a step of "
                              f"{per_replica:,} requests per replica exceeds {SEER_MAX_PER_REPLICA:,}; lower --groups "
                              "or --group-size, raise --replicas, or leave seer-oracle out of --policy")
        result = _route_with_progress(steps, policies, args.replicas, curve, beat, enabled)
    doc = {"trace": trace.source, "curve": curve.name, "replicas": args.replicas, "group_size": args.group_size,
           "groups": args.groups, "prompts_left_out": left_out, **result}
    if args.json:
        print_json(doc)
        return 0
    others = [p.name for p in policies if p.name != "uniform"]
    most = max(st.batch.n_groups for st in steps)
    groups = f"{args.groups}" if most >= args.groups else f"{most} (of --groups {args.groups}: the trace has fewer)"
    title = (f"Known-length routing on {args.workload or DEFAULT_TRACE}\ncurve {curve.name}, R={args.replicas}, "
             f"{groups} groups × {args.group_size} per step — speedup over uniform group routing")
    table = Table(title=title)
    table.add_column("step", justify="left")
    table.add_column("groups", justify="right")
    table.add_column("uniform s", justify="right")
    for name in others:
        table.add_column(name, justify="right")
    for i, st in enumerate(result["steps"]):
        pol = st["policies"]
        cells = [f"{pol[n]['speedup']:.3f}×{_choice(pol[n])}" for n in others]
        table.add_row(str(st["step"]), str(st["groups"]), f"{pol['uniform']['makespan_s']:.1f}", *cells,
                      end_section=i == len(result["steps"]) - 1)
    mean = result["mean"]
    table.add_row("mean", "", f"{mean['uniform']['makespan_s']:.1f}",
                  *(f"{mean[n]['speedup']:.3f}×" for n in others))
    con = console()
    con.print(table)
    note = (f"mean row: mean uniform makespan; speedup = total uniform time / total policy time over {len(steps)} "
            f"step(s). q/m: isolated groups / tail replicas; d: dedicated replicas.")
    if left_out:
        note += f" {left_out} prompt(s) beyond full steps of {args.groups} left out."
    con.print(note)
    return 0
