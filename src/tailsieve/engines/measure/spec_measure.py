"""Acceptance of a speculative server from its `/metrics` counters, and the model constants it implies.

The counter names are the engine kind's (`ServerHalf.spec_counters`, engines/kinds/); a kind without draft counters
(SGLang) yields no reading, and an endpoint of a client-only kind (`openai`) is read with vLLM's names. vLLM counts
`vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`, `..._num_accepted_tokens_total` and
`..._num_accepted_tokens_per_pos_total{position=k}` (k = 0..d−1), beside `vllm:generation_tokens_total`.
Every verification iteration of a request yields one target token plus its accepted drafts, so over a window

    iterations = generated − accepted,     ā = generated / iterations,     P(≥ k accepted) = accepted_at_k / iterations

counting iterations without a draft (n-gram lookup finds no match) as drafting nothing. `fit()` gives the
speculative model's α and γ (docs/speculative.md) by least squares on log P(≥ k | drafted) = k·log α +
k(k−1)/2·log γ, with P(≥ k | drafted) = accepted_at_k / drafts; `draft_share` = drafts / iterations is its p.
`fit_costs` adds the cost constants c and v from the measured τ_spec(b) against a profile of the plain server;
`concurrency_points` turns the batches into the input of `model.spec_fit.fit_concurrency_terms` (α and ā per b).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from tailsieve.engines.kinds import KINDS, SpecCounterNames
from tailsieve.engines.kinds.vllm import VLLM_COUNTERS
from tailsieve.engines.transport.engine_client import Endpoint, EngineClient
from tailsieve.engines.transport.replies import ReplyError
from tailsieve.engines.transport.reply_bounds import read_body
from tailsieve.model.curves import TpotCurve
from tailsieve.model.spec_fit import SpecPoint
from tailsieve.model.speculative import Drafter, verify_points

DRAFTS, DRAFT_TOKENS, ACCEPTED = VLLM_COUNTERS.drafts, VLLM_COUNTERS.draft_tokens, VLLM_COUNTERS.accepted
PER_POS, GENERATED = VLLM_COUNTERS.per_position, VLLM_COUNTERS.generated


def counter_names(endpoint: Endpoint) -> SpecCounterNames | None:
    """The speculative counters of the endpoint's engine kind (vLLM's for a client-only kind; None: it has none)."""
    kind = KINDS.get(str(endpoint.kind))
    return VLLM_COUNTERS if kind is None else kind.server.spec_counters


@dataclass(frozen=True, slots=True)
class SpecCounters:
    """One reading of the counters (summed over engines and label sets)."""

    drafts: float
    draft_tokens: float
    accepted: float
    generated: float
    per_position: tuple[float, ...]

    @classmethod
    def parse(cls, text: str, names: SpecCounterNames = VLLM_COUNTERS) -> SpecCounters | None:
        """From Prometheus text; None when the server exposes no draft counters (no speculation)."""
        sums: dict[str, float] = {}
        pos: dict[int, float] = {}
        try:
            samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
        except (ValueError, TypeError, KeyError, IndexError):
            return None
        for sample in samples:
            if sample.name == names.per_position and str(sample.labels.get("position", "")).isdigit():
                k = int(sample.labels["position"])
                pos[k] = pos.get(k, 0.0) + float(sample.value)
            elif sample.name in (names.drafts, names.draft_tokens, names.accepted, names.generated):
                sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
        if names.drafts not in sums:
            return None
        per = tuple(pos.get(k, 0.0) for k in range(max(pos) + 1)) if pos else ()
        return cls(sums[names.drafts], sums.get(names.draft_tokens, 0.0), sums.get(names.accepted, 0.0),
                   sums.get(names.generated, 0.0), per)


async def read_counters(client: EngineClient, endpoint: Endpoint) -> SpecCounters | None:
    """GET /metrics and parse the speculative counters of the endpoint's kind (None: no speculation, no /metrics,
    or a kind whose /metrics counts no drafts: then nothing is asked)."""
    names = counter_names(endpoint)
    if names is None:
        return None
    try:
        async with client.session.get(endpoint.target("/metrics"), timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                return None
            return SpecCounters.parse((await read_body(r, "/metrics")).decode("utf-8", "replace"), names)
    except (aiohttp.ClientError, OSError, TimeoutError, ReplyError):
        return None


@dataclass(frozen=True, slots=True)
class SpecMeasure:
    """Acceptance over a window: counter deltas and what they imply (see the module docstring)."""

    drafts: float
    draft_tokens: float
    accepted: float
    generated: float
    per_position: tuple[float, ...]  # accepted tokens at draft position k = 1..d

    @classmethod
    def between(cls, before: SpecCounters, after: SpecCounters) -> SpecMeasure:
        """The deltas from `before` to `after`; counters that went down mean the server restarted in between (a
        pool move), so `after` counts from zero."""
        if after.generated < before.generated or after.drafts < before.drafts:
            before = SpecCounters(0.0, 0.0, 0.0, 0.0, ())
        n = max(len(before.per_position), len(after.per_position))
        b = (*before.per_position, *(0.0,) * (n - len(before.per_position)))
        a = (*after.per_position, *(0.0,) * (n - len(after.per_position)))
        return cls(after.drafts - before.drafts, after.draft_tokens - before.draft_tokens,
                   after.accepted - before.accepted, after.generated - before.generated,
                   tuple(x - y for x, y in zip(a, b, strict=True)))

    @classmethod
    def total(cls, parts: Sequence[SpecMeasure]) -> SpecMeasure:
        """Several windows together."""
        n = max((len(p.per_position) for p in parts), default=0)
        per = [sum(p.per_position[k] for p in parts if k < len(p.per_position)) for k in range(n)]
        return cls(sum(p.drafts for p in parts), sum(p.draft_tokens for p in parts), sum(p.accepted for p in parts),
                   sum(p.generated for p in parts), tuple(per))

    @property
    def depth(self) -> int:
        """d: draft positions the server reports."""
        return len(self.per_position)

    @property
    def iterations(self) -> float:
        """Request-iterations in the window (each yields one target token)."""
        return self.generated - self.accepted

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (vLLM's own acceptance rate; NaN without drafts)."""
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else math.nan

    @property
    def draft_share(self) -> float:
        """Share of iterations that carried a draft (below 1 when a lookup method finds no match)."""
        return self.drafts / self.iterations if self.iterations > 0 else math.nan

    @property
    def expected_tokens(self) -> float:
        """ā: tokens per request-iteration, all iterations counted."""
        return self.generated / self.iterations if self.iterations > 0 else math.nan

    def reach(self) -> tuple[float, ...]:
        """P(at least k drafts accepted in an iteration), k = 1..d."""
        it = self.iterations
        return tuple(x / it for x in self.per_position) if it > 0 else ()

    def conditional(self) -> tuple[float, ...]:
        """P(position k accepted | 1..k−1 accepted), k = 1..d (NaN past a position never reached)."""
        r = (1.0, *self.reach())
        return tuple(r[k] / r[k - 1] if r[k - 1] > 0 else math.nan for k in range(1, len(r)))

    def reach_drafted(self) -> tuple[float, ...]:
        """P(at least k drafts accepted | the iteration drafted), k = 1..d."""
        return tuple(x / self.drafts for x in self.per_position) if self.drafts > 0 else ()

    def fit(self) -> tuple[float, float]:
        """(α, γ) of the speculative model given a draft, each in [0, 1] (γ = 1 when d = 1 or nothing past
        position 1); with p = `draft_share`, ā = 1 + p·Σ_k α^k γ^(k(k−1)/2) is the measured `expected_tokens`."""
        r = list(self.reach_drafted())
        k_max = next((i for i, x in enumerate(r) if x <= 0), len(r))
        if k_max == 0:
            return 0.0, 1.0
        if k_max == 1:
            return min(1.0, r[0]), 1.0
        k = np.arange(1, k_max + 1, dtype=np.float64)
        design = np.stack([k, k * (k - 1) / 2], axis=1)
        (la, lg), *_ = np.linalg.lstsq(design, np.log(np.asarray(r[:k_max])), rcond=None)
        return float(min(1.0, math.exp(la))), float(min(1.0, math.exp(lg)))

    def to_json(self) -> dict[str, Any]:
        """Counters and derived figures (NaN → None)."""
        alpha, gamma = self.fit()

        def num(x: float) -> float | None:
            return None if math.isnan(x) else round(x, 6)

        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "generated": self.generated, "iterations": self.iterations,
                "acceptance_rate": num(self.acceptance_rate), "draft_share": num(self.draft_share),
                "expected_tokens": num(self.expected_tokens), "per_position": list(self.per_position),
                "reach": [num(x) for x in self.reach()], "conditional": [num(x) for x in self.conditional()],
                "fit": {"acceptance": round(alpha, 6), "decay": round(gamma, 6), "tokens": self.depth,
                        "draft_share": num(self.draft_share)}}


