"""`tailsieve analyze`: App. B analyses of a trace or a workload, as one immutable report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.analysis.length_stats import (
    LengthStats,
    VarianceShares,
    between_within_shares,
    length_stats,
    tail_auc_matrix,
    variance_decomposition,
)
from tailsieve.errors import ConfigError
from tailsieve.workloads import Workload
from tailsieve.workloads.synthetic import SyntheticModel
from tailsieve.workloads.traces import Trace

DESIGN_PROMPTS, DESIGN_CHECKPOINTS, DESIGN_SAMPLES = 64, 8, 8  # App. B: I = 64, S checkpoints, R = 8
STATS_PROMPTS = 2048  # synthetic `stats` sample: this many prompts × R samples, prompt i at step i·spacing


@dataclass(frozen=True, slots=True, eq=False)
class Analysis:
    """Length statistics, tail-ranking AUC and variance shares of one trace or workload (App. B)."""

    name: str
    kind: str  # "trace" or "synthetic"
    design: str  # what sample the prompt-level analyses used
    stats: LengthStats
    checkpoints: tuple[int, ...]
    auc: NDArray[np.float64]  # S × S, indexed like `checkpoints` (0 × 0 without a step column)
    shares: VarianceShares | None
    between_within: tuple[float, float] | None = None
    split_half_auc: float | None = None
    notes: tuple[str, ...] = ()
    auc_reason: str | None = None  # why the cross-checkpoint AUC is null (a step column without repeated prompts)

    def to_json(self) -> dict[str, Any]:
        """The JSON document of `tailsieve analyze --json`."""
        auc = [[None if np.isnan(v) else float(v) for v in row] for row in self.auc]
        return {
            "name": self.name, "kind": self.kind, "design": self.design, "stats": self.stats.to_json(),
            "checkpoints": list(self.checkpoints), "auc": None if self.auc_reason else auc,
            "auc_reason": self.auc_reason,
            "variance_shares": None if self.shares is None else self.shares.to_json(),
            "between_within": None if self.between_within is None else
            {"between": self.between_within[0], "within": self.between_within[1]},
            "split_half_auc": self.split_half_auc, "notes": list(self.notes),
        }


def balanced_grid(
    prompt_id: NDArray[np.str_], step: NDArray[np.int64], length: NDArray[np.int64]
) -> tuple[NDArray[np.int64], tuple[str, ...], tuple[int, ...], bool]:
    """The largest balanced I×S×R subset (max I·R; prompts present at every step; first R samples of each cell)."""
    uniq_p, pinv = np.unique(prompt_id, return_inverse=True)
    uniq_s, sinv = np.unique(step, return_inverse=True)
    counts = np.zeros((uniq_p.size, uniq_s.size), dtype=np.int64)
    np.add.at(counts, (pinv, sinv), 1)
    per_prompt = counts.min(axis=1)
    r_values = np.arange(1, int(per_prompt.max()) + 1)
    kept_n = (per_prompt[None, :] >= r_values[:, None]).sum(axis=1)
    r = int(r_values[np.argmax(kept_n * r_values)])  # ties: the smaller R (more prompts)
    keep = per_prompt >= r
    order = np.lexsort((np.arange(length.size), sinv, pinv))  # by prompt, step, file order
    cell = pinv[order] * uniq_s.size + sinv[order]
    starts = np.r_[0, np.flatnonzero(np.diff(cell)) + 1]
    rank = np.arange(cell.size) - np.repeat(starts, np.diff(np.r_[starts, cell.size]))
    sel = order[(rank < r) & keep[pinv[order]]]
    grid = length[sel].reshape(int(keep.sum()), uniq_s.size, r)
    balanced = bool(keep.all() and (counts[keep] == r).all())
    return grid, tuple(str(p) for p in uniq_p[keep]), tuple(int(s) for s in uniq_s), balanced


def cross_checkpoint_reason(prompt_id: NDArray[np.str_], step: NDArray[np.int64]) -> str | None:
    """Why the cross-checkpoint analyses cannot run on this step column (None when some prompt is at every step)."""
    uniq_p, pinv = np.unique(prompt_id, return_inverse=True)
    uniq_s, sinv = np.unique(step, return_inverse=True)
    if uniq_s.size < 2:
        return None
    present = np.zeros((uniq_p.size, uniq_s.size), dtype=bool)
    present[pinv, sinv] = True
    per_prompt = present.sum(axis=1)
    if per_prompt.max() == uniq_s.size:
        return None
    if per_prompt.max() == 1:
        return (f"single-epoch trace: no prompt id repeats across its {uniq_s.size} steps, and the cross-checkpoint "
                "tail AUC ranks the same prompts at two or more checkpoints")
    return (f"no prompt appears at all {uniq_s.size} steps: the cross-checkpoint tail AUC needs the same prompts at "
            "every checkpoint")


def _split_half(grid: NDArray[np.int64]) -> float | None:
    """AUC when the tail set comes from the first half of each prompt's samples and the ranking from the second."""
    h = grid.shape[2] // 2
    if h < 1 or grid.shape[0] < 3:
        return None
    pair = np.stack([grid[:, 0, :h], grid[:, 0, h : 2 * h]], axis=1)
    return float(tail_auc_matrix(pair)[0, 1])


