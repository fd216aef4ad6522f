"""Measure a live server's TPOT curve τ(b): b concurrent fixed-length requests (`ignore_eos`) per batch size.

τ(b) is the median over the b requests of (latency − time to first token) / (tokens − 1) when streaming (the
decode time per token while b requests decode together); without streaming, latency / tokens. The result is a
`TpotCurve` whose JSON feeds `simulate`, `rollout` and the controller. On a speculative server (vLLM's
`vllm:spec_decode_*` counters on /metrics) each batch also yields its acceptance (`SpecMeasure`, spec_measure.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tailsieve.engines.client import Endpoint, EngineClient, EngineError, Request, SamplingParams
from tailsieve.engines.spec_measure import SpecCounters, SpecMeasure, read_counters
from tailsieve.model.curves import TpotCurve

DEFAULT_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
PROFILE_PROMPT = "Count from one to one thousand, one number per line:"


@dataclass(frozen=True, slots=True)
class ProfilePoint:
    """One batch size's measurement."""

    batch: int
    tpot_ms: float
    tpot_ms_p90: float
    ttft_ms: float
    step_s: float  # wall time of the whole batch
    tokens_per_s: float  # aggregate decode throughput
    spec: SpecMeasure | None = None  # acceptance during this batch (speculative servers only)


def parse_batches(text: str) -> tuple[int, ...]:
    """`1,2,4,8` → sorted unique positive sizes (one-line error otherwise)."""
    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise EngineError(f"--batches: expected comma-separated integers, got {text!r}") from None
    if not vals or vals[0] < 1:
        raise EngineError(f"--batches: need positive batch sizes, got {text!r}")
    return tuple(vals)


async def measure_batch(client: EngineClient, endpoint: Endpoint, model: str, b: int, max_tokens: int,
                        seed: int = 0, temperature: float = 1.0) -> ProfilePoint:
    """Run b concurrent requests of exactly `max_tokens` tokens and summarize their per-token times (and, on a
    speculative server, the acceptance over the batch)."""
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True)
    before = await read_counters(client, endpoint)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    comps = await asyncio.gather(*(
        client.complete(endpoint, model, Request(f"prof-{b}-{i}", PROFILE_PROMPT, seed=seed + i), params)
        for i in range(b)))
    wall = loop.time() - t0
    per: list[float] = []
    ttfts: list[float] = []
    for c in comps:
        toks = c.choices[0].tokens
        if c.ttft_s is not None and toks > 1:
            per.append((c.latency_s - c.ttft_s) / (toks - 1))
            ttfts.append(c.ttft_s)
        else:
            per.append(c.latency_s / max(toks, 1))
    arr = np.asarray(per) * 1e3
    total = sum(c.choices[0].tokens for c in comps)
    after = await read_counters(client, endpoint) if before is not None else None
    spec = SpecMeasure.between(before, after) if before is not None and after is not None else None
    return ProfilePoint(b, float(np.median(arr)), float(np.percentile(arr, 90)),
                        float(np.median(ttfts) * 1e3) if ttfts else float("nan"), wall, total / wall, spec)


async def profile_endpoint(
    client: EngineClient, endpoint: Endpoint, *, batches: Sequence[int] = DEFAULT_BATCHES, max_tokens: int = 256,
    model: str | None = None, on_point: Callable[[ProfilePoint], None] | None = None, temperature: float = 1.0,
) -> tuple[TpotCurve, list[ProfilePoint]]:
    """Warm up, then measure every batch size in increasing order; returns the curve and the raw points."""
    if max_tokens < 2:
        raise EngineError(f"--max-tokens must be >= 2 to separate decode from prefill, got {max_tokens}")
    if model is None:
        names = await client.models(endpoint)
        if not names:
            raise EngineError(f"{endpoint.url} serves no model")
        model = names[0]
    await measure_batch(client, endpoint, model, 1, min(max_tokens, 16), temperature=temperature)
    points: list[ProfilePoint] = []
    for b in batches:
        pt = await measure_batch(client, endpoint, model, b, max_tokens, temperature=temperature)
        points.append(pt)
        if on_point is not None:
            on_point(pt)
    tpot = [p.tpot_ms for p in points]
    curve = TpotCurve(name=f"profile {endpoint.url}", batch=tuple(p.batch for p in points),
                      tpot_ms=tuple(round(t, 4) for t in tpot),
                      description=f"measured by tailsieve profile: model {model}, {max_tokens} tokens per request",
                      source=endpoint.url)
    return curve, points


def total_spec(points: Sequence[ProfilePoint]) -> SpecMeasure | None:
    """Acceptance over every measured batch together (None when the server does not speculate)."""
    parts = [p.spec for p in points if p.spec is not None]
    return SpecMeasure.total(parts) if parts else None


__all__ = ["DEFAULT_BATCHES", "PROFILE_PROMPT", "ProfilePoint", "SpecCounters", "SpecMeasure", "measure_batch",
           "parse_batches", "profile_endpoint", "total_spec"]
