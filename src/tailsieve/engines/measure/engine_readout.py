"""What a live server says about its engine (issue 48, item 3): KV capacity in tokens, block size, the per-iteration
token budget and whether prefix caching is on, read from the server and never assumed; and the counters of
preemptions and prefix-cache hits on /metrics, whose deltas around a step say what the engine really did.

Sources, each optional (a missing one leaves its keys unknown, `None`):
- vLLM `/metrics` `vllm:cache_config_info` (an info gauge whose labels are the CacheConfig): `num_gpu_blocks`,
  `block_size` (kv_tokens = blocks × block size, or `kv_cache_size_tokens`), `enable_prefix_caching`;
- vLLM `/server_info?config_format=json` (only with `VLLM_SERVER_DEV_MODE=1`, as `tailsieve launch` starts replicas
  that reload weights): `scheduler_config.max_num_batched_tokens` and the same cache keys;
- SGLang `/get_server_info` (`/server_info` on newer builds): `max_total_num_tokens` (top level or in
  `internal_states[0]`), `page_size`, `chunked_prefill_size` (its per-iteration prefill budget), `disable_radix_cache`.

Counters (`EngineCounters`): vLLM `vllm:num_preemptions_total`, `vllm:prefix_cache_hits_total`,
`vllm:prefix_cache_queries_total`, `vllm:generation_tokens_total`; SGLang `sglang:num_retracted_reqs_total`
(`sglang:num_retracted_reqs` on older builds), `sglang:cached_tokens_total`, `sglang:prompt_tokens_total`,
`sglang:generation_tokens_total`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tailsieve.engines.measure.profile import measure_batch
from tailsieve.engines.transport.engine_client import Endpoint, EngineClient, parse_metrics
from tailsieve.engines.transport.replies import loads
from tailsieve.engines.transport.reply_bounds import read_body
from tailsieve.model.engine import EngineTruth, FleetSpeed

MAX_KV_TOKENS = 10**12  # anything larger (or not a positive integer) is not a reading
ENGINE_KEYS = ("kv_tokens", "block_size", "max_num_batched_tokens", "prefix_caching")  # what a server can report


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """A server's engine as it reports it; `None`: the server did not say. `sources` names where each key came
    from (`key=source`), for the model file's provenance."""

    kv_tokens: int | None = None
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    prefix_caching: bool | None = None
    sources: tuple[tuple[str, str], ...] = ()

    def filled(self, other: EngineConfig) -> EngineConfig:
        """This reading with the keys it lacks taken from `other` (and their sources)."""
        new: dict[str, Any] = {}
        src = dict(self.sources)
        theirs = dict(other.sources)
        for k in ENGINE_KEYS:
            if getattr(self, k) is None and getattr(other, k) is not None:
                new[k] = getattr(other, k)
                src[k] = theirs.get(k, "")
        return replace(self, **new, sources=tuple(src.items()))

    def to_json(self) -> dict[str, Any]:
        """The reading as JSON (`kv_tokens`, `block_size`, `max_num_batched_tokens`, `prefix_caching`; null: not
        reported), as `profile` records each replica's in the model file's `engine_readout`."""
        return {k: getattr(self, k) for k in ENGINE_KEYS}

    def truth(self, speed_factors: Sequence[float] = ()) -> EngineTruth:
        """The model's engine (`model.engine.EngineTruth`, the `cost_model` keys): unknown capacity and budget stay
        off, an unreported block size is the default, unreported prefix caching is off; `speed_factors` as measured."""
        return EngineTruth(self.kv_tokens, self.block_size or EngineTruth().block_size, self.max_num_batched_tokens,
                           bool(self.prefix_caching), FleetSpeed(tuple(float(x) for x in speed_factors)))

    @property
    def known(self) -> bool:
        """Whether the server said anything at all."""
        return any(getattr(self, k) is not None for k in ENGINE_KEYS)


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """Cumulative engine counters of one server (tokens and events since it started)."""

    preemptions: float = 0.0
    prefix_hit_tokens: float = 0.0
    prefix_query_tokens: float = 0.0
    generation_tokens: float = 0.0

    def since(self, earlier: EngineCounters) -> EngineCounters:
        """The counts between `earlier` and this reading (a counter that went back, a restarted server, counts from
        0: the reading itself)."""
        return EngineCounters(**{f.name: _delta(getattr(self, f.name), getattr(earlier, f.name))
                                 for f in fields(self)})

    def __add__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


