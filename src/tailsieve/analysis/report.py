"""The one run report of `tailsieve simulate` and `tailsieve rollout`: per-policy summaries (`summarize`, from
`tailsieve.analysis.metrics`), the JSON document (`report_json`; one policy `policy_json`, one step `record_json`)
and the comparison table (`summary_table`). Both commands use these, so their keys and columns are the same;
each adds its own extras (rollout's `restart_s`) through `extra` / `extra_columns`. Printing is the CLI's.

Per-policy keys: mean_step_s, speedup, verdict {within_noise, left_uniform, speedup_2sigma, paired_steps, note},
final_q, final_m, wasted_share, redraws {max, mean}, bias {mean_ratio, ks, truncated_ratio, truncated_share,
reference_truncated_share, truncated_reason; with bias correction also weighted_mean_ratio, ess_ratio}, fidelity
{off_policy_token_share, dropped_prompt_share, delayed_prompt_share, batch_length_cv}, oracle,
step_s_std, step_s_min, step_s_max, steps [...]. Top-level `vs_balancer` (when verl-lif ran): each two-pool policy
against verl's request balancer {policy, balancer, standing, pays, speedup, speedup_2sigma, paired_steps,
tail_steps, note} (`analysis.balancer`). `speedup`,
`verdict` and `bias` are null without a uniform run; `verdict` also for uniform and the oracles (docs/simulate.md,
docs/engines.md). A speedup is never shown without its bias: the table has length ratio and KS beside it, a ±2σ
column (`~`: within noise, or never left the uniform boundary) and one fidelity line per policy (`fidelity_notes`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

from rich import box
from rich.table import Table

from tailsieve.analysis.balancer import balancer_json, balancer_verdicts
from tailsieve.analysis.fidelity import BatchFidelity, Truncation, Verdict
from tailsieve.analysis.metrics import LengthBias, PolicySummary, summarize
from tailsieve.analysis.weights import Weighting
from tailsieve.loop import SKIP_STEPS, PolicyRun, StepRecord

__all__ = ["COLUMNS", "PolicySummary", "band", "batch_columns", "fidelity_notes", "policy_json", "record_json",
           "report_json", "summarize", "summary_table"]

COLUMNS = ("policy", "mean step s", "speedup", "±2σ", "final q", "final m", "wasted tokens", "length ratio", "KS")
MISSING = "-"  # table cell of a value that needs uniform when uniform did not run


def record_json(r: StepRecord) -> dict[str, Any]:
    """One step record as JSON (the `steps` entries of `simulate --json` and report.json): the controller's
    decision after the step as `Decision.to_json` (null for a peer or a baseline), and its `note`."""
    return {"step": r.step, "makespan_s": r.makespan_s, "tail_s": r.tail_s, "bulk_s": r.bulk_s, "q": r.q, "m": r.m,
            "candidates": r.candidates, "wasted_tokens": r.wasted_tokens, "batch_mean_length": r.batch_mean_length,
            "warmup": r.warmup, "note": r.note, "redraws_max": r.redraws_max,
            "preemptions": r.preemptions, "recomputed_tokens": r.recomputed_tokens,
            "prefix_hit_tokens": r.prefix_hit_tokens,
            "decision": None if r.decision is None else r.decision.to_json()}


def _bias_json(b: LengthBias | None, t: Truncation | None, w: Weighting | None = None) -> dict[str, Any] | None:
    if b is None:
        return None
    trunc = t or Truncation(None, None, None, "unknown")
    out = {"mean_ratio": None if math.isnan(b.mean_ratio) else b.mean_ratio, "ks": b.ks,
           "truncated_ratio": trunc.ratio, "truncated_share": trunc.share,
           "reference_truncated_share": trunc.reference_share, "truncated_reason": trunc.reason or None}
    if w is not None:
        out |= {"weighted_mean_ratio": None if math.isnan(w.weighted_mean_ratio) else w.weighted_mean_ratio,
                "ess_ratio": w.ess_ratio}
    return out


def _batch_json(b: BatchFidelity | None) -> dict[str, float] | None:
    if b is None:
        return None
    return {"off_policy_token_share": b.off_policy_token_share, "dropped_prompt_share": b.dropped_prompt_share,
            "delayed_prompt_share": b.delayed_prompt_share, "batch_length_cv": b.batch_length_cv}


def batch_columns(summaries: Mapping[str, PolicySummary]) -> dict[str, dict[str, str]]:
    """The batch-fidelity columns of every policy (`summary_table(extra_columns=)`): off-policy tokens, dropped and
    delayed (> 1 step) prompts, and the CV of the per-step mean length."""
    cols: dict[str, dict[str, str]] = {"off-policy": {}, "dropped": {}, "delayed": {}, "batch CV": {}}
    for name, s in summaries.items():
        if s.batch is None:
            continue
        cols["off-policy"][name] = f"{100 * s.batch.off_policy_token_share:.1f}%"
        cols["dropped"][name] = f"{100 * s.batch.dropped_prompt_share:.1f}%"
        cols["delayed"][name] = f"{100 * s.batch.delayed_prompt_share:.1f}%"
        cols["batch CV"][name] = f"{s.batch.batch_length_cv:.3f}"
    return cols


def _verdict_json(v: Verdict | None) -> dict[str, Any] | None:
    if v is None:
        return None
    return {"within_noise": v.within_noise, "left_uniform": v.left_uniform, "speedup_2sigma": v.speedup_2sigma,
            "paired_steps": v.paired_steps, "note": v.note}


def policy_json(run: PolicyRun, s: PolicySummary, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One policy's entry of "policies": its summary, step spread, step records, then `extra` keys."""
    return {
        "mean_step_s": s.mean_step_s, "speedup": s.speedup, "verdict": _verdict_json(s.verdict),
        "final_q": s.final_q, "final_m": s.final_m, "wasted_share": s.wasted_share,
        "redraws": {"max": s.redraws.max, "mean": s.redraws.mean},
        "bias": _bias_json(s.bias, s.truncation, s.weighting),
        "fidelity": _batch_json(s.batch),
        "oracle": s.oracle,
        "step_s_std": s.step_s_std, "step_s_min": s.step_s_min, "step_s_max": s.step_s_max,
        "steps": [record_json(r) for r in run.steps],
    } | dict(extra or {})


