"""The engines a `Rollout` drives: its endpoints (parsed and checked), the HTTP client its config describes, and once
opened the replicas (every /health asked), the served model's name (the config's, else the first healthy endpoint's,
else the first name a healthy endpoint's /v1/models lists) and the executor the caller's hook builds; before each
step the pool hook (a launcher moving replicas between pools) and a re-probe of the replicas down; closing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from tailsieve.engines.rollout.engine_executor import EngineExecutor
from tailsieve.engines.rollout.rollout_config import RolloutConfig
from tailsieve.engines.transport.engine_client import (
    ClientOptions,
    Endpoint,
    EngineClient,
    EngineError,
    NoHealthyReplica,
    ReplicaFault,
)
from tailsieve.engines.transport.health import Replicas
from tailsieve.errors import ConfigError
from tailsieve.loop import PoolHook
from tailsieve.policy.step import StepPlan

__all__ = ["EngineSetup", "ExecutorHook", "make_client", "parse_endpoints"]

ExecutorHook = Callable[[Replicas, str], EngineExecutor]  # (replicas, served model) → the step's executor


def parse_endpoints(endpoints: Sequence[str | Endpoint]) -> tuple[Endpoint, ...]:
    """The endpoints as `Endpoint`s (a URL string is parsed); ConfigError when there are none."""
    out = tuple(e if isinstance(e, Endpoint) else Endpoint.parse(e) for e in endpoints)
    if not out:
        raise ConfigError("no endpoints given")
    return out


def make_client(config: RolloutConfig) -> EngineClient:
    """The HTTP client a run's config describes (API, streaming, timeouts, API key, logprobs); not yet open."""
    f = config.faults
    return EngineClient(ClientOptions(api=config.api, stream=config.stream, connect_timeout_s=f.connect_timeout_s,
                                      stall_timeout_s=f.stall_timeout_s, api_key_env=config.api_key_env,
                                      logprobs=config.logprobs, deadline_s=f.deadline_s))


class EngineSetup:
    """Endpoints, client, replicas and executor of one run (see the module docstring)."""

    def __init__(self, endpoints: Sequence[Endpoint], config: RolloutConfig) -> None:
        self.endpoints = tuple(endpoints)
        self.config = config
        self.client = make_client(config)
        for e in self.endpoints:
            self.client.check_endpoint(e)
        self.replicas: Replicas | None = None
        self.executor: EngineExecutor | None = None

    async def open(self, build: ExecutorHook) -> tuple[Replicas, EngineExecutor]:
        """Open the HTTP session, health-check every endpoint, resolve the model name and build the executor; all is
        closed again when the model cannot be resolved."""
        self.client.open()
        replicas = self.replicas = Replicas(self.endpoints, self.client, self.config.faults)
        try:
            model = await self.resolve_model(replicas)
        except BaseException:
            await self.close()
            raise
        self.executor = build(replicas, model)
        return replicas, self.executor

    async def resolve_model(self, replicas: Replicas) -> str:
        """The served model: the config's, else the first healthy endpoint's, else asked (`ask_model`)."""
        await replicas.check_all()
        healthy = replicas.healthy()
        if not healthy:
            raise NoHealthyReplica(f"no endpoint answers /health: {', '.join(e.url for e in self.endpoints)}")
        model = self.config.model or self.endpoints[healthy[0]].model
        return model if model is not None else await self.ask_model(replicas, healthy)

    async def ask_model(self, replicas: Replicas, healthy: list[int]) -> str:
        """The first served name that a healthy endpoint's /v1/models lists; an endpoint whose reply is bad (or
        lists nothing) is skipped, and marked down when the fault is the replica's."""
        errors: list[str] = []
        for i in healthy:
            try:
                names = await self.client.models(self.endpoints[i])
            except ReplicaFault as exc:
                replicas.mark_down(i, exc.kind, str(exc))
                errors.append(str(exc))
                continue
            except EngineError as exc:
                errors.append(str(exc))
                continue
            if names:
                return names[0]
            errors.append(f"{self.endpoints[i].url} serves no model")
        raise ConfigError(f"no endpoint names a served model (/v1/models): {'; '.join(errors)}"[:600])

    async def pool_move(self, plan: StepPlan, pools: PoolHook | None) -> float:
        """The pool hook (a launcher moving replicas), off the event loop; its restart seconds. Then, right before
        dispatch, the replicas down are probed again: one back up serves this step, not the next."""
        spent = 0.0 if pools is None else float(await asyncio.to_thread(pools, plan))
        if self.replicas is not None:
            await self.replicas.reprobe_down()
        return spent

    def down(self) -> tuple[int, ...]:
        """Replicas down now (none before `open`)."""
        return () if self.replicas is None else tuple(i for i, u in enumerate(self.replicas.up) if not u)

    async def close(self) -> None:
        """Stop the probes and close the session."""
        if self.replicas is not None:
            await self.replicas.close()
        await self.client.close()
