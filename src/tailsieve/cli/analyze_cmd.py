"""`tailsieve analyze`: App. B length statistics, tail-ranking AUC and variance shares of a trace or workload."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from tailsieve.analysis.length_report import (
    DESIGN_CHECKPOINTS,
    DESIGN_PROMPTS,
    DESIGN_SAMPLES,
    Analysis,
    analyze_workload,
)
from tailsieve.cli._common import (
    add_trace_columns,
    nonneg_int,
    plot_path,
    positive_int,
    print_json,
    print_table,
    trace_columns,
)
from tailsieve.cli._plots import pyplot, save_figure
from tailsieve.cli.progress import heartbeat
from tailsieve.workloads import load_workload


def register(sub: Any) -> None:
    """Add the `analyze` command."""
    p = sub.add_parser("analyze", help="App. B analyses of a trace or workload: stats, tail AUC, variance shares")
    p.add_argument("workload", nargs="?", default=None,
                   help="bundled workload name or trace file (CSV, JSONL, Parquet); default kodcode-r1")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="OUT", help="save the AUC heatmap and share bars (.png/.pdf/.svg)")
    add_trace_columns(p)
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of a synthetic workload (default 0)")
    p.add_argument("--prompts", type=positive_int, default=DESIGN_PROMPTS, help="synthetic design: prompts I")
    p.add_argument("--checkpoints", type=positive_int, default=DESIGN_CHECKPOINTS,
                   help="synthetic design: checkpoints S")
    p.add_argument("--samples", type=positive_int, default=DESIGN_SAMPLES, help="synthetic design: samples R")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Analyse one trace or workload."""
    plot = None if args.plot is None else plot_path(args.plot)  # checked before any work
    with heartbeat("analyze", "phases", 2) as beat:  # no bar: heartbeat lines on a terminal too
        beat.update(0, note="reading the workload")
        w = load_workload(args.workload, seed=args.seed, **trace_columns(args))
        beat.update(1, note="length statistics, tail AUC, variance shares")
        a = analyze_workload(w, n_prompts=args.prompts, n_checkpoints=args.checkpoints, n_samples=args.samples)
    if args.json:
        print_json(a.to_json())
    else:
        show(a)
    if plot is not None:
        save_plot(a, plot, quiet=args.json)
    return 0


def _fmt_share(v: float | None) -> str:
    return "-" if v is None else f"{v:.2%}"


def show(a: Analysis) -> None:
    """Human-readable tables."""
    s = a.stats
    rows: list[tuple[object, ...]] = [
        ("P50", s.p50), ("P90", s.p90), ("P99", s.p99), ("max", s.max),
        ("max completed", "-" if s.max_completed is None else s.max_completed), ("P90/P50", s.p90_p50),
        ("truncated", _fmt_share(s.truncated_share)), ("samples/prompt", s.samples_per_prompt), ("responses", s.n),
    ]
    print_table(f"{a.name} ({a.kind}): length statistics", ["statistic", "value"], rows)
    print(f"design: {a.design}")
    if a.shares is not None:
        sh = a.shares
        share_rows: list[tuple[object, ...]] = [
            ("prompt", _fmt_share(sh.prompt)), ("checkpoint", _fmt_share(sh.checkpoint)),
            ("interaction", _fmt_share(sh.interaction)), ("sampling", _fmt_share(sh.sampling)),
        ]
        if a.between_within is not None:
            share_rows += [("between prompts", _fmt_share(a.between_within[0])),
                           ("within prompts", _fmt_share(a.between_within[1]))]
        print_table("variance shares (App. B, raw lengths)", ["factor", "share"], share_rows)
    if a.auc.shape[0] > 1:
        auc = a.auc
        adjacent = np.diag(auc, 1)
        auc_rows: list[tuple[object, ...]] = [
            ("adjacent checkpoints (min..max)", f"{np.nanmin(adjacent):.3f}..{np.nanmax(adjacent):.3f}"),
            ("first ranks later (min..max)", f"{np.nanmin(auc[0, 1:]):.3f}..{np.nanmax(auc[0, 1:]):.3f}"),
            ("all off-diagonal (mean)", f"{np.nanmean(auc[~np.eye(auc.shape[0], dtype=bool)]):.3f}"),
        ]
        print_table(f"tail-ranking AUC over checkpoints {list(a.checkpoints)}", ["pairs", "AUC"], auc_rows)
    if a.auc_reason is not None:
        print(f"tail-ranking AUC over checkpoints: n/a ({a.auc_reason})")
    if a.split_half_auc is not None:
        print(f"split-half tail AUC: {a.split_half_auc:.3f}")
    for note in a.notes:
        print(f"note: {note}")


def save_plot(a: Analysis, path: Any, *, quiet: bool = False) -> None:
    """AUC heatmap and variance-share bars."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    if a.auc.shape[0] > 0:
        im = ax1.imshow(a.auc, vmin=0.5, vmax=1.0, cmap="viridis")
        labels = [str(c) for c in a.checkpoints]
        ax1.set_xticks(range(len(labels)), labels, rotation=90 if len(labels) > 10 else 0)
        ax1.set_yticks(range(len(labels)), labels)
        ax1.set_xlabel("target checkpoint t")
        ax1.set_ylabel("source checkpoint s")
        fig.colorbar(im, ax=ax1, label="tail-ranking AUC")
    else:
        msg = "no checkpoints (no step column)" if a.auc_reason is None else "no repeated prompts across steps"
        if a.split_half_auc is not None:
            msg += f"\nsplit-half AUC {a.split_half_auc:.3f}"
        ax1.text(0.5, 0.5, msg, ha="center", va="center")
        ax1.set_axis_off()
    ax1.set_title("tail-ranking AUC")
    if a.shares is not None:
        names = ["prompt", "checkpoint", "interaction", "sampling"]
        vals = [100 * getattr(a.shares, n) for n in names]
        ax2.bar(names, vals, color=["C0", "C1", "C2", "C3"])
        for i, v in enumerate(vals):
            ax2.text(i, v + 1, f"{v:.1f}%", ha="center")
        ax2.set_ylim(0, 105)
        ax2.set_ylabel("share of SS_total (%)")
    else:
        ax2.text(0.5, 0.5, "no prompt groups", ha="center", va="center")
        ax2.set_axis_off()
    ax2.set_title("variance decomposition")
    fig.suptitle(a.name)
    fig.tight_layout()
    save_figure(fig, path, quiet=quiet)
