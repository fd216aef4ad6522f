"""`TailSieveLLMServerClient`: verl's `LLMServerClient` whose server acquisition follows the TailSieve plan.

verl's client acquires a server per request from its `GlobalRequestLoadBalancer` (least in-flight; no groups, no
pools). Here the router has already chosen the pool and the replica of every member (`StepSession.begin`): the
choice travels with the prompt as its route (`session.ROUTE_FIELD`), the agent loop sets it for the request
(`session.routed`), and `_acquire_server` returns that replica's handle. The vLLM request id is the stable
TailSieve id (`ts-{step}-{uid}-{member}-{attempt}`, not a fresh uuid), so `abort()` can cancel exactly the
leftovers at the cutoff. A member of a group already cut (`cut()` in this process, or the group's key tagged
`session.CUT_TAG` or gone in TransferQueue, which reaches the client's copies in verl's agent-loop workers) is
never sent: `generate` returns an aborted output at once. Requests without a route (validation, other agent loops)
keep verl's load balancer, or the least-loaded own server when there is none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import transfer_queue as tq
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from tailsieve.errors import ConfigError
from tailsieve.integrations.verl.session import CUT_TAG, current_route, group_key, parse_request_id


class TailSieveLLMServerClient(LLMServerClient):  # type: ignore[misc]  # verl ships no type information
    """`LLMServerClient(config, load_balancer_handle=None, servers=[(server_id, handle), ...])`; `servers` in
    replica order (replica i of the plan is `servers[i]`, verl: `LLMServerManager.server_addresses/handles`);
    `tq_partition`: the TransferQueue partition whose tags say which groups are cut (None: `cut()` only)."""

    def __init__(self, config: Any, load_balancer_handle: Any = None,
                 servers: Sequence[tuple[str, Any]] | None = None, tq_partition: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(config=config, load_balancer_handle=load_balancer_handle, **kwargs)
        if not servers:
            raise ConfigError("TailSieveLLMServerClient needs servers=[(server_id, handle), ...] in replica order")
        self.servers = list(servers)
        self.inflight = [0] * len(self.servers)
        self._index = {sid: i for i, (sid, _) in enumerate(self.servers)}
        self._by_request: dict[str, int] = {}  # TailSieve request id → replica, while in flight
        self.tq_partition = tq_partition
        self.cut_keys: set[str] = set()  # group keys cut in this process
        self.unsent: list[str] = []  # request ids of cut members answered here, never sent to a server

    def cut(self, keys: Iterable[str]) -> None:
        """These groups are cut: their members not yet sent are never sent (this process)."""
        self.cut_keys.update(keys)

    async def is_cut(self, request_id: str) -> bool:
        """Whether the group of this TailSieve request is cut: here, or tagged/gone in TransferQueue."""
        key = group_key(request_id)
        if key is None:
            return False
        if key in self.cut_keys:
            return True
        if self.tq_partition is None:
            return False
        listing = await tq.async_kv_list(self.tq_partition) or {}
        tag = listing.get(self.tq_partition, {}).get(key)
        return tag is None or bool(tag.get(CUT_TAG))

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        """verl's `generate`, sent as the member's TailSieve request id when the agent loop routed it; a member
        of a cut group gets an aborted, empty output without reaching a server."""
        route = current_route()
        if route is None:
            return await super().generate(request_id, **kwargs)
        if await self.is_cut(route.request_id):
            self.unsent.append(route.request_id)
            return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted",
                               extra_fields={"request_id": route.request_id, CUT_TAG: True})
        return await super().generate(route.request_id, **kwargs)

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
        how many a server reported aborted. The weights did not change, so the servers keep their prefix caches
        (`reset_prefix_cache=False`; verl's servers reset them by default)."""
        calls = []
        for rid in request_ids:
            i = (replicas or {}).get(rid, self._by_request.get(rid))
            targets = [self.servers[i]] if i is not None else self.servers
            calls += [handle.abort_request.remote(rid, reset_prefix_cache=False) for _, handle in targets]
        replies = await asyncio.gather(*calls, return_exceptions=True)
        return sum(1 for r in replies if isinstance(r, dict) and r.get("aborted"))