def report_json(runs: Mapping[str, PolicyRun], meta: Mapping[str, Any], *, skip: int = SKIP_STEPS,
                oracles: Collection[str] = (), extra: Mapping[str, Mapping[str, Any]] | None = None,
                verdicts: Mapping[str, Verdict] | None = None) -> dict[str, Any]:
    """`meta` + "window_skip" (kept where `meta` has it) + "policies": `policy_json` of every run with steps, +
    "vs_balancer" when verl's balancer ran: each two-pool policy against it (`analysis.balancer.balancer_json`;
    `verdicts` when given, e.g. pooled over replications, else from `runs`)."""
    summaries = summarize(runs, skip=skip, oracles=oracles)
    policies = {name: policy_json(runs[name], s, (extra or {}).get(name)) for name, s in summaries.items()}
    judged = balancer_verdicts(runs, skip=skip, oracles=oracles) if verdicts is None else verdicts
    vs = {name: balancer_json(v) for name, v in judged.items()}
    return dict(meta) | {"window_skip": skip, "policies": policies} | ({"vs_balancer": vs} if vs else {})


def band(v: Verdict | None) -> str:
    """The ±2σ cell: the speedup's noise band, with `~` when within noise or never off the uniform boundary."""
    if v is None:
        return MISSING
    pm = "±?" if v.speedup_2sigma is None else f"±{100 * v.speedup_2sigma:.1f}%"
    return f"{pm} ~" if v.within_noise or not v.left_uniform else pm


def _cells(s: PolicySummary) -> tuple[str, ...]:
    speedup = MISSING if s.speedup is None else f"{s.speedup:.3f}×"
    ratio, ks = (MISSING, MISSING) if s.bias is None else (f"{s.bias.mean_ratio:.3f}", f"{s.bias.ks:.3f}")
    return (f"{s.policy}{'*' if s.oracle else ''}", f"{s.mean_step_s:.2f}", speedup, band(s.verdict),
            str(s.final_q), str(s.final_m), f"{100 * s.wasted_share:.1f}%", ratio, ks)


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.2f}%"


def fidelity_note(s: PolicySummary) -> str:
    """One policy's fidelity line: verdict, truncation against uniform, redraws."""
    parts = [] if s.verdict is None else [s.verdict.note]
    t = s.truncation
    if t is not None and t.ratio is not None:
        parts.append(f"truncated {_pct(t.share)} vs uniform {_pct(t.reference_share)} (×{t.ratio:.2f})")
    elif t is not None and t.share is not None and t.reference_share is not None:
        parts.append(f"truncated {_pct(t.share)} vs uniform {_pct(t.reference_share)} (no ratio)")
    elif t is not None:
        parts.append(f"truncation: {t.reason}")
    parts.append(f"redraws max {s.redraws.max}, mean {s.redraws.mean:.2f}")
    if s.weighting is not None:
        parts.append(f"bias-corrected length ratio {s.weighting.weighted_mean_ratio:.3f} "
                     f"(ESS {100 * s.weighting.ess_ratio:.0f}% of n)")
    return f"{s.policy}: " + "; ".join(parts)


def fidelity_notes(summaries: Mapping[str, PolicySummary]) -> list[str]:
    """The fidelity line of every policy but uniform and the oracles (printed under the table)."""
    return [fidelity_note(s) for name, s in summaries.items() if name != "uniform" and not s.oracle]


def _two_lines(header: str) -> str:
    """A header of several words on two lines, split where the two come out most even ("mean step s" → "mean" over
    "step s"); a one-word header stays as it is."""
    words = header.split()
    if len(words) < 2:
        return header
    k = min(range(1, len(words)), key=lambda i: abs(len(" ".join(words[:i])) - len(" ".join(words[i:]))))
    return " ".join(words[:k]) + "\n" + " ".join(words[k:])


def summary_table(summaries: Mapping[str, PolicySummary], *, title: str,
                  extra_columns: Mapping[str, Mapping[str, str]] | None = None) -> Table:
    """The comparison table (`COLUMNS`, oracles starred, "-" where uniform is missing, ±2σ of the speedup with `~`
    when within noise or never off the uniform boundary); `extra_columns` maps a header to each policy's cell and is
    appended on the right."""
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True)
    extra = extra_columns or {}
    for i, col in enumerate((*COLUMNS, *extra)):  # two-line headers: 13 columns fit 120 characters
        table.add_column(_two_lines(col), justify="left" if i == 0 else "right", no_wrap=True)
    for name, s in summaries.items():
        table.add_row(*_cells(s), *(cells.get(name, MISSING) for cells in extra.values()))
    return table
