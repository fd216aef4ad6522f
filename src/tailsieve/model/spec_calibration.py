"""Built-in speculation profiles fitted to published measurements (`--tail-spec mtp-qwen`, …); docs/speculative.md.

The numbers live in `data/spec_measurements.json`, each with its source thread; this module holds the recipe: which
constants each profile fixes by assumption (named below) and which it solves from the `fit` points, in closed form.
The fitted model reproduces every `fit` point exactly (to floating point), which the tests check against each
point's stated precision; `check` points are compared only (`calibration_rows`).

- `mtp-qwen` (vLLM recipes, MTP losing 8% at concurrency 8 and 32% at 64, acceptance 36.5%): depth 3 and draft
  cost 0.1 are assumptions, γ = 1; v = 0 and the per-extra-token cost u0 + u1·log2 b is solved from the two
  speedups, so the profile is the same on every base curve.
- `dflash-qwen3-8b` (dense): block 16 (d = 15, SGLang's default) and γ = 1 are assumptions; α from the accept length
  2.8 of the A800 run, v from the concurrency-32/1 speedup ratio of the Qwen3.5-27B H100 sweep, c from the A800
  batch-1 speedup 1.84, both on the reference curve h100-llama3-8b.
- `dflash-qwen3-30b-a3b` (MoE): the dense drafting cost c (assumption: same drafter design); α from accept length
  2.0, v from the batch-1 slowdown 146 → 93 tok/s on the reference curve a100x4-mixtral-8x7b.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from tailsieve.errors import ConfigError
from tailsieve.model.curves import TpotCurve, load_curve
from tailsieve.model.speculative import SpecConfig, SpecMethod

MTP_DEPTH, MTP_DRAFT_COST = 3, 0.1  # assumptions (the recipe's depth is not stated; one MTP layer per pass)
DFLASH_DEPTH = 15  # assumption: block size 16 (SGLang's default verify block for the -b16 drafters)
DENSE_CURVE, MOE_CURVE = "h100-llama3-8b", "a100x4-mixtral-8x7b"


@dataclass(frozen=True, slots=True)
class Measurement:
    """One published number (`data/spec_measurements.json`)."""

    id: str
    profile: str
    metric: str  # speedup | speedup_ratio (S(b)/S(1)) | acceptance_rate | acceptance_flat
    concurrency: int | None
    value: float
    tolerance: float  # the precision the source states
    role: str  # fit | check
    source: str
    setup: str
    accept_length: float | None = None


@dataclass(frozen=True, slots=True)
class SpecProfile:
    """A named, calibrated `SpecConfig` (tokens = the measured depth) and the curve its costs are relative to."""

    name: str
    spec: SpecConfig
    reference_curve: str
    summary: str


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """A published point against the fitted model."""

    point: Measurement
    model: float

    @property
    def error(self) -> float:
        """model − published."""
        return self.model - self.point.value

    @property
    def within(self) -> bool:
        """True when the model reproduces the point within its stated precision."""
        return abs(self.error) <= self.point.tolerance + 1e-12


@lru_cache(maxsize=1)
def measurements() -> tuple[Measurement, ...]:
    """Every shipped measurement, in file order."""
    text = resources.files("tailsieve").joinpath("data/spec_measurements.json").read_text(encoding="utf-8")
    raw: list[dict[str, Any]] = json.loads(text)["measurements"]
    return tuple(Measurement(**m) for m in raw)


def _point(pid: str) -> Measurement:
    return next(m for m in measurements() if m.id == pid)


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


def _growth(curve: TpotCurve, b: int, depth: int) -> float:
    """τ(b(d+1))/τ(b) − 1: the curve's growth over the verified block."""
    return curve.tpot_s(b * (depth + 1)) / curve.tpot_s(b) - 1.0


