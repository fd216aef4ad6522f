"""Built-in speculation profiles fitted to the published record (`--tail-spec mtp`, `mtp:low`, `dflash-moe:high`);
docs/speculative.md.

Per method (MTP, DFlash) and model family (dense, MoE), three profiles in the model's own form (`SpecConfig`):

- acceptance α (γ = 1, s = 0: every published sweep is flat in concurrency): the minimum, median and maximum of the
  method's published acceptances (`Use.ACCEPTANCE`, each converted to α at its own depth) for low, central and high;
- depth d and draft cost c: assumptions per method (MTP d = 3, c = 0.1; DFlash block 16, d = 15, c = 0.15);
- verification share v and the per-token terms u0, u1 (v ∈ [0, 1], u ≥ 0): fitted. The cost of an iteration in plain
  steps, ā/S(b), is linear in (v, u0, u1), so the central profile is the least-squares fit (relative error) to the
  `Use.CENTRAL` points (the z-lab cards' concurrency sweeps, one source per cell), and the low (high) bracket is the
  linear programme: as fast (slow) as it can be while below (above) every bracketed point of its method and family
  at that point's concurrency and depth — so the brackets contain the published points by construction, and each
  touches the points that bind it.

Each profile's costs are relative to its family's reference curve (dense: h100-llama3-8b; MoE: a100x4-mixtral-8x7b).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tailsieve.errors import ConfigError
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve
from tailsieve.model.spec_records import Bracket, Family, Measurement, Metric, Use, measurements, points
from tailsieve.model.spec_solve import box_lp, box_lstsq
from tailsieve.model.speculative import Drafter, SpecConfig, SpecMethod, iteration_s

PROFILE_METHODS = (SpecMethod.MTP, SpecMethod.DFLASH)
DEPTH = {SpecMethod.MTP: 3, SpecMethod.DFLASH: 15}  # assumptions: the paper's MTP-3; DFlash block 16
DRAFT_COST = {SpecMethod.MTP: 0.1, SpecMethod.DFLASH: 0.15}  # assumptions: one MTP layer per pass; a small drafter
REFERENCE_CURVE = {Family.DENSE: "h100-llama3-8b", Family.MOE: "a100x4-mixtral-8x7b"}
LOWER, UPPER = np.zeros(3), np.asarray([1.0, 100.0, 100.0])  # bounds of (v, u0, u1): SpecConfig's
CENTRAL_PRECISION = 0.05  # the central profile's stated precision: relative error at each of its fit points


@dataclass(frozen=True, slots=True)
class SpecProfile:
    """A calibrated `SpecConfig` (tokens = the profile's depth) and the curve its costs are relative to."""

    method: SpecMethod
    family: Family
    bracket: Bracket
    spec: SpecConfig
    reference_curve: str

    @property
    def name(self) -> str:
        """`mtp-dense`, `dflash-moe:low`, … (the central one has no suffix)."""
        base = f"{self.method.value}-{self.family.value}"
        return base if self.bracket is Bracket.CENTRAL else f"{base}:{self.bracket.value}"

    @property
    def curve(self) -> TpotCurve:
        """The reference curve."""
        return load_curve(self.reference_curve)


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """A published point against the three profiles of its method and family (None: not comparable)."""

    point: Measurement
    low: float | None
    central: float | None
    high: float | None

    @property
    def contained(self) -> bool:
        """True when low ≤ published ≤ high within the point's stated precision (or the point is not bracketed)."""
        if not self.point.bracketed:
            return True
        assert self.low is not None and self.high is not None
        tol = self.point.tolerance + 1e-9
        return self.low <= self.point.value + tol and self.high >= self.point.value - tol


def alpha_for(expected: float, depth: int) -> float:
    """α with γ = 1 such that ā = 1 + Σ_{k=1..d} α^k equals `expected` (bisection; ā is increasing in α)."""
    if not 1.0 <= expected <= depth + 1:
        raise ConfigError(f"expected tokens {expected:g} outside 1..{depth + 1} for depth {depth}")
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1.0 + sum(mid**k for k in range(1, depth + 1)) < expected:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def point_depth(m: Measurement) -> int:
    """The point's depth, or its method's profile depth when the source does not state one."""
    return DEPTH[m.method] if m.depth is None else m.depth


def point_alpha(m: Measurement) -> float:
    """α implied by an acceptance point at its own depth."""
    d = point_depth(m)
    expected = 1.0 + d * m.value if m.metric is Metric.ACCEPTANCE_RATE else m.value
    return alpha_for(expected, d)


def bracket_alpha(method: SpecMethod, bracket: Bracket) -> float:
    """The minimum, median or maximum α of the method's published acceptances (every family: acceptance is the
    drafter's and the text's, not the verification cost's)."""
    alphas = sorted(point_alpha(m) for m in points(method, use=Use.ACCEPTANCE))
    if not alphas:
        raise ConfigError(f"data/spec_measurements.json holds no acceptance of {method.value} (the file is damaged: "
                          "reinstall tailsieve)")
    pick = {Bracket.LOW: alphas[0], Bracket.CENTRAL: statistics.median(alphas), Bracket.HIGH: alphas[-1]}
    return float(pick[bracket])


def _base(method: SpecMethod, alpha: float, depth: int) -> SpecConfig:
    return SpecConfig(method, tokens=depth, acceptance=alpha, decay=1.0, draft_cost=DRAFT_COST[method],
                      verify_cost=0.0)


def _linear_rows(pts: tuple[Measurement, ...], method: SpecMethod, alpha: float,
                 curve: TpotCurve) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per point: K (cost in plain steps at v = u = 0), A (its coefficients on v, u0, u1) and t = ā/S (published)."""
    ks, rows, ts = [], [], []
    for m in pts:
        assert m.concurrency is not None
        d, b = point_depth(m), m.concurrency
        base = _base(method, alpha, d)
        tau = curve.table(b * (d + 1) + 1)
        k = float(iteration_s(tau, np.asarray([b]), base)[0]) / tau[b]
        scale = 1.0 + DRAFT_COST[method] if base.defaults.drafter is Drafter.PARALLEL else 1.0
        growth = tau[b * (d + 1)] / tau[b] - 1.0
        ks.append(k)
        rows.append([scale * growth, scale * d, scale * d * math.log2(b)])
        ts.append(base.expected_tokens(b) / m.value)
    return np.asarray(ks), np.asarray(rows), np.asarray(ts)


def _fit(method: SpecMethod, family: Family, bracket: Bracket) -> SpecProfile:
    alpha, curve = bracket_alpha(method, bracket), load_curve(REFERENCE_CURVE[family])
    use = (Use.CENTRAL,) if bracket is Bracket.CENTRAL else (Use.CENTRAL, Use.RANGE)
    pts = tuple(m for m in points(method, family) if m.bracketed and m.use in use)
    k, a, t = _linear_rows(pts, method, alpha, curve)
    if bracket is Bracket.CENTRAL:
        x = box_lstsq(a / t[:, None], 1.0 - k / t, LOWER, UPPER)
    else:
        weight = (a / t[:, None]).sum(axis=0)
        sign = 1.0 if bracket is Bracket.LOW else -1.0  # low: cost ≥ published, as cheap as it can be; high: mirrored
        found = box_lp(sign * weight, sign * a, sign * (t - k), LOWER, UPPER)
        if found is None:
            raise ConfigError(f"no {bracket.value} {method.value}-{family.value} profile contains the published points")
        x = found
    v, u0, u1 = (float(z) for z in x)
    spec = SpecConfig(method, tokens=DEPTH[method], acceptance=alpha, decay=1.0, draft_cost=DRAFT_COST[method],
                      verify_cost=v, token_cost=u0, token_cost_slope=u1)
    return SpecProfile(method, family, bracket, spec, REFERENCE_CURVE[family])


@lru_cache(maxsize=1)
def profiles() -> dict[str, SpecProfile]:
    """Every built-in profile by name (fitted once)."""
    out = (_fit(m, f, b) for m in PROFILE_METHODS for f in Family for b in Bracket)
    return {p.name: p for p in out}


def profile(method: SpecMethod, family: Family, bracket: Bracket) -> SpecProfile:
    """One profile."""
    return next(p for p in profiles().values() if (p.method, p.family, p.bracket) == (method, family, bracket))


def profile_names() -> str:
    """The accepted profile names, for messages."""
    return "mtp, dflash (central, for the curve's family), mtp-dense, mtp-moe, dflash-dense, dflash-moe; each with " \
           ":low, :central or :high (and :default for the uncalibrated method constants)"


def speedup(spec: SpecConfig, curve: TpotCurve, b: int) -> float:
    """τ(b)/τ_spec(b): the per-request speedup of speculation at concurrency b on `curve`."""
    return curve.tpot_s(b) / spec.curve(curve).tpot_s(b)


def crossing(spec: SpecConfig, curve: TpotCurve, limit: int = 4096) -> float | None:
    """The concurrency where speculation stops paying: the first b with S(b) < 1, interpolated linearly between b − 1
    and b (None when it pays up to `limit`; 1.0 when it already loses at b = 1)."""
    bs = np.arange(1, limit + 1)
    s = curve.table(limit)[1:] / spec.curve(curve).table(limit)[1:]
    below = np.flatnonzero(s < 1.0)
    if below.size == 0:
        return None
    i = int(below[0])
    if i == 0:
        return 1.0
    return float(bs[i - 1] + (s[i - 1] - 1.0) / (s[i - 1] - s[i]))


def model_value(m: Measurement, prof: SpecProfile) -> float | None:
    """What the profile predicts for the point (at the point's depth), None when it has no concurrency."""
    spec = prof.spec.with_tokens(point_depth(m))
    if m.metric is Metric.ACCEPTANCE_RATE:
        return (spec.expected_tokens() - 1.0) / spec.depth
    if m.metric is Metric.ACCEPT_LENGTH:
        return spec.expected_tokens()
    return None if m.concurrency is None else speedup(spec, prof.curve, m.concurrency)


def calibration_rows() -> tuple[CalibrationRow, ...]:
    """Every measurement against the low, central and high profile of its method and family."""
    rows = []
    for m in measurements():
        vals = [model_value(m, profile(m.method, m.family, b)) for b in Bracket]
        rows.append(CalibrationRow(m, *vals))
    return tuple(rows)
