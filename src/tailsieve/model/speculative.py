"""Route-specialized speculative decoding (§3.4, §4.3): a per-pool method and depth, modelled as a derived curve.

Per pool: a method (`SpecMethod`), a depth d (speculative tokens per iteration) and a per-position acceptance α;
position k of a draft is accepted with probability α·γ^(k−1) given that positions 1..k−1 were (γ = `decay`, 1 by
default). A verification iteration with b running requests gains each of them, on average,

    ā = Σ_{k=0..d} α^k γ^(k(k−1)/2)        (γ = 1: ā = (1 − α^(d+1))/(1 − α); ā = d + 1 at α = 1)

tokens, verifies b·(d+1) tokens and costs τ(b·(d+1)) + draft(b) through the pool's TPOT curve. So the per-token
time of each of b running requests is τ_spec(b) = (τ(b(d+1)) + draft(b))/ā: a TPOT curve (`SpecConfig.curve`),
tabulated exactly at every batch size, which the replica simulator, the oracles and the predictor use unchanged
(an expected-value model: the accepted count is its mean, tokens stay integers). Details: docs/speculative.md.

Two calibration constants refine it (both 1 by default, the literal model above): a draft share p (only a share p
of request-iterations carry a draft, so ā = 1 + p·Σ… and 1 + p·d tokens are verified per request) and a
verification-cost share v (verification costs τ(b) + v·(τ(b(1 + p·d)) − τ(b)): the extra tokens do not re-read the
weights or the b contexts) — `tailsieve profile --plain-curve` fits both from a real server.

Three concurrency terms (all 0 by default) let cost and acceptance depend on b, as published measurements need
(`model/spec_calibration.py` fits them): each extra verified token costs a further (u0 + u1·log2 b)·τ(b)
(`token_cost`, `token_cost_slope`), and the first position's acceptance is α(b) = clip(α + s·log2 b, 0, 1)
(`acceptance_slope`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError
from tailsieve.inputs import excerpt
from tailsieve.model.curves import TpotCurve

MAX_TOKENS = 32  # speculative tokens per iteration accepted by the configuration (vLLM allows fewer in practice)
EXACT_BATCH = 2048  # with concurrency terms the derived curve is tabulated exactly up to here (docs/speculative.md)


class SpecMethod(StrEnum):
    """Speculative backends a pool can run (§3.4): vLLM's `speculative_config` method names."""

    NONE = "none"
    MTP = "mtp"
    EAGLE3 = "eagle3"
    DFLASH = "dflash"
    NGRAM = "ngram"
    SUFFIX = "suffix"


class Drafter(StrEnum):
    """How a method drafts, which fixes the shape of its drafting cost per iteration."""

    AUTOREGRESSIVE = "autoregressive"  # d drafter passes of b tokens: draft = c·d·τ(b)   (MTP, EAGLE-3)
    PARALLEL = "parallel"  # one drafter pass over the b·(d+1) block: draft = c·τ(b(d+1))   (DFlash)
    LOOKUP = "lookup"  # no drafter model (n-gram / suffix match): draft = c·τ(b), an overhead share


@dataclass(frozen=True, slots=True)
class MethodDefaults:
    """Default model constants of one method; `source` says where each number comes from."""

    acceptance: float
    decay: float
    draft_cost: float
    drafter: Drafter
    tokens: int
    source: str
    verify_cost: float = 1.0  # v: share of τ's growth that the b·p·d extra verified tokens pay (1 = the literal model)
    draft_share: float = 1.0  # p: share of request-iterations that carry a draft (below 1: lookup finds no match)


