"""The replica cost model `tailsieve profile` fits and `simulate`, `rollout`, `plan` and the controller use.

One decode iteration of a replica with b running requests holding C context tokens in all (prompt + generated so
far, summed over the b requests) takes

    t_iter(b, C) = τ(b) + kv_ms_per_1k · C / 1000   (ms)

and admitting requests with P prompt tokens in all stalls the replica for prefill_ms_per_token · P ms. These are
exactly the terms of `simulation.replica.ReplicaConfig` (`kv_ms_per_1k_tokens`, `prefill_ms_per_token`) and of
the controller's predictor (`policy.predictor`, `kv_s_per_token` = kv_ms_per_1k / 10⁶).

The model file is a curve file with more keys (docs/profile.md): `batch` and `tpot_ms` are τ(b) at zero context,
so every reader of a plain curve (`load_curve`, `tailsieve curves`) still reads it; `cost_model` holds the terms and
`fit` the measured points with their residuals. A plain curve loads as a model with both terms 0. The engine keys
(`kv_tokens`, `block_size`, `max_num_batched_tokens`, `prefix_caching`, `speed_factors` or `speed_spread`,
`speed_drift`; `model.engine.EngineTruth`) sit in `cost_model` beside the terms.

The fit (`fit_cost_model`) is linear least squares over the measured points: one τ(b) per distinct batch size and
one shared kv term, from per-token times measured at several context lengths; the prefill term (and a fixed
per-request overhead) from time-to-first-token against prompt tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tailsieve.errors import CurveError
from tailsieve.inputs import excerpt, loads_json, read_text
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import MAX_TPOT_MS, MIN_TPOT_MS, TpotCurve, builtin_curves, curve_from_points
from tailsieve.model.engine import EngineTruth, engine_from_json

MODEL_FORMAT = "tailsieve-cost-model/1"
MAX_TERM_MS = 1e6  # the same bound as the simulate flags


@dataclass(frozen=True, slots=True)
class DecodePoint:
    """A measured per-token time: `batch` requests decoding together with `context` mean context tokens each."""

    batch: int
    context: float
    tpot_ms: float


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    """A measured time to first token of a request with `prompt_tokens` prompt tokens (alone on the server)."""

    prompt_tokens: int
    ttft_ms: float


@dataclass(frozen=True, slots=True)
class CostModel:
    """τ(b) plus the context (KV) and prefill terms (ms; the module docstring gives the formula)."""

    curve: TpotCurve
    kv_ms_per_1k: float = 0.0
    prefill_ms_per_token: float = 0.0
    request_overhead_ms: float = 0.0  # TTFT intercept: measured and reported, not simulated
    fit: dict[str, Any] = field(default_factory=dict, compare=False)
    engine: EngineTruth = field(default_factory=EngineTruth)  # KV capacity, chunked prefill, prefix cache, speeds

    def __post_init__(self) -> None:
        for name in ("kv_ms_per_1k", "prefill_ms_per_token", "request_overhead_ms"):
            _term({name: getattr(self, name)}, name, f"cost model '{self.curve.name}'")

    @property
    def kv_s_per_token(self) -> float:
        """Seconds per context token per iteration (the predictor's and `ReplicaConfig`'s unit)."""
        return self.kv_ms_per_1k / 1e6

    def tpot_ms(self, batch: int, context: float) -> float:
        """Modelled per-token time of `batch` requests with `context` mean context tokens each."""
        return self.curve.tpot_s(batch) * 1e3 + self.kv_ms_per_1k * batch * context / 1000.0

    def terms_json(self) -> dict[str, Any]:
        """The `cost_model` object of the file."""
        return {"format": MODEL_FORMAT, "kv_ms_per_1k": self.kv_ms_per_1k,
                "prefill_ms_per_token": self.prefill_ms_per_token, "request_overhead_ms": self.request_overhead_ms,
                **self.engine.to_json()}

    def to_json(self) -> dict[str, Any]:
        """The model file: the curve's keys, `cost_model` and (when fitted) `fit`."""
        doc = self.curve.to_json() | {"cost_model": self.terms_json()}
        if self.fit:
            doc["fit"] = self.fit
        return doc


def _term(obj: dict[str, Any], key: str, where: str) -> float:
    v = obj.get(key, 0.0)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= MAX_TERM_MS:
        raise CurveError(f"{where}: cost_model.{key} must be a number in [0, {MAX_TERM_MS:g}], got {excerpt(v)}")
    return float(v)


def model_from_json(obj: Any, where: str, name: str | None = None) -> CostModel:
    """A model from a parsed file: a curve object, with or without `cost_model` (one-line errors naming `where`)."""
    if not isinstance(obj, dict) or "batch" not in obj or "tpot_ms" not in obj:
        raise CurveError(f"{where}: JSON must be an object with 'batch' and 'tpot_ms' lists")
    curve = curve_from_points(name or where, obj["batch"], obj["tpot_ms"], description=str(obj.get("description", "")))
    terms = obj.get("cost_model")
    if terms is None:
        return CostModel(curve)
    if not isinstance(terms, dict):
        raise CurveError(f"{where}: cost_model must be an object with kv_ms_per_1k and prefill_ms_per_token")
    fmt = terms.get("format", MODEL_FORMAT)
    if fmt != MODEL_FORMAT:
        raise CurveError(f"{where}: cost_model.format {excerpt(fmt)} is not {MODEL_FORMAT!r}")
    fit = obj.get("fit")
    return CostModel(curve, _term(terms, "kv_ms_per_1k", where), _term(terms, "prefill_ms_per_token", where),
                     _term(terms, "request_overhead_ms", where), fit if isinstance(fit, dict) else {},
                     engine_from_json(terms, where))