def _delta(now: float, before: float) -> float:
    return now - before if now >= before else now


def _int(v: Any) -> int | None:
    """A positive integer reading (ints, integral floats, digit strings), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str):
        v = v.strip()
        if not v.isdigit():
            return None
        v = int(v)
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    return v if isinstance(v, int) and 0 < v <= MAX_KV_TOKENS else None


def _bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    return None


def info_labels(text: str, name: str) -> dict[str, str] | None:
    """The labels of the first sample of info gauge `name` in a Prometheus exposition (None when absent or the text
    does not parse)."""
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name:
                    return dict(s.labels)
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    return None


def from_vllm_cache_info(labels: Mapping[str, str]) -> EngineConfig:
    """`vllm:cache_config_info` labels → kv_tokens (num_gpu_blocks × block_size, else kv_cache_size_tokens), block_size,
    prefix_caching."""
    blocks, bs = _int(labels.get("num_gpu_blocks")), _int(labels.get("block_size"))
    kv = blocks * bs if blocks is not None and bs is not None else _int(labels.get("kv_cache_size_tokens"))
    src = "/metrics vllm:cache_config_info"
    cfg = EngineConfig(kv, bs, None, _bool(labels.get("enable_prefix_caching")))
    return replace(cfg, sources=tuple((k, src) for k in ENGINE_KEYS if getattr(cfg, k) is not None))


def from_vllm_server_info(doc: Any) -> EngineConfig:
    """vLLM `/server_info?config_format=json` → the scheduler's max_num_batched_tokens and the cache keys."""
    vc = doc.get("vllm_config") if isinstance(doc, dict) else None
    if not isinstance(vc, dict):
        return EngineConfig()
    sc, cc = vc.get("scheduler_config") or {}, vc.get("cache_config") or {}
    sc, cc = (sc if isinstance(sc, dict) else {}), (cc if isinstance(cc, dict) else {})
    blocks, bs = _int(cc.get("num_gpu_blocks")), _int(cc.get("block_size"))
    cfg = EngineConfig(blocks * bs if blocks is not None and bs is not None else None, bs,
                       _int(sc.get("max_num_batched_tokens")), _bool(cc.get("enable_prefix_caching")))
    return replace(cfg, sources=tuple((k, "/server_info") for k in ENGINE_KEYS if getattr(cfg, k) is not None))


def from_sglang_server_info(doc: Any) -> EngineConfig:
    """SGLang `/get_server_info` → max_total_num_tokens, page_size, chunked_prefill_size, not disable_radix_cache."""
    if not isinstance(doc, dict):
        return EngineConfig()
    states = doc.get("internal_states")
    inner = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    kv = _int(doc.get("max_total_num_tokens")) or _int(inner.get("max_total_num_tokens"))
    radix = _bool(doc.get("disable_radix_cache"))
    cfg = EngineConfig(kv, _int(doc.get("page_size")), _int(doc.get("chunked_prefill_size")),
                       None if radix is None else not radix)
    return replace(cfg, sources=tuple((k, "/get_server_info") for k in ENGINE_KEYS if getattr(cfg, k) is not None))


def counters_from_metrics(samples: Mapping[str, float]) -> EngineCounters | None:
    """The engine counters from summed /metrics samples (`parse_metrics`); None when the server exposes none."""
    def first(*names: str) -> float | None:
        return next((float(samples[n]) for n in names if n in samples), None)

    vals = (first("vllm:num_preemptions_total", "sglang:num_retracted_reqs_total", "sglang:num_retracted_reqs"),
            first("vllm:prefix_cache_hits_total", "sglang:cached_tokens_total"),
            first("vllm:prefix_cache_queries_total", "sglang:prompt_tokens_total"),
            first("vllm:generation_tokens_total", "sglang:generation_tokens_total"))
    if all(v is None for v in vals):
        return None
    return EngineCounters(*(0.0 if v is None else v for v in vals))


