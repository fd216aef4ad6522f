"""Against a REAL vLLM CPU server started with a small KV cache (64 blocks of 32 tokens), prefix caching and a
512-token iteration budget: `read_engine_config` reads exactly those, the /metrics counters see the preemptions and
prefix hits a memory-bound batch causes, and `tailsieve profile` writes the engine keys and skips the batches the
cache cannot hold."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailsieve.cli import main
from tailsieve.engines.launch import LocalLauncher
from tailsieve.engines.launch.tiny_vllm import tiny_launch_config
from tailsieve.engines.measure.engine_readout import EngineCounters, read_engine_config, read_engine_counters
from tailsieve.engines.transport.engine_client import Endpoint, EngineClient, Request, SamplingParams
from tailsieve.model.costmodel import load_cost_model
from tailsieve.model.engine import EngineTruth
from vllm_fixtures import requires_vllm, tiny_model  # noqa: F401

pytestmark = [pytest.mark.real_server, pytest.mark.slow, requires_vllm, pytest.mark.timeout(600)]

ENGINE = ("--dtype", "bfloat16", "--max-model-len", "1024", "--max-num-seqs", "256", "--num-gpu-blocks-override",
          "64", "--block-size", "32", "--enable-prefix-caching", "--max-num-batched-tokens", "512")


@pytest.fixture(scope="module")
def small_kv(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    """One replica with a 2048-token KV cache, its dev endpoints on (/server_info)."""
    cfg = tiny_launch_config(tiny_model, replicas=1, args=ENGINE,
                             env=(("VLLM_LOGGING_LEVEL", "WARNING"), ("VLLM_SERVER_DEV_MODE", "1")))
    la = LocalLauncher(cfg, tmp_path_factory.mktemp("vllm-small-kv"))
    try:
        la.start()
        yield la.endpoints[0]
    finally:
        la.stop()


def test_the_server_reports_its_kv_cache_and_budget(small_kv: str) -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with EngineClient() as c:
            return await read_engine_config(c, Endpoint(small_kv))

    cfg = asyncio.run(go())
    assert cfg.to_json() == {"kv_tokens": 64 * 32, "block_size": 32, "max_num_batched_tokens": 512,
                             "prefix_caching": True}
    assert dict(cfg.sources)["max_num_batched_tokens"] == "/server_info"


def test_counters_see_preemptions_and_prefix_hits_of_a_memory_bound_batch(small_kv: str) -> None:
    """24 requests of 160 tokens behind one shared ~100-token prompt need far more than 2048 tokens of KV: vLLM
    preempts, and the 23 later requests find the prompt's full blocks cached."""
    prompt = "the model sums integers and primes then returns the list " * 8
    params = SamplingParams(temperature=1.0, max_tokens=160, ignore_eos=True)

    async def go() -> tuple[EngineCounters, int]:
        e = Endpoint(small_kv)
        async with EngineClient() as c:
            before = await read_engine_counters(c, e)
            comps = await asyncio.gather(*[c.complete(e, "tiny", Request(f"kv-{i}", prompt), params)
                                           for i in range(24)])
            after = await read_engine_counters(c, e)
        assert before is not None and after is not None
        return after.since(before), comps[0].prompt_tokens

    d, prompt_tokens = asyncio.run(go())
    assert d.generation_tokens == 24 * 160
    assert d.preemptions >= 1
    full_blocks = prompt_tokens // 32 * 32
    assert full_blocks >= 64 and d.prefix_hit_tokens >= 23 * full_blocks  # recompute of preempted ones hits too
    assert d.prefix_query_tokens >= 24 * prompt_tokens


def test_profile_writes_the_engine_keys_and_skips_batches_the_cache_cannot_hold(small_kv: str,
                                                                                  tmp_path: Path) -> None:
    out = tmp_path / "model.json"
    assert main(["profile", "--endpoint", small_kv, "--batches", "1,8,32", "--max-tokens", "64", "--contexts", "0",
                 "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["batch"] == [1, 8]  # 32 × 128 tokens would preempt in a 2048-token cache: not measured
    terms = doc["cost_model"]
    assert (terms["kv_tokens"], terms["block_size"], terms["max_num_batched_tokens"], terms["prefix_caching"]) == (
        2048, 32, 512, True)
    assert load_cost_model(str(out)).engine == EngineTruth(2048, 32, 512, True)
    assert "speed_factors" not in terms and doc["engine_readout"]["replicas"][0]["endpoint"] == small_kv
