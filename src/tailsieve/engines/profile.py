"""Measure a live server's TPOT curve τ(b): b concurrent fixed-length requests (`ignore_eos`) per batch size.

τ(b) is the median over the b requests of (latency − time to first token) / (tokens − 1) when streaming (the
decode time per token while b requests decode together); without streaming, latency / tokens. The result is a
`TpotCurve` whose JSON feeds `simulate`, `rollout` and the controller. On a speculative server (vLLM's
`vllm:spec_decode_*` counters on /metrics) each batch also yields its acceptance (`SpecMeasure`, spec_measure.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np

from tailsieve.engines.client import (
    Completion,
    Endpoint,
    EngineClient,
    EngineError,
    FaultKind,
    ReplicaFault,
    Request,
    SamplingParams,
)
from tailsieve.engines.spec_measure import SpecCounters, SpecMeasure, read_counters
from tailsieve.model.curves import TpotCurve

DEFAULT_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
PROFILE_PROMPT = "Count from one to one thousand, one number per line:"
TRANSIENT = frozenset({FaultKind.REFUSED, FaultKind.HTTP_5XX, FaultKind.STALL, FaultKind.DEADLINE,
                       FaultKind.DISCONNECT})  # worth another try; a bad reply or a 4xx is not
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Retry:
    """How `profile` retries transient faults: attempt k waits backoff_s · 2^(k−1), capped at backoff_max_s."""

    retries: int = 4
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0

    def __post_init__(self) -> None:
        if self.retries < 0 or not 0 <= self.backoff_s <= self.backoff_max_s < float("inf"):
            raise EngineError(f"retry policy: need retries >= 0 and 0 <= backoff <= backoff max < inf, got {self}")

    async def run(self, make: Callable[[], Awaitable[T]], what: str) -> T:
        """`await make()`, again after a transient `ReplicaFault`; the last fault ends it as a one-line error."""
        attempt = 0
        while True:
            try:
                return await make()
            except ReplicaFault as exc:
                if exc.kind not in TRANSIENT or attempt >= self.retries:
                    raise EngineError(f"{what}: {exc} (attempt {attempt + 1} of {self.retries + 1})") from None
            attempt += 1
            await asyncio.sleep(min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1)))


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
    comps = await _all_or_none([
        client.complete(endpoint, model, Request(f"prof-{b}-{i}", PROFILE_PROMPT, seed=seed + i), params)
        for i in range(b)])
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


async def _all_or_none(coros: list[Awaitable[Completion]]) -> list[Completion]:
    """Every result, or the first failure with the other requests cancelled (no stray load on a retried batch)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def profile_endpoint(
    client: EngineClient, endpoint: Endpoint, *, batches: Sequence[int] = DEFAULT_BATCHES, max_tokens: int = 256,
    model: str | None = None, on_point: Callable[[ProfilePoint], None] | None = None, temperature: float = 1.0,
    retry: Retry | None = None,
) -> tuple[TpotCurve, list[ProfilePoint]]:
    """Warm up, then measure every batch size in increasing order; returns the curve and the raw points. A batch
    that meets a transient fault (5xx, refused, stall, dropped connection) is measured again (`retry`)."""
    if max_tokens < 2:
        raise EngineError(f"--max-tokens must be >= 2 to separate decode from prefill, got {max_tokens}")
    retry = retry or Retry()
    if model is None:
        names = await retry.run(lambda: client.models(endpoint), "/v1/models")
        if not names:
            raise EngineError(f"{endpoint.url} serves no model")
        model = names[0]
    name = model
    await retry.run(lambda: measure_batch(client, endpoint, name, 1, min(max_tokens, 16), temperature=temperature),
                    "warm-up")
    points: list[ProfilePoint] = []
    for b in batches:
        pt = await retry.run(partial(measure_batch, client, endpoint, name, b, max_tokens, temperature=temperature),
                             f"batch {b}")
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


__all__ = ["DEFAULT_BATCHES", "PROFILE_PROMPT", "TRANSIENT", "ProfilePoint", "Retry", "SpecCounters", "SpecMeasure",
           "measure_batch", "parse_batches", "profile_endpoint", "total_spec"]
