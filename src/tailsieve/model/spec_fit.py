"""The speculative model's concurrency terms fitted to a profile of a live speculative server (docs/speculative.md).

Input: per concurrency b, the measured per-token time τ_spec(b), the first position's acceptance α_b (given a draft)
and the measured tokens per request-iteration ā_b, against the same model's plain curve τ(b). Fitted:

- `acceptance_slope` s and the base acceptance α: least squares of α_b on log2 b (α(b) = α + s·log2 b);
- `token_cost` u0 and `token_cost_slope` u1: the iteration time y_b = τ_spec(b)·ā_b minus the model's iteration
  without concurrency terms (`speculative.iteration_s` at u0 = u1 = 0) is p·d·(u0 + u1·log2 b)·τ(b) (× (1 + c) for a
  parallel drafter): weighted least squares on the relative error, u0, u1 >= 0.

Held fixed (the caller's `SpecConfig`): depth d, decay γ, draft share p, draft cost c and verification share v. For an
autoregressive drafter at p = 1 (MTP, EAGLE-3) c·d·τ(b) and p·d·u0·τ(b) are the same term, so only c + p·u0 is
identified; fixing c (the method's default, an assumption) and fitting u0 changes no predicted time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError
from tailsieve.inputs import excerpt, load_document
from tailsieve.model.curves import TpotCurve
from tailsieve.model.spec_keys import SPEC_KEYS, SpecContext, spec_from_mapping
from tailsieve.model.spec_records import family_of
from tailsieve.model.speculative import Drafter, SpecConfig, iteration_s

TERM_MAX = 100.0  # SpecConfig's bound on u0 and u1


@dataclass(frozen=True, slots=True)
class SpecPoint:
    """One concurrency's measurement on the speculative server."""

    batch: int  # b, concurrent requests
    tpot_ms: float  # measured τ_spec(b), ms per token per request
    acceptance: float  # α_b: P(first draft position accepted | the iteration drafted), in [0, 1]
    expected_tokens: float  # ā_b: tokens per request-iteration (all iterations), in [1, d + 1]


@dataclass(frozen=True, slots=True)
class ConcurrencyFit:
    """The fitted `SpecConfig` and how well it reproduces the points."""

    spec: SpecConfig
    rms_rel_error: float  # rms of (model − measured)/measured iteration time
    acceptance_rms: float  # rms of the acceptance residuals α(b) − α_b
    points: int

    def to_json(self) -> dict[str, Any]:
        """Every `SpecConfig` key (rounded) plus the fit's errors and a ready `--tail-spec` text."""
        s = self.spec
        return {"method": s.method.value, "tokens": s.depth, "acceptance": round(s.alpha, 6),
                "decay": round(s.gamma, 6), "draft_share": round(s.share, 6), "draft_cost": round(s.cost, 6),
                "verify_cost": round(s.verify, 6), "token_cost": round(s.token_cost, 6),
                "token_cost_slope": round(s.token_cost_slope, 6), "acceptance_slope": round(s.acceptance_slope, 6),
                "rms_rel_error": round(self.rms_rel_error, 6), "acceptance_rms": round(self.acceptance_rms, 6),
                "points": self.points, "tail_spec": tail_spec_text(s)}


def tail_spec_text(s: SpecConfig) -> str:
    """`METHOD:TOKENS,key=value…` that `parse_spec` reads back as the configuration `to_json` writes (6 decimals)."""
    keys = {"acceptance": s.alpha, "decay": s.gamma, "draft_share": s.share, "draft_cost": s.cost,
            "verify_cost": s.verify, "token_cost": s.token_cost, "token_cost_slope": s.token_cost_slope,
            "acceptance_slope": s.acceptance_slope}
    return f"{s.method.value}:{s.depth}," + ",".join(f"{k}={round(v, 6)!r}" for k, v in keys.items())


def _check(points: Sequence[SpecPoint], base: SpecConfig) -> None:
    """One-line refusal of input the fit cannot use."""
    if not base.enabled:
        raise ConfigError(f"concurrency fit needs a speculative method and depth >= 1, got {base.label}")
    for p in points:
        nums = (p.tpot_ms, p.acceptance, p.expected_tokens)
        if not all(isinstance(x, int | float) and math.isfinite(x) for x in nums):
            raise ConfigError(f"concurrency fit: non-finite measurement at b={p.batch}: {p}")
        if isinstance(p.batch, bool) or not isinstance(p.batch, int) or p.batch < 1 or p.tpot_ms <= 0:
            raise ConfigError(f"concurrency fit: need b >= 1 and tpot_ms > 0, got b={p.batch}, tpot_ms={p.tpot_ms}")
        if not 0.0 <= p.acceptance <= 1.0:
            raise ConfigError(f"concurrency fit: acceptance must be in [0, 1], got {p.acceptance} at b={p.batch}")
        if not 1.0 <= p.expected_tokens <= base.depth + 1:
            raise ConfigError(f"concurrency fit: tokens per iteration must be in [1, {base.depth + 1}], got "
                              f"{p.expected_tokens} at b={p.batch}")
    if len({p.batch for p in points}) < 2:
        raise ConfigError(f"concurrency fit needs points at 2 or more concurrencies, got "
                          f"{sorted({p.batch for p in points})}")