def load_cost_model(spec: str | Path | TpotCurve | CostModel) -> CostModel:
    """A model by built-in curve name, curve or model file (JSON or CSV), curve or model: plain curves get 0 terms."""
    if isinstance(spec, CostModel):
        return spec
    if isinstance(spec, TpotCurve):
        return CostModel(spec)
    if isinstance(spec, str) and spec in builtin_curves():
        return CostModel(builtin_curves()[spec])
    if isinstance(spec, str) and spec.startswith("family:"):  # a generated regime's curve, never a file name
        return CostModel(load_curve(spec))
    path = Path(spec)
    if path.exists():
        text = read_text(path, "curve file", CurveError)
        if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
            return model_from_json(loads_json(text, f"curve file {path}", CurveError), f"curve file {path}", str(path))
    return CostModel(load_curve(spec))  # CSV, or the one-line "unknown curve" error


def _lstsq(a: np.ndarray, y: np.ndarray, what: str) -> np.ndarray:
    """Least squares with a rank check: too few (or degenerate) points are a one-line error."""
    hint = "measure at least two context lengths (two prompt lengths for the prefill term)"
    if a.shape[0] < a.shape[1]:
        raise CurveError(f"{what}: {a.shape[0]} measured points for {a.shape[1]} unknowns; {hint}")
    coef, _, rank, _ = np.linalg.lstsq(a, y, rcond=None)
    if rank < a.shape[1]:
        raise CurveError(f"{what}: the points do not determine the fit (rank {rank} < {a.shape[1]}); {hint}")
    out: np.ndarray = coef
    return out


def fit_decode(points: Sequence[DecodePoint]) -> tuple[tuple[int, ...], np.ndarray, float]:
    """τ(b) at zero context per distinct batch size and the kv term (ms per 1k context tokens per iteration) by least
    squares on tpot = τ(b) + kv·b·c/1000. A negative kv (noise on a flat server) is clamped to 0 and τ refitted."""
    if not points:
        raise CurveError("cost model fit: no decode points")
    bs = np.array([p.batch for p in points], np.int64)
    ctx = np.array([p.context for p in points], np.float64)
    y = np.array([p.tpot_ms for p in points], np.float64)
    uniq, idx = np.unique(bs, return_inverse=True)
    onehot = np.zeros((bs.size, uniq.size))
    onehot[np.arange(bs.size), idx] = 1.0
    a = np.column_stack((onehot, bs * ctx / 1000.0))
    coef = _lstsq(a, y, "cost model fit (decode)")
    kv = float(coef[-1])
    if kv < 0:
        kv = 0.0
        coef = _lstsq(onehot, y, "cost model fit (decode)")
        coef = np.append(coef, 0.0)
    tau = np.clip(coef[:-1], MIN_TPOT_MS, MAX_TPOT_MS)
    return tuple(int(b) for b in uniq), tau, kv


def fit_prefill(points: Sequence[PrefillPoint]) -> tuple[float, float]:
    """(prefill ms per prompt token, per-request overhead ms) from ttft = overhead + p·P; both clamped at 0."""
    if not points:
        return 0.0, 0.0
    p = np.array([x.prompt_tokens for x in points], np.float64)
    y = np.array([x.ttft_ms for x in points], np.float64)
    coef = _lstsq(np.column_stack((np.ones_like(p), p)), y, "cost model fit (prefill)")
    over, per = float(coef[0]), float(coef[1])
    if per < 0:
        per, over = 0.0, float(np.mean(y))
    if over < 0:
        over = 0.0
        per = max(float(np.dot(p, y) / np.dot(p, p)), 0.0) if np.dot(p, p) > 0 else 0.0
    return per, over


def fit_cost_model(decode: Sequence[DecodePoint], prefill: Sequence[PrefillPoint] = (), *, name: str = "fitted",
                   description: str = "", source: str = "") -> CostModel:
    """The whole model from measurements, with every point's fitted value and residual in `fit`."""
    batch, tau, kv = fit_decode(decode)
    curve = TpotCurve(name=name, batch=batch, tpot_ms=tuple(round(float(t), 6) for t in tau),
                      description=description, source=source)
    per, over = fit_prefill(prefill)
    model = CostModel(curve, round(kv, 9), round(per, 9), round(over, 6))
    dec_rows = []
    for p in decode:
        pred = float(tau[batch.index(p.batch)]) + kv * p.batch * p.context / 1000.0
        dec_rows.append({"batch": p.batch, "context": p.context, "tpot_ms": p.tpot_ms, "fit_ms": pred,
                         "residual_ms": p.tpot_ms - pred})
    pre_rows = [{"prompt_tokens": x.prompt_tokens, "ttft_ms": x.ttft_ms, "fit_ms": over + per * x.prompt_tokens,
                 "residual_ms": x.ttft_ms - over - per * x.prompt_tokens} for x in prefill]
    rel = [r["residual_ms"] / r["tpot_ms"] for r in dec_rows]
    fit = {"decode": dec_rows, "prefill": pre_rows,
           "decode_rms_rel": float(np.sqrt(np.mean(np.square(rel)))) if rel else 0.0}
    return CostModel(model.curve, model.kv_ms_per_1k, model.prefill_ms_per_token, model.request_overhead_ms, fit)


__all__ = ["MODEL_FORMAT", "CostModel", "DecodePoint", "PrefillPoint", "fit_cost_model", "fit_decode", "fit_prefill",
           "load_cost_model", "model_from_json"]
