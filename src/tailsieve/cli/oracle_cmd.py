"""`tailsieve oracle`: exact two-lane optimum vs best-k isolation and uniform routing (§2.1–2.2, App. A.4)."""

from __future__ import annotations

import argparse
import datetime
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn
from rich.text import Text

from tailsieve.cli._common import (
    add_trace_columns,
    nonneg_int,
    plot_path,
    positive_float,
    positive_int,
    print_json,
    print_table,
    progress_console,
    progress_enabled,
    trace_columns,
)
from tailsieve.cli._plots import legend_outside, policy_styles, pyplot, save_figure
from tailsieve.cli.progress import heartbeat
from tailsieve.errors import TailSieveError
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve
from tailsieve.model.makespan import lane_makespans
from tailsieve.model.oracle import (
    DEFAULT_MAX_STATES,
    OracleBudgetError,
    OracleProgress,
    alternate_lanes,
    topk_curve,
    two_lane_oracle,
)
from tailsieve.workloads.traces import DEFAULT_TRACE, load_trace, require_tokens

DEFAULT_CURVE = "h100-llama3-8b"
DEFAULT_MAX_SECONDS = 120.0
MAX_REPEAT = 100_000  # sampled groups (each one exact solve)
FIXED_SHARE = 0.10  # App. A.4 "fixed 10% isolation": the ⌈n/10⌉ longest requests on the tail lane


def register(sub: Any) -> None:
    """Add the `oracle` command."""
    p = sub.add_parser(
        "oracle",
        help="exact two-lane routing optimum with known lengths vs best-k isolation and uniform (App. A.4)",
        description="Route requests with known lengths on two replicas: exact optimum (Pareto DP), best top-k "
        "isolation and uniform alternation. Without --sample, all requests of the trace form one group.",
    )
    p.add_argument("--workload", metavar="TRACE",
                   help="trace file or bundled trace name (default: the bundled KodCode R1 trace)")
    add_trace_columns(p)
    p.add_argument("--curve", default=DEFAULT_CURVE, help=f"TPOT curve name or file (default {DEFAULT_CURVE})")
    p.add_argument("--sample", type=positive_int, help="requests per group, drawn without replacement")
    p.add_argument("--repeat", type=positive_int, help="number of sampled groups (default 100; needs --sample)")
    p.add_argument("--seed", type=nonneg_int, help="seed of numpy's default_rng for sampling (default 0)")
    p.add_argument("--max-seconds", type=positive_float, default=DEFAULT_MAX_SECONDS,
                   help=f"give up one exact solve after this many seconds (default {DEFAULT_MAX_SECONDS:g})")
    p.add_argument("--max-states", type=positive_int, default=DEFAULT_MAX_STATES,
                   help=f"give up one exact solve after keeping this many DP states (default {DEFAULT_MAX_STATES:,})")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", help="save a figure (.png/.pdf/.svg): gap histograms and makespan against k")
    p.set_defaults(func=run)


def solve_group(lengths: NDArray[np.int64], curve: TpotCurve, args: argparse.Namespace,
                on_step: Callable[[OracleProgress], None] | None = None) -> dict[str, Any]:
    """Uniform, best-k, fixed-10% and exact makespans of one group, in the JSON form of the command."""
    n = int(lengths.size)
    t0 = time.perf_counter()
    res = two_lane_oracle(lengths, curve, max_states=args.max_states, max_seconds=args.max_seconds, on_step=on_step)
    seconds = time.perf_counter() - t0
    uniform = float(lane_makespans(lengths, alternate_lanes(n), 2, curve).max()) if n else 0.0
    fixed = float(topk_curve(lengths, curve).makespan_s[math.ceil(FIXED_SHARE * n)])
    return {
        "requests": n,
        "uniform_s": uniform,
        "best_k": res.best_k,
        "topk_s": res.topk,
        "optimal_s": res.makespan,
        "optimal_lane": res.lane.tolist(),
        "states": res.states,
        "seconds": seconds,
        "fixed10_s": fixed,
    }


def _gap(policy: float, optimum: float) -> float:
    return (policy - optimum) / optimum if optimum > 0 else 0.0