def _nonneg_lstsq(a: NDArray[np.float64], r: NDArray[np.float64]) -> NDArray[np.float64]:
    """argmin ‖a·u − r‖ over 0 <= u <= TERM_MAX for two unknowns (every face of the box tried; exact for 2)."""
    cands = [np.linalg.lstsq(a, r, rcond=None)[0]]
    for j in range(2):
        col = a[:, j]
        u = np.zeros(2)
        u[j] = float(col @ r) / max(float(col @ col), 1e-300)
        cands.append(u)
    cands.append(np.zeros(2))
    ok = [np.clip(u, 0.0, TERM_MAX) for u in cands]
    return min(ok, key=lambda u: float(np.sum((a @ u - r) ** 2)))


def fit_concurrency_terms(points: Sequence[SpecPoint], plain: TpotCurve, base: SpecConfig) -> ConcurrencyFit:
    """Fit acceptance_slope (α vs log2 b) and token_cost, token_cost_slope (step-time residual), d, γ, p, c, v fixed."""
    _check(points, base)
    b = np.asarray([p.batch for p in points], dtype=np.int64)
    log_b = np.log2(b.astype(np.float64))
    alpha_b = np.asarray([p.acceptance for p in points])
    design = np.stack([np.ones_like(log_b), log_b], axis=1)
    (a0, slope), *_ = np.linalg.lstsq(design, alpha_b, rcond=None)
    a0, slope = float(np.clip(a0, 0.0, 1.0)), float(np.clip(slope, -1.0, 1.0))
    flat = replace(base, acceptance=a0, acceptance_slope=slope, token_cost=0.0, token_cost_slope=0.0)
    tau = plain.table(int(b.max()) * (base.depth + 1) + 1)
    y = np.asarray([p.tpot_ms / 1e3 * p.expected_tokens for p in points])
    rest = y - iteration_s(tau, b, flat)
    scale = (1.0 + base.cost) if base.defaults.drafter is Drafter.PARALLEL else 1.0
    unit = scale * base.share * base.depth * tau[b]
    w = 1.0 / y
    u0, u1 = _nonneg_lstsq((unit * w)[:, None] * design, rest * w)
    spec = replace(flat, token_cost=float(u0), token_cost_slope=float(u1))
    err = (iteration_s(tau, b, spec) - y) / y
    acc_err = spec.alphas(b) - alpha_b
    return ConcurrencyFit(spec, math.sqrt(float(np.mean(err**2))), math.sqrt(float(np.mean(acc_err**2))), len(points))


def _fit_block(doc: Any, path: Path) -> dict[str, Any] | None:
    """A model file's `speculative.concurrency_fit` table (None when absent); a `speculative` or `concurrency_fit`
    that is not a table is a one-line ConfigError naming the key (the file's schema, checked at the boundary)."""
    if not isinstance(doc, dict):
        raise ConfigError(f"model file {path} must be a JSON object, got {type(doc).__name__}")
    spec = doc.get("speculative")
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError(f"model file {path}: speculative must be a table, got {excerpt(spec)}")
    block = spec.get("concurrency_fit")
    if block is not None and not isinstance(block, dict):
        raise ConfigError(f"model file {path}: speculative.concurrency_fit must be a table, got {excerpt(block)}")
    return block


def spec_from_profile_file(path: Path) -> SpecConfig:
    """The `speculative.concurrency_fit` block of a model file `tailsieve profile` wrote, as a `SpecConfig`."""
    block = _fit_block(load_document(path, "model file", ConfigError), path)
    if block is None:
        raise ConfigError(f"model file {path} has no speculative.concurrency_fit block (tailsieve profile writes one "
                          "on a speculative server with --plain-curve and --method)")
    return spec_from_mapping({k: v for k, v in block.items() if k in SPEC_KEYS}, f"model file {path}")


def context_for(curve_arg: str | Path | None, curve: TpotCurve) -> SpecContext:
    """What a bare `mtp` / `dflash` means on this `--curve`: its model family, and the file's own concurrency fit
    when `--curve` is a `tailsieve profile` model file that has one (a user's own numbers first)."""
    fitted = None
    if (curve_arg is not None and str(curve_arg).lower().endswith(".json") and Path(curve_arg).is_file()
            and _fit_block(load_document(Path(curve_arg), "model file", ConfigError), Path(curve_arg)) is not None):
        fitted = spec_from_profile_file(Path(curve_arg))
    return SpecContext(family_of(curve), fitted)