@dataclass(frozen=True, slots=True)
class CostFit:
    """The cost constants of the speculative model fitted to a profile: c (`draft_cost`), v (`verify_cost`), and
    the root-mean-square relative error of the fitted iteration times."""

    draft_cost: float
    verify_cost: float
    rms_rel_error: float
    points: int

    def to_json(self) -> dict[str, Any]:
        """Rounded constants for the config file."""
        return {"draft_cost": round(self.draft_cost, 4), "verify_cost": round(self.verify_cost, 4),
                "rms_rel_error": round(self.rms_rel_error, 4), "points": self.points}


def fit_costs(points: Sequence[tuple[int, float, SpecMeasure]], plain: TpotCurve, drafter: Drafter,
              depth: int) -> CostFit | None:
    """c and v (docs/speculative.md) from (b, measured τ_spec(b) in ms, counters during that batch) against the
    plain server's curve: each batch's iteration time y = τ_spec·ā is modelled as τ(b) + v·(τ(b(1 + p·d)) − τ(b))
    + draft, with the batch's own ā and p; v on a 0.001 grid over [0, 1], c ≥ 0 by weighted least squares on the
    relative error (None without a usable point)."""
    rows = [(b, t, m) for b, t, m in points if m.iterations > 0 and b >= 1 and t > 0 and math.isfinite(t)]
    if not rows or depth < 1:
        return None
    n = max(b for b, _, _ in rows)
    tau = plain.table(n * (depth + 1) + 1)
    b = np.asarray([r[0] for r in rows])
    share = np.asarray([r[2].draft_share for r in rows])
    y = np.asarray([r[1] / 1e3 * r[2].expected_tokens for r in rows])
    tau_b, tau_x = verify_points(tau, b, 1 + share * depth)
    delta = tau_x - tau_b
    v = np.linspace(0.0, 1.0, 1001)[:, None]
    verify = tau_b + v * delta  # one row per v on the grid
    w = 1.0 / y**2
    rest = y - verify
    if drafter is Drafter.PARALLEL:  # y = (1 + c)·verify
        basis = verify
    else:  # y = verify + c·d·τ(b) (autoregressive) or verify + c·τ(b) (lookup)
        basis = np.broadcast_to(tau_b * (depth if drafter is Drafter.AUTOREGRESSIVE else 1), verify.shape)
    c = np.clip((w * rest * basis).sum(axis=1) / np.maximum((w * basis**2).sum(axis=1), 1e-300), 0.0, None)
    err = (w * (rest - c[:, None] * basis) ** 2).sum(axis=1)
    i = int(np.argmin(err))
    return CostFit(float(c[i]), float(v[i, 0]), math.sqrt(float(err[i]) / len(rows)), len(rows))


def concurrency_points(rows: Sequence[tuple[int, float, SpecMeasure]]) -> tuple[list[SpecPoint], float, float]:
    """(b, measured τ_spec(b) in ms, counters during that batch) → one `SpecPoint` per batch that drafted (its α from
    `SpecMeasure.fit`, its measured ā), and the decay γ and draft share p over them, weighted by iterations."""
    used = [(b, t, m) for b, t, m in rows if m.drafts > 0 and m.iterations > 0]
    points = [SpecPoint(b, t, m.fit()[0], m.expected_tokens) for b, t, m in used]
    weight = sum(m.iterations for _, _, m in used)
    if weight <= 0:
        return points, 1.0, 1.0
    gamma = sum(m.iterations * m.fit()[1] for _, _, m in used) / weight
    share = sum(m.drafts for _, _, m in used) / weight
    return points, min(1.0, gamma), min(1.0, share)
