"""`TailSieveLLMServerClient`: verl's `LLMServerClient` whose server acquisition follows the TailSieve plan.

verl's client acquires a server per request from its `GlobalRequestLoadBalancer` (least in-flight; no groups, no
pools). Here the router has already chosen the pool and the replica of every member (`StepSession.begin`): the
choice travels with the prompt as its route (`session.ROUTE_FIELD`), the agent loop sets it for the request
(`session.routed`), and `_acquire_server` returns that replica's handle. The vLLM request id is the stable
TailSieve id (`ts-{step}-{uid}-{member}-{attempt}`, not a fresh uuid), so `abort()` can cancel exactly the
leftovers at the cutoff. Requests without a route (validation, other agent loops) keep verl's load balancer, or
the least-loaded own server when there is none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from verl.workers.rollout.llm_server import LLMServerClient

from tailsieve.errors import ConfigError
from tailsieve.integrations.verl.session import current_route, parse_request_id


class TailSieveLLMServerClient(LLMServerClient):  # type: ignore[misc]  # verl ships no type information
    """`LLMServerClient(config, load_balancer_handle=None, servers=[(server_id, handle), ...])`; `servers` in
    replica order (replica i of the plan is `servers[i]`, verl: `LLMServerManager.server_addresses/handles`)."""

    def __init__(self, config: Any, load_balancer_handle: Any = None,
                 servers: Sequence[tuple[str, Any]] | None = None, **kwargs: Any) -> None:
        super().__init__(config=config, load_balancer_handle=load_balancer_handle, **kwargs)
        if not servers:
            raise ConfigError("TailSieveLLMServerClient needs servers=[(server_id, handle), ...] in replica order")
        self.servers = list(servers)
        self.inflight = [0] * len(self.servers)
        self._index = {sid: i for i, (sid, _) in enumerate(self.servers)}
        self._by_request: dict[str, int] = {}  # TailSieve request id → replica, while in flight

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        """verl's `generate`, sent as the member's TailSieve request id when the agent loop routed it."""
        route = current_route()
        return await super().generate(route.request_id if route is not None else request_id, **kwargs)

    async def _acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        """The planned replica for a routed request; otherwise verl's balancer, else the least-loaded server."""
        route = current_route()
        if route is not None and route.request_id == request_id:
            if not 0 <= route.replica < len(self.servers):
                raise ConfigError(f"request {request_id}: planned replica {route.replica} but the client has "
                                  f"{len(self.servers)} servers (TailSieve's replica count must match verl's)")
            i = route.replica
            self._by_request[request_id] = i
        elif self._load_balancer is not None:
            sid, handle = await super()._acquire_server(request_id, **extra)
            return sid, handle
        else:
            i = min(range(len(self.servers)), key=self.inflight.__getitem__)
        self.inflight[i] += 1
        return self.servers[i]

    def _release_server(self, server_id: str, request_id: str | None = None) -> None:
        i = self._index.get(server_id)
        routed = request_id is not None and self._by_request.pop(request_id, None) is not None
        if i is not None and (routed or self._load_balancer is None):
            self.inflight[i] -= 1
        elif self._load_balancer is not None:
            super()._release_server(server_id, request_id=request_id)

    def _vllm_request_id(self, request_id: str) -> str:
        """The TailSieve id itself (stable and abortable); verl's default (a fresh uuid) for other requests."""
        return request_id if parse_request_id(request_id) is not None else str(super()._vllm_request_id(request_id))

    async def abort(self, request_ids: Iterable[str], replicas: dict[str, int] | None = None) -> int:
        """Abort these TailSieve requests on their servers (all servers when the replica is not known); returns
        how many a server reported aborted."""
        calls = []
        for rid in request_ids:
            i = (replicas or {}).get(rid, self._by_request.get(rid))
            targets = [self.servers[i]] if i is not None else self.servers
            calls += [handle.abort_request.remote(rid) for _, handle in targets]
        replies = await asyncio.gather(*calls, return_exceptions=True)
        return sum(1 for r in replies if isinstance(r, dict) and r.get("aborted"))