METHOD_DEFAULTS: dict[SpecMethod, MethodDefaults] = {
    SpecMethod.NONE: MethodDefaults(0.0, 1.0, 0.0, Drafter.LOOKUP, 0, "no speculation"),
    SpecMethod.MTP: MethodDefaults(
        0.90, 0.95, 0.10, Drafter.AUTOREGRESSIVE, 3,
        "α: a Qwen-family MTP head on code, first position 0.91 teacher-forced (tenstorrent/vllm#442) and 92% "
        "accepted of 3 drafts (ik_llama.cpp#2369), DeepSeek-V3 reports 85–90%; γ: assumption, a one-step head reused "
        "deeper loses acceptance; d = 3: the paper's MTP (§4.2); draft cost: assumption (one layer + LM head/pass)"),
    SpecMethod.EAGLE3: MethodDefaults(
        0.80, 1.0, 0.10, Drafter.AUTOREGRESSIVE, 3,
        "assumption: chain drafts with per-position acceptance ≈ 0.8, flat over positions (EAGLE-3's training-time "
        "test); draft cost: assumption (one decoder layer + LM head per pass)"),
    SpecMethod.DFLASH: MethodDefaults(
        0.85, 0.95, 0.15, Drafter.PARALLEL, 3,
        "assumption: high first-position acceptance that decays along the block (positions drafted in parallel); "
        "d = 3 ≈ the paper's block size 4 (§4.2); draft cost: assumption (a few-layer drafter, one pass)"),
    SpecMethod.NGRAM: MethodDefaults(
        0.30, 1.0, 0.0, Drafter.LOOKUP, 3,
        "assumption: prompt-lookup drafts rarely match fresh reasoning text; CPU lookup, no GPU drafting cost"),
    SpecMethod.SUFFIX: MethodDefaults(
        0.50, 1.0, 0.10, Drafter.LOOKUP, 3,
        "assumption: 'modest' accepted length (§3.4); overhead 0.1·τ(b) for ragged queries without CUDA graphs"),
}


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """One pool's speculative decoding: method, depth d and model constants (None = the method's default)."""

    method: SpecMethod = SpecMethod.NONE
    tokens: int | None = None  # d, speculative tokens per iteration; 0 disables speculation
    acceptance: float | None = None  # α, per-position acceptance of the first drafted token
    decay: float | None = None  # γ, factor on α per further position (1 = the constant-α model)
    draft_cost: float | None = None  # c, drafting cost as a share of a target pass (shape: `Drafter`)
    verify_cost: float | None = None  # v, share of the curve's growth the extra verified tokens pay (1: τ(b(d+1)))
    draft_share: float | None = None  # p, share of request-iterations that carry a draft
    token_cost: float = 0.0  # u0: each extra verified token also costs u0·τ(b)
    token_cost_slope: float = 0.0  # u1: … and u1·log2(b)·τ(b) more (verification dearer at high concurrency)
    acceptance_slope: float = 0.0  # s: α(b) = clip(α + s·log2 b, 0, 1)
    draft_cpu_s: float = 0.0  # t: CPU seconds the drafter spends per running request per iteration (suffix tree)

    def __post_init__(self) -> None:
        if not isinstance(self.method, SpecMethod):
            raise ConfigError(f"speculative method must be one of {method_names()}, got {excerpt(self.method)}")
        t = self.tokens
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_TOKENS):
            raise ConfigError(f"speculative tokens must be an integer in 0..{MAX_TOKENS}, got {excerpt(t)}")
        if self.method is SpecMethod.NONE and t:
            raise ConfigError(f"speculative method none takes no speculative tokens, got tokens={t}")
        for name, hi in (("acceptance", 1.0), ("decay", 1.0), ("draft_cost", math.inf), ("verify_cost", 1.0),
                         ("draft_share", 1.0)):
            v = getattr(self, name)
            ok = v is None or (not isinstance(v, bool) and isinstance(v, int | float) and 0.0 <= v <= hi)
            if not ok or (v is not None and math.isnan(v)):
                span = "[0, 1]" if hi == 1.0 else ">= 0 and finite"
                raise ConfigError(f"speculative {name} must be {span}, got {excerpt(v)}")
        if self.draft_cost is not None and not math.isfinite(self.draft_cost):
            raise ConfigError(f"speculative draft_cost must be >= 0 and finite, got {excerpt(self.draft_cost)}")
        for name, lo, hi in (("token_cost", 0.0, 100.0), ("token_cost_slope", 0.0, 100.0),
                             ("acceptance_slope", -1.0, 1.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:  # NaN fails the range
                raise ConfigError(f"speculative {name} must be in [{lo:g}, {hi:g}], got {excerpt(v)}")
        t_cpu = self.draft_cpu_s
        if isinstance(t_cpu, bool) or not isinstance(t_cpu, int | float) or not 0.0 <= t_cpu <= 1.0:
            raise ConfigError(f"speculative draft_cpu_s must be in [0, 1] seconds, got {excerpt(t_cpu)}")

    @property
    def defaults(self) -> MethodDefaults:
        """The method's default constants."""
        return METHOD_DEFAULTS[self.method]

    @property
    def depth(self) -> int:
        """d (0 when speculation is off)."""
        return self.defaults.tokens if self.tokens is None else self.tokens

    @property
    def alpha(self) -> float:
        """α, the first position's acceptance."""
        return self.defaults.acceptance if self.acceptance is None else float(self.acceptance)

    @property
    def gamma(self) -> float:
        """γ, the per-position decay of the acceptance."""
        return self.defaults.decay if self.decay is None else float(self.decay)

    @property
    def cost(self) -> float:
        """c, the drafting cost share."""
        return self.defaults.draft_cost if self.draft_cost is None else float(self.draft_cost)

    @property
    def verify(self) -> float:
        """v, the verification-cost share (1: verifying b(d+1) tokens costs τ(b(d+1)))."""
        return self.defaults.verify_cost if self.verify_cost is None else float(self.verify_cost)

    @property
    def share(self) -> float:
        """p, the share of request-iterations that carry a draft."""
        return self.defaults.draft_share if self.draft_share is None else float(self.draft_share)

    @property
    def verified_per_request(self) -> float:
        """Tokens verified per request-iteration: 1 + p·d."""
        return 1.0 + self.share * self.depth if self.enabled else 1.0

    @property
    def enabled(self) -> bool:
        """True when the pool drafts at least one token per iteration."""
        return self.method is not SpecMethod.NONE and self.depth > 0

    @property
    def label(self) -> str:
        """Short name, e.g. `mtp-3` or `none`."""
        return f"{self.method.value}-{self.depth}" if self.enabled else "none"

    def with_tokens(self, tokens: int) -> SpecConfig:
        """The same method and constants at another depth."""
        return replace(self, tokens=tokens)

    @property
    def concurrency_terms(self) -> bool:
        """True when cost or acceptance depends on b beyond the base curve (u0, u1 or s non-zero)."""
        return bool(self.token_cost or self.token_cost_slope or self.acceptance_slope)

    def position_acceptance(self, b: int = 1) -> NDArray[np.float64]:
        """P(position k accepted | 1..k−1 accepted) for k = 1..d at concurrency b: α(b)·γ^(k−1)."""
        return np.asarray(self.alphas(np.asarray([b]))[0] * self.gamma ** np.arange(self.depth, dtype=np.float64),
                          dtype=np.float64)

    def alphas(self, b: NDArray[np.int64]) -> NDArray[np.float64]:
        """α(b) = clip(α + s·log2 b, 0, 1) for every b in the array."""
        return np.asarray(np.clip(self.alpha + self.acceptance_slope * np.log2(b), 0.0, 1.0), dtype=np.float64)

    def expected_tokens_at(self, b: NDArray[np.int64]) -> NDArray[np.float64]:
        """ā(b) for every b: 1 + p·Σ_k Π_{j≤k} α(b)·γ^(j−1)."""
        if not self.enabled:
            return np.ones(b.shape)
        pos = self.alphas(b)[:, None] * self.gamma ** np.arange(self.depth, dtype=np.float64)[None, :]
        return np.asarray(1.0 + self.share * np.cumprod(pos, axis=1).sum(axis=1), dtype=np.float64)

    def expected_tokens(self, b: int = 1) -> float:
        """ā: expected tokens a request gains per verification iteration at concurrency b."""
        return float(self.expected_tokens_at(np.asarray([b]))[0])

    def curve(self, base: TpotCurve) -> TpotCurve:
        """τ_spec(b) = (τ(b(d+1)) + draft(b))/ā as a TPOT curve (the base curve itself when speculation is off)."""
        return _derived_curve(base, self) if self.enabled else base

    def vllm_config(self) -> dict[str, Any] | None:
        """vLLM's `speculative_config` for this pool (a draft model, where the method needs one, is added by the
        launcher); None when speculation is off."""
        if not self.enabled:
            return None
        return {"method": self.method.value, "num_speculative_tokens": self.depth}

    def to_json(self) -> dict[str, Any]:
        """Resolved constants (defaults filled in) and ā."""
        return {"method": self.method.value, "tokens": self.depth, "acceptance": self.alpha, "decay": self.gamma,
                "draft_cost": self.cost, "verify_cost": self.verify, "draft_share": self.share,
                "token_cost": self.token_cost, "token_cost_slope": self.token_cost_slope,
                "acceptance_slope": self.acceptance_slope, "draft_cpu_s": self.draft_cpu_s,
                "drafter": self.defaults.drafter.value,
                "expected_tokens": self.expected_tokens()}


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """Speculative configuration of the two pools (§3.4). Uniform and warm-up steps run every replica as bulk."""

    tail: SpecConfig = field(default_factory=SpecConfig)
    bulk: SpecConfig = field(default_factory=SpecConfig)

    @classmethod
    def uniform(cls, spec: SpecConfig) -> PoolSpec:
        """The same configuration on every replica (the matched-budget baseline, §4.3)."""
        return cls(tail=spec, bulk=spec)

    @property
    def enabled(self) -> bool:
        """True when either pool speculates."""
        return self.tail.enabled or self.bulk.enabled

    def curves(self, base: TpotCurve) -> tuple[TpotCurve, TpotCurve]:
        """(tail curve, bulk curve) derived from the base curve."""
        return self.tail.curve(base), self.bulk.curve(base)

    def to_json(self) -> dict[str, Any]:
        """Both pools, resolved."""
        return {"tail": self.tail.to_json(), "bulk": self.bulk.to_json()}


def verify_points(tau: NDArray[np.float64], b: NDArray[np.int64],
                  verified_per_request: float | NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """τ(b) and τ(b·(1 + p·d)) read off a τ table (`TpotCurve.table`): the two ends of verify(b) = τ(b) +
    v·(τ(b(1 + p·d)) − τ(b)); the fractional batch is interpolated linearly, as the curve is between integers."""
    tau_x = np.interp(b * verified_per_request, np.arange(tau.size), tau)
    return tau[b], tau_x


@lru_cache(maxsize=128)
def _derived_curve(base: TpotCurve, spec: SpecConfig) -> TpotCurve:
    """Tabulate τ_spec at b = 1..B, B = last measured batch + 1 (EXACT_BATCH with concurrency terms): past B every
    term is linear in b (the base curve's own extension), so the curve's linear extension along its last two points
    is exact too; with concurrency terms (log2 b) it is exact up to EXACT_BATCH and linear beyond."""
    n = max(base.batch[-1], 1) + 1
    if spec.concurrency_terms:
        n = max(n, EXACT_BATCH)
    b = np.arange(1, n + 1)
    per_token_ms = iteration_s(base.table(n * (spec.depth + 1)), b, spec) / spec.expected_tokens_at(b) * 1000.0
    return TpotCurve(
        name=f"{base.name}+{spec.label}",
        batch=tuple(int(x) for x in b),
        tpot_ms=tuple(float(x) for x in per_token_ms),
        description=(f"{base.name} with {spec.label} speculation (α={spec.alpha:g}, γ={spec.gamma:g}, "
                     f"c={spec.cost:g}, v={spec.verify:g}, p={spec.share:g}, u0={spec.token_cost:g}, "
                     f"u1={spec.token_cost_slope:g}, s={spec.acceptance_slope:g}, t={spec.draft_cpu_s:g} s)"),
        source=base.source,
        licence=base.licence,
        extension="exact: derived from the base curve at every batch size (docs/speculative.md)",
    )


def iteration_s(tau: NDArray[np.float64], b: NDArray[np.int64], spec: SpecConfig) -> NDArray[np.float64]:
    """Seconds of one verification iteration with b running requests (every b of the array), τ table `tau`:
    verify(b) = τ(b) + v·(τ(b(1 + p·d)) − τ(b)) + p·d·(u0 + u1·log2 b)·τ(b), plus draft(b) by the drafter, plus
    b·t of CPU drafting (t = `draft_cpu_s`, a suffix tree's lookups run serially on the CPU each iteration)."""
    d, c, v = spec.depth, spec.cost, spec.verify
    cpu = spec.draft_cpu_s * b
    tau_b, tau_x = verify_points(tau, b, spec.verified_per_request)
    verify = tau_x if v == 1.0 else tau_b + v * (tau_x - tau_b)
    if spec.token_cost or spec.token_cost_slope:
        verify = verify + spec.share * d * (spec.token_cost + spec.token_cost_slope * np.log2(b)) * tau_b
    drafter = spec.defaults.drafter
    if drafter is Drafter.AUTOREGRESSIVE:
        return np.asarray(verify + c * d * tau_b + cpu, dtype=np.float64)
    if drafter is Drafter.PARALLEL:
        return np.asarray(verify * (1.0 + c) + cpu, dtype=np.float64)
    return np.asarray(verify + c * tau_b + cpu, dtype=np.float64)


def method_names() -> str:
    """The speculative methods, comma-separated (for error messages)."""
    return ", ".join(m.value for m in SpecMethod)