def analyze_trace(trace: Trace, *, name: str | None = None, max_length: int | None = None) -> Analysis:
    """App. B analyses of a recorded trace (balanced subset when unbalanced, said in `notes`)."""
    notes: list[str] = []
    n_prompts = trace.n_prompts
    stats = length_stats(trace.length, n_prompts=n_prompts, truncated=trace.truncated, max_length=max_length)
    if trace.truncated is None and max_length is not None:
        notes.append(f"truncated share estimated as length >= {max_length} (no 'truncated' column)")
    elif trace.truncated is None:
        notes.append("truncated share unknown: no 'truncated' column and no known length cap")
    label = name or trace.source
    if not trace.has_prompt_groups:
        notes.append("no prompt column: every row is its own prompt, so prompt-level analyses are undefined")
        return Analysis(label, "trace", f"{len(trace)} rows, one per prompt", stats, (), np.zeros((0, 0)), None,
                        notes=tuple(notes))
    reason = None if trace.step is None else cross_checkpoint_reason(trace.prompt_id, trace.step)
    if reason is not None:
        notes.append(f"{reason}; statistics and variance shares treat the trace as one checkpoint")
    by_step = trace.step is not None and reason is None
    steps = trace.step if trace.step is not None and by_step else np.zeros(len(trace), dtype=np.int64)
    grid, _kept, ckpts, balanced = balanced_grid(trace.prompt_id, steps, trace.length)
    i_n, s_n, r_n = grid.shape
    design = f"{i_n} prompts × {s_n} checkpoint{'s' if s_n > 1 else ''} × {r_n} samples"
    if not balanced:
        dropped = n_prompts - i_n
        notes.append(f"unbalanced trace: analyses use the balanced subset of {design} (first {r_n} samples of each "
                     f"prompt and checkpoint; {dropped} prompt{'s' if dropped != 1 else ''} with fewer dropped)")
    shares = variance_decomposition(grid) if r_n > 1 or s_n > 1 else None
    if shares is None:
        notes.append("one sample per prompt: the variance decomposition needs repeated samples")
    between_within = None
    split = None
    if not by_step or s_n == 1:
        _, inv = np.unique(trace.prompt_id, return_inverse=True)
        order = np.argsort(inv, kind="stable")
        groups = np.split(trace.length[order], np.flatnonzero(np.diff(inv[order])) + 1)
        if r_n > 1:
            between_within = between_within_shares(groups)
            split = _split_half(grid)
            notes.append("single checkpoint: checkpoint and interaction shares are 0 by construction; "
                         "split_half_auc ranks the second half of each prompt's samples by the first half's tail set")
    checkpoints: tuple[int, ...] = ckpts if by_step else ()
    auc = tail_auc_matrix(grid) if checkpoints and i_n > 1 else np.zeros((0, 0))
    return Analysis(label, "trace", design, stats, checkpoints, auc, shares, between_within, split, tuple(notes),
                    reason)


def analyze_workload(
    workload: Workload, *, n_prompts: int = DESIGN_PROMPTS, n_checkpoints: int = DESIGN_CHECKPOINTS,
    n_samples: int = DESIGN_SAMPLES,
) -> Analysis:
    """App. B analyses of a workload: its trace, or for the generator an I×S×R sample it generates."""
    if workload.trace is not None:
        return analyze_trace(workload.trace, name=workload.name, max_length=workload.max_length)
    for what, v in (("prompts", n_prompts), ("checkpoints", n_checkpoints), ("samples", n_samples)):
        if v < 1:
            raise ConfigError(f"analysis design needs >= 1 {what}, got {v}")
    if n_prompts > len(workload.prompts) or n_prompts < 2:
        raise ConfigError(f"analysis design needs 2..{len(workload.prompts)} prompts, got {n_prompts}")
    spacing = workload.source.checkpoint_spacing if isinstance(workload.source, SyntheticModel) else 1
    prompts = workload.prompts[:n_prompts]
    grid = np.stack([np.stack([workload.lengths(p, s, s * spacing, n_samples) for s in range(n_checkpoints)])
                     for p in prompts])
    m = min(STATS_PROMPTS, len(workload.prompts))
    marginal = np.stack([workload.lengths(p, 0, i * spacing, DESIGN_SAMPLES)
                         for i, p in enumerate(workload.prompts[:m])])
    stats = length_stats(marginal, n_prompts=m, max_length=workload.max_length)
    checkpoints = tuple(s * spacing for s in range(n_checkpoints))
    design = (f"generated sample, seed {workload.seed}: I={n_prompts} prompts × S={n_checkpoints} checkpoints "
              f"(steps {checkpoints[0]}, {spacing}, …, {checkpoints[-1]}) × R={n_samples} samples; stats from "
              f"{m} prompts × {DESIGN_SAMPLES} samples (prompt i at step {spacing}·i)")
    stats_design = length_stats(grid, n_prompts=n_prompts, max_length=workload.max_length)
    notes = (f"design-sample stats: P50 {stats_design.p50:.0f}, P90 {stats_design.p90:.0f}, "
             f"max completed {stats_design.max_completed}, truncated {stats_design.truncated_share:.2%}",
             f"truncated = length >= cap {workload.max_length}")
    auc = tail_auc_matrix(grid) if n_prompts > 1 else np.zeros((0, 0))
    shares = variance_decomposition(grid)
    return Analysis(workload.name, "synthetic", design, stats, checkpoints, auc, shares, notes=notes)