def _mtp_qwen() -> SpecProfile:
    d = MTP_DEPTH
    rate, p8, p64 = _point("recipes923-acceptance"), _point("recipes923-c8"), _point("recipes923-c64")
    expected = 1.0 + rate.value * d
    r8, r64 = expected / p8.value, expected / p64.value  # iteration cost in plain steps: 1 + d·c + d·(u0 + u1 log2 b)
    assert p8.concurrency is not None and p64.concurrency is not None
    u1 = (r64 - r8) / (d * (math.log2(p64.concurrency) - math.log2(p8.concurrency)))
    u0 = (r8 - 1.0 - d * MTP_DRAFT_COST) / d - u1 * math.log2(p8.concurrency)
    spec = SpecConfig(SpecMethod.MTP, tokens=d, acceptance=alpha_for(expected, d), decay=1.0,
                      draft_cost=MTP_DRAFT_COST, verify_cost=0.0, token_cost=u0, token_cost_slope=u1)
    return SpecProfile("mtp-qwen", spec, DENSE_CURVE, "MTP, vLLM recipe (#923, numbers as quoted in issue 26): "
                       "acceptance 36.5%, -8% at concurrency 8, -32% at 64; the same on every curve (v = 0)")


def _dflash_dense() -> tuple[SpecProfile, float]:
    d, curve = DFLASH_DEPTH, load_curve(DENSE_CURVE)
    dense, ratio = _point("sglang29244-dense"), _point("sglang19952-c32")
    assert dense.accept_length is not None and ratio.concurrency is not None
    g1, gb = _growth(curve, 1, d), _growth(curve, ratio.concurrency, d)
    r = 1.0 / ratio.value  # R(b)/R(1) with flat acceptance: (1 + v·g(b)) / (1 + v·g(1))
    v = (r - 1.0) / (gb - r * g1)
    c = dense.accept_length / dense.value / (1.0 + v * g1) - 1.0
    spec = SpecConfig(SpecMethod.DFLASH, tokens=d, acceptance=alpha_for(dense.accept_length, d), decay=1.0,
                      draft_cost=c, verify_cost=v)
    return SpecProfile("dflash-qwen3-8b", spec, DENSE_CURVE, "DFlash block 16 on a dense 8B (SGLang #29244 A800 "
                       "batch 1: 88 -> 162 tok/s; concurrency shape from #19952)"), c


def _dflash_moe(c: float) -> SpecProfile:
    d, curve, moe = DFLASH_DEPTH, load_curve(MOE_CURVE), _point("sglang29244-moe")
    assert moe.accept_length is not None
    v = (moe.accept_length / moe.value / (1.0 + c) - 1.0) / _growth(curve, 1, d)
    spec = SpecConfig(SpecMethod.DFLASH, tokens=d, acceptance=alpha_for(moe.accept_length, d), decay=1.0,
                      draft_cost=c, verify_cost=min(v, 1.0))
    return SpecProfile("dflash-qwen3-30b-a3b", spec, MOE_CURVE, "DFlash block 16 on an MoE (SGLang #29244 A800 "
                       "batch 1, Qwen3-30B-A3B: 146 -> 93 tok/s)")


@lru_cache(maxsize=1)
def profiles() -> dict[str, SpecProfile]:
    """The built-in profiles by name (fitted once)."""
    dense, c = _dflash_dense()
    out = (_mtp_qwen(), dense, _dflash_moe(c))
    return {p.name: p for p in out}


def profile_names() -> str:
    """Comma-separated profile names, for messages."""
    return ", ".join(profiles())


def lookup(name: str) -> SpecConfig | None:
    """A profile's `SpecConfig` by name (case-insensitive), None for any other name."""
    p = profiles().get(name.strip().lower())
    return None if p is None else p.spec


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


def calibration_rows() -> tuple[CalibrationRow, ...]:
    """Every measurement against its profile's model (on the profile's reference curve)."""
    return tuple(CalibrationRow(m, _model_value(m)) for m in measurements())


def _model_value(m: Measurement) -> float:
    prof = profiles()[m.profile]
    spec, curve = prof.spec, load_curve(prof.reference_curve)
    if m.metric == "acceptance_rate":
        return (spec.expected_tokens() - 1.0) / spec.depth
    assert m.concurrency is not None
    if m.metric == "speedup":
        return speedup(spec, curve, m.concurrency)
    if m.metric == "speedup_ratio":
        return speedup(spec, curve, m.concurrency) / speedup(spec, curve, 1)
    group = [x for x in measurements() if x.source == m.source and x.metric == m.metric]
    mean = sum(x.value for x in group) / len(group)  # flat acceptance predicts the group mean at every b, × ā(b)/ā(1)
    return mean * spec.expected_tokens(m.concurrency) / spec.expected_tokens(1)