async def _get(client: EngineClient, endpoint: Endpoint, path: str) -> bytes | None:
    """The body of a GET (None on any failure: every source is optional)."""
    try:
        async with client.session.get(endpoint.target(path), timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status >= 400:
                return None
            return await read_body(r, path.split("?")[0])
    except Exception:  # an optional source: absent, refused, malformed
        return None


async def _json(client: EngineClient, endpoint: Endpoint, path: str) -> Any:
    body = await _get(client, endpoint, path)
    if body is None:
        return None
    try:
        return loads(body)
    except Exception:  # not JSON: the source says nothing
        return None


async def read_engine_config(client: EngineClient, endpoint: Endpoint) -> EngineConfig:
    """Everything the server reports of its KV cache and scheduler (module docstring); unknown keys stay None."""
    got = EngineConfig()
    text = await _get(client, endpoint, "/metrics")
    if text is not None:
        labels = info_labels(text.decode("utf-8", "replace"), "vllm:cache_config_info")
        if labels is not None:
            got = got.filled(from_vllm_cache_info(labels))
    if got.max_num_batched_tokens is None or got.kv_tokens is None:
        got = got.filled(from_vllm_server_info(await _json(client, endpoint, "/server_info?config_format=json")))
    if got.kv_tokens is None or got.max_num_batched_tokens is None:
        for path in ("/get_server_info", "/server_info"):
            got = got.filled(from_sglang_server_info(await _json(client, endpoint, path)))
            if got.kv_tokens is not None:
                break
    return got


async def read_engine_counters(client: EngineClient, endpoint: Endpoint) -> EngineCounters | None:
    """Preemptions, prefix-cache hit and query tokens, generated tokens so far (None: no such counters, or no
    /metrics)."""
    body = await _get(client, endpoint, "/metrics")
    if body is None:
        return None
    try:
        return counters_from_metrics(parse_metrics(body.decode("utf-8", "replace")))
    except Exception:  # a malformed exposition says nothing
        return None


SPEED_PROBE = (8, 32)  # the speed probe: concurrent requests, tokens each


async def probe_tpot(client: EngineClient, endpoints: Sequence[Endpoint], model: str, *, rounds: int = 2
                     ) -> tuple[float, ...]:
    """Each replica's realized decode time per token (ms) at one point, `SPEED_PROBE` (`profile.measure_batch`:
    the median over the batch's requests), measured one replica at a time, `rounds` times in turn, the median."""
    batch, tokens = SPEED_PROBE
    times: list[list[float]] = [[] for _ in endpoints]
    for _ in range(rounds):
        for i, e in enumerate(endpoints):
            times[i].append((await measure_batch(client, e, e.model or model, batch, tokens)).tpot_ms)
    return tuple(statistics.median(t) for t in times)


def speeds_from_probe(reference_ms: float, probe_ms: Sequence[float]) -> tuple[float, ...]:
    """Speed factors (`model.engine.FleetSpeed`: 1.0 = the reference, 0.9 = iterations take 1/0.9 as long) from
    probe times against the reference replica's probe time."""
    return tuple(round(reference_ms / m, 4) if m > 0 else 1.0 for m in probe_ms)


def readout_json(fleet: Sequence[Endpoint], readouts: Sequence[EngineConfig], speeds: tuple[float, ...] | None,
                 probe: tuple[float, ...] | None) -> dict[str, Any]:
    """The model file's `engine_readout` (docs/profile.md): every replica's own reading (null where it does not say),
    speed factor and speed-probe time, and where each of the profiled replica's keys came from."""
    none = [None] * len(fleet)
    return {"sources": dict(readouts[0].sources), "speed_probe": {"batch": SPEED_PROBE[0], "tokens": SPEED_PROBE[1]},
            "replicas": [{"endpoint": e.url} | r.to_json() | {"speed_factor": s, "probe_tpot_ms": t}
                         for e, r, s, t in zip(fleet, readouts, speeds or none, probe or none, strict=True)]}


__all__ = [
    "ENGINE_KEYS",
    "SPEED_PROBE",
    "EngineConfig",
    "EngineCounters",
    "counters_from_metrics",
    "from_sglang_server_info",
    "from_vllm_cache_info",
    "from_vllm_server_info",
    "info_labels",
    "probe_tpot",
    "read_engine_config",
    "read_engine_counters",
    "readout_json",
    "speeds_from_probe",
]
