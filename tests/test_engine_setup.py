"""`EngineSetup` (engines/rollout/engine_setup.py) on fake OpenAI-compatible servers (real HTTP, tests/engine_fake.py):
endpoints parsed and checked, the client the config describes, open (health, the served model: the config's, the
endpoint's, else /v1/models; the executor from the caller's hook), the pool hook with the re-probe of replicas down,
and close. The same through `Rollout`: tests/test_engine_rollout.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest

from engine_fake import FakeServer
from tailsieve.engines.rollout.engine_executor import EngineExecutor
from tailsieve.engines.rollout.engine_setup import EngineSetup, make_client, parse_endpoints
from tailsieve.engines.rollout.rollout_config import RolloutConfig
from tailsieve.engines.transport.engine_client import Endpoint, NoHealthyReplica, SamplingParams
from tailsieve.engines.transport.health import FaultPolicy, Replicas
from tailsieve.engines.transport.types import Api, FaultKind
from tailsieve.errors import ConfigError
from tailsieve.policy.step import StepPlan
from tailsieve.policy.stream import StreamState

CFG = RolloutConfig(groups=2, group_size=2, rho=0.5, policy="static", q=1, m=1, sampling=SamplingParams(max_tokens=8))
PLAN = StepPlan(3, (), (), {}, (1,), (0,), 0, False, StreamState(0, False, 0, 1), ())


@pytest.fixture
def two() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b:
        yield [a, b]


def test_endpoints_are_parsed_once_and_none_is_refused() -> None:
    eps = parse_endpoints(["http://127.0.0.1:9/v1", Endpoint("http://127.0.0.1:10", model="m")])
    assert [(e.url, e.model) for e in eps] == [("http://127.0.0.1:9", None), ("http://127.0.0.1:10", "m")]
    with pytest.raises(ConfigError, match="^no endpoints given$"):
        parse_endpoints([])


def test_the_client_takes_the_configs_transport_options() -> None:
    cfg = replace(CFG, api=Api.CHAT, stream=False, logprobs=True, api_key_env=None,
                  faults=FaultPolicy(connect_timeout_s=1.5, stall_timeout_s=7.0, deadline_s=30.0))
    o = make_client(cfg).options
    assert (o.api, o.stream, o.logprobs, o.api_key_env) == (Api.CHAT, False, True, None)
    assert (o.connect_timeout_s, o.stall_timeout_s, o.deadline_s) == (1.5, 7.0, 30.0)


def build(replicas: Replicas, model: str) -> EngineExecutor:
    return EngineExecutor(replicas, model, SamplingParams(max_tokens=8), 2)


def test_open_resolves_the_served_model_and_builds_the_executor_through_the_hook(two: list[FakeServer]) -> None:
    async def go(cfg: RolloutConfig, eps: list[Endpoint]) -> tuple[str, bool]:
        setup = EngineSetup(eps, cfg)
        replicas, ex = await setup.open(build)
        try:
            return ex.model, replicas is setup.replicas is ex.replicas and setup.executor is ex
        finally:
            await setup.close()

    eps = [Endpoint(s.url) for s in two]
    assert asyncio.run(go(CFG, eps)) == ("fake", True)  # asked: /v1/models
    assert asyncio.run(go(CFG, [Endpoint(two[0].url, model="mine"), eps[1]])) == ("mine", True)
    assert asyncio.run(go(replace(CFG, model="cfg-name"), eps)) == ("cfg-name", True)


def test_a_fleet_without_a_healthy_endpoint_is_refused_and_closed(two: list[FakeServer]) -> None:
    for s in two:
        s.mode = "500"  # /health answers 500
    setup = EngineSetup([Endpoint(s.url) for s in two], CFG)

    async def go() -> None:
        await setup.open(build)

    with pytest.raises(NoHealthyReplica, match="no endpoint answers /health"):
        asyncio.run(go())
    assert setup.executor is None and setup.client._session is None  # closed again


def test_the_pool_hook_runs_off_the_loop_and_replicas_down_are_probed_again(two: list[FakeServer]) -> None:
    seen: list[tuple[int, bool]] = []

    def hook(plan: StepPlan) -> float:
        seen.append((plan.step, threading.current_thread() is threading.main_thread()))
        return 2.5

    async def go() -> tuple[float, float, tuple[int, ...], tuple[int, ...]]:
        setup = EngineSetup([Endpoint(s.url) for s in two], CFG)
        replicas, _ = await setup.open(build)
        try:
            replicas.mark_down(1, FaultKind.DISCONNECT, "test")
            down = setup.down()
            spent = await setup.pool_move(PLAN, hook)  # replica 1 answers /health again: up for this step
            return spent, await setup.pool_move(PLAN, None), down, setup.down()
        finally:
            await setup.close()

    assert asyncio.run(go()) == (2.5, 0.0, (1,), ())
    assert seen == [(3, False)]
    assert EngineSetup([Endpoint(two[0].url)], CFG).down() == ()