def summarise(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """App. A.4 summary: relative gaps (T_policy − T_opt)/T_opt of best-k, fixed 10% and uniform routing."""
    out: dict[str, Any] = {"groups": len(groups)}
    for name, key in (("topk", "topk_s"), ("fixed10", "fixed10_s"), ("uniform", "uniform_s")):
        gaps = np.array([_gap(g[key], g["optimal_s"]) for g in groups])
        out[f"max_gap_{name}"] = float(gaps.max())
        out[f"median_gap_{name}"] = float(np.median(gaps))
        if name == "topk":
            out["share_within_1pct"] = float(np.mean(gaps <= 0.01))
    out["median_seconds"] = float(np.median([g["seconds"] for g in groups]))
    out["max_seconds"] = float(max(g["seconds"] for g in groups))
    out["median_states"] = float(np.median([g["states"] for g in groups]))
    return out


def _draw(rows: list[NDArray[np.int64]], lengths: NDArray[np.int64], curve: TpotCurve,
          groups: list[dict[str, Any]], path: Path, sampled: bool, quiet: bool) -> None:
    plt = pyplot()
    panels = 2 if sampled else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
    if sampled:
        ax = axes[0, 0]
        series = {name: [100 * _gap(g[key], g["optimal_s"]) for g in groups]
                  for name, key in (("best k", "topk_s"), ("fixed 10%", "fixed10_s"), ("uniform", "uniform_s"))}
        bins = np.linspace(0.0, max(1.0, *(max(v) for v in series.values())), 41)
        style = policy_styles(list(series), headline="best k")
        for name, values in series.items():
            ax.hist(values, bins=bins, histtype="step", linewidth=style[name].linewidth, color=style[name].color,
                    linestyle=style[name].linestyle, label=name)
        ax.set_xlabel("optimality gap (%)")
        ax.set_ylabel("groups")
        ax.set_title(f"{len(groups)} groups of {groups[0]['requests']} requests")
        legend_outside(ax)
    ax = axes[0, panels - 1]
    tk = topk_curve(lengths[rows[0]], curve)
    k = np.arange(tk.tail_s.size)
    ax.plot(k, tk.tail_s, label="tail lane (k longest)")
    ax.plot(k, tk.bulk_s, label="bulk lane (rest)")
    ax.plot(k, tk.makespan_s, "k--", lw=1, label="makespan (max)")
    ax.axhline(groups[0]["optimal_s"], color="tab:red", lw=1, label="exact optimum")
    ax.set_ylim(0, 1.05 * float(tk.makespan_s.max(initial=0.0)) or 1.0)
    ax.set_xlabel("isolated requests k")
    ax.set_ylabel("seconds")
    ax.set_title("top-k isolation" + (" (first group)" if sampled else ""))
    legend_outside(ax)
    fig.tight_layout()
    save_figure(fig, path, quiet=quiet)


def run(args: argparse.Namespace) -> int:
    """Solve one group (all requests) or the App. A.4 experiment (--sample/--repeat/--seed)."""
    plot = plot_path(args.plot) if args.plot else None
    if args.sample is None and (args.repeat is not None or args.seed is not None):
        raise TailSieveError("--repeat and --seed need --sample")
    trace = require_tokens(load_trace(args.workload, **trace_columns(args)))
    curve = load_curve(args.curve)
    lengths = trace.length
    n = int(lengths.size)
    if args.sample is None:
        rows = [np.arange(n)]
    else:
        if args.sample > n:
            raise TailSieveError(f"--sample {args.sample} is larger than the trace ({n} requests)")
        rng = np.random.default_rng(0 if args.seed is None else args.seed)
        repeat = 100 if args.repeat is None else args.repeat
        if repeat > MAX_REPEAT:
            raise TailSieveError(f"--repeat {repeat} is more than the {MAX_REPEAT:,} groups allowed")
        rows = [rng.choice(n, size=args.sample, replace=False) for _ in range(repeat)]
    source = args.workload or f"{DEFAULT_TRACE} (bundled)"
    groups = _solve_all(rows, lengths, curve, args)
    _report(args, groups, rows, source, curve.name)
    if plot is not None:  # after the report, so that its last line says where the figure went
        _draw(rows, lengths, curve, groups, plot, args.sample is not None, args.json)
    return 0


def _report(args: argparse.Namespace, groups: list[dict[str, Any]], rows: list[NDArray[np.int64]], source: str,
            curve: str) -> None:
    """The one group's solution, or the App. A.4 summary (JSON or tables)."""
    if args.sample is None:
        single = {k: v for k, v in groups[0].items() if k != "fixed10_s"}
        if args.json:
            print_json(single)
        else:
            _print_single(single, source, curve)
        return
    for g, r in zip(groups, rows, strict=True):
        g["rows"] = r.tolist()
    summary = summarise(groups)
    if args.json:
        print_json({"trace": source, "curve": curve, "sample": args.sample, "repeat": len(rows),
                    "seed": 0 if args.seed is None else args.seed, "groups": groups, "summary": summary})
    else:
        _print_summary(summary, source, curve, args.sample)


class _Clock(ProgressColumn):
    """Time since the bar started. Rich's `TimeElapsedColumn` stops at the first search that places every request,
    while the solve goes on with the next search."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.perf_counter()

    def render(self, task: Task) -> Text:
        """The elapsed time as h:mm:ss."""
        return Text(str(datetime.timedelta(seconds=int(time.perf_counter() - self.start))), style="progress.elapsed")


def _count(x: int) -> str:
    """A state count in a few characters: 950, 41k, 9.0M."""
    return f"{x / 1e6:.1f}M" if x >= 1e6 else f"{x / 1e3:.0f}k" if x >= 1e4 else f"{x:,}"


def _solve_all(rows: list[NDArray[np.int64]], lengths: NDArray[np.int64], curve: TpotCurve,
               args: argparse.Namespace) -> list[dict[str, Any]]:
    """Solve every group; a progress bar on stderr when it is a terminal, else heartbeat lines (groups solved, or for
    the one whole-trace group the exact search's requests placed, its states against --max-states, and the time)."""
    enabled = progress_enabled()
    bar = Progress(TextColumn("{task.description}"), BarColumn(bar_width=12), MofNCompleteColumn(),
                   TextColumn("{task.fields[unit]}"), _Clock(), console=progress_console(enabled),
                   transient=True, disable=not enabled, redirect_stdout=False, redirect_stderr=False)
    single = len(rows) == 1
    task = bar.add_task("exact oracle", total=len(rows[0]) if single else len(rows),
                        unit="requests" if single else "groups")
    budget = _count(args.max_states)

    def step(p: OracleProgress) -> None:
        where = f"search {p.search}, {_count(p.states)}/{budget} states"
        bar.update(task, completed=p.step, total=p.requests, description=f"oracle {where}")
        beat.update(p.step, total=p.requests, note=where)

    groups: list[dict[str, Any]] = []
    unit = "requests placed" if single else "groups"
    with bar, heartbeat("oracle", unit, len(rows[0]) if single else len(rows), bar_shown=enabled) as beat:
        for i, r in enumerate(rows):
            try:
                groups.append(solve_group(lengths[r], curve, args, on_step=step if single else None))
            except OracleBudgetError as exc:
                where = f"group {i + 1} of {len(rows)}: " if len(rows) > 1 else ""
                raise TailSieveError(f"{where}{exc} (--max-seconds / --max-states)") from None
            if not single:
                bar.advance(task)
                beat.update(i + 1)
    return groups


def _print_single(g: dict[str, Any], source: str, curve: str) -> None:
    lane1 = int(sum(g["optimal_lane"]))
    opt = g["optimal_s"]
    rows: list[tuple[object, ...]] = [
        ("uniform (alternate lanes)", g["uniform_s"], 100 * _gap(g["uniform_s"], opt), ""),
        (f"best top-k (k = {g['best_k']})", g["topk_s"], 100 * _gap(g["topk_s"], opt), ""),
        ("exact optimum", opt, 0.0, f"lane 1: {lane1}, lane 0: {g['requests'] - lane1} requests"),
    ]
    print(f"{g['requests']} requests of {source} on two lanes, curve {curve}")
    print_table("makespan by policy", ["policy", "makespan_s", "gap_%", "note"], rows)
    print(f"exact oracle: {g['states']:,} DP states kept, {g['seconds']:.3g} s")


def _print_summary(s: dict[str, Any], source: str, curve: str, sample: int) -> None:
    rows: list[tuple[object, ...]] = [
        (name, 100 * s[f"median_gap_{key}"], 100 * s[f"max_gap_{key}"])
        for name, key in (("best top-k", "topk"), ("fixed 10% isolation", "fixed10"), ("uniform", "uniform"))
    ]
    print(f"{s['groups']} groups of {sample} requests from {source}, curve {curve}")
    print_table("gap to the exact optimum", ["policy", "median_gap_%", "max_gap_%"], rows)
    print(f"best top-k within 1% of the optimum in {100 * s['share_within_1pct']:.0f}% of groups; exact oracle: "
          f"median {s['median_seconds']:.3g} s (max {s['max_seconds']:.3g} s), median {s['median_states']:,.0f} "
          "states per group")
