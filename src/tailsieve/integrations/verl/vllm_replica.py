"""`TailSieveVLLMHttpServer`: verl's vLLM server actor whose `abort_request(request_id)` really stops the request.

verl 0.9.1's `vLLMHttpServer.abort_request` looks the id up in `AsyncLLM.output_processor.request_states`, but vLLM
(>= 0.1x, 0.32 here) keys that table by an INTERNAL id (`{request_id}-{8 random chars}`, `InputProcessor.
assign_request_id`); the id a client sent is only the EXTERNAL id (`output_processor.external_req_ids` maps it to
its internal ids). So verl answers `{'aborted': False, 'error': 'Request ... not found'}` and the request keeps
generating to its end. (Even with the right id verl's call would fail: it calls `output_processor.abort_requests`
without vLLM 0.32's `internal` argument.) This subclass aborts through the engine's own `AsyncLLM.abort(external id)`,
which aborts every internal request the engine holds for it, in the output processor and in the engine core; the
caller's `generate` then returns at once, `stop_reason="aborted"`, with the tokens generated so far.

Two windows verl's server leaves open are closed as `HttpServerHandle` closes them: a request admitted by this
server but not registered in the engine yet (parked behind a weight sync, awaiting LoRA, etc.) has its `generate`
cancelled before it reaches the engine; an abort that arrives before its request leaves a tombstone (the last
`TOMBSTONES` ids are kept), and that request, when it comes, is answered aborted without reaching the engine.

`TailSieveVLLMReplica` is verl's `vLLMReplica` with this server class; `TailSieveTrainer._setup` makes verl's
`LLMServerManager` build it for `actor_rollout_ref.rollout.name=vllm` (`tailsieve_vllm_replicas`), only while the
TailSieve trainer sets up (other trainers keep verl's replica). Importing this module imports vLLM.

verl's `abort_all_requests` (what its weight sync calls before loading new weights) also fails on vLLM 0.32: it
calls `AsyncLLM.pause_generation(wait_for_inflight_requests=False, clear_cache=...)`, and vLLM 0.32 takes
`pause_generation(*, mode="abort" | "wait" | "keep", clear_cache=...)`. `PauseCompat` translates the old keyword
for that one call (verl's gate logic around it runs unchanged).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import ray
from verl.workers.rollout.replica import RolloutReplicaRegistry, TokenOutput
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

TOMBSTONES = 4096  # aborted-before-arrival ids remembered per server (ids are never reused, so old ones can go)


def engine_request_ids(engine: Any, request_id: str) -> tuple[list[str], bool]:
    """The ids `engine` (an `AsyncLLM`) holds for `request_id`, and whether `request_id` is itself an internal id:
    ([internal ids of this external id], False), or ([request_id], True), or ([], False) when it holds none."""
    processor = engine.output_processor
    held = list(getattr(processor, "external_req_ids", {}).get(request_id, ()))
    if held:
        return held, False
    if request_id in processor.request_states:
        return [request_id], True
    return [], False


class PauseCompat:
    """The engine as verl's `abort_all_requests` calls it: `pause_generation(wait_for_inflight_requests=b)` becomes
    vLLM 0.32's `pause_generation(mode="wait" if b else "abort")`; every other attribute is the engine's own."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def pause_generation(self, *, wait_for_inflight_requests: bool = False, clear_cache: bool = True) -> None:
        """verl 0.9.1's keyword on vLLM 0.32's signature."""
        await self._engine.pause_generation(mode="wait" if wait_for_inflight_requests else "abort",
                                            clear_cache=clear_cache)


def takes_pause_mode(engine: Any) -> bool:
    """Whether the engine's `pause_generation` has vLLM 0.32's `mode` keyword instead of verl's
    `wait_for_inflight_requests`."""
    params = inspect.signature(engine.pause_generation).parameters
    return "mode" in params and "wait_for_inflight_requests" not in params


class TailSieveVLLMHttpServer(vLLMHttpServer):  # type: ignore[misc]  # verl ships no type information
    """verl's `vLLMHttpServer` (same constructor) with an abort that stops the request (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._calls: dict[str, asyncio.Task[Any]] = {}  # request id → its running verl `generate`
        self._cancelled: set[str] = set()  # calls cancelled by `abort_request` before reaching the engine
        self._tombstones: OrderedDict[str, None] = OrderedDict()

    def _aborted_output(self, request_id: str) -> Any:
        return TokenOutput(token_ids=[], log_probs=None, routed_experts=None, stop_reason="aborted",
                           extra_fields={"global_steps": self.global_steps, "request_id": request_id})

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       **kwargs: Any) -> Any:
        """verl's `generate`; a request aborted before it arrived, or before the engine registered it, returns an
        aborted, empty output without (further) reaching the engine."""
        if request_id in self._tombstones:
            del self._tombstones[request_id]
            return self._aborted_output(request_id)
        task = asyncio.ensure_future(super().generate(prompt_ids, sampling_params, request_id, **kwargs))
        self._calls[request_id] = task
        try:
            return await task
        except asyncio.CancelledError:
            if request_id not in self._cancelled:
                raise
            return self._aborted_output(request_id)
        finally:
            self._calls.pop(request_id, None)
            self._cancelled.discard(request_id)

    async def abort_all_requests(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """verl's `abort_all_requests` (its gate, its reply) with the engine's pause called by vLLM 0.32's keyword
        (module docstring); on an engine that still takes verl's keyword, verl's method as it is."""
        engine: Any = getattr(self, "engine", None)
        if engine is None or not takes_pause_mode(engine):
            return dict(await super().abort_all_requests(*args, **kwargs))
        self.engine = PauseCompat(engine)
        try:
            return dict(await super().abort_all_requests(*args, **kwargs))
        finally:
            self.engine = engine

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict[str, Any]:
        """Abort `request_id` (the id the client sent, or an engine-internal one): through the engine's own abort
        when the engine holds it, else by cancelling its call before it reaches the engine, else a tombstone.
        Returns verl's reply shape: `aborted` True when a running or admitted request was stopped."""
        if self.node_rank != 0:
            return {"aborted": False, "request_id": request_id}
        held, internal = engine_request_ids(self.engine, request_id)
        if held:
            if internal:  # an engine-internal id (vLLM >= 0.1x keys its tables by them)
                await self.engine.abort(request_id, internal=True)
            else:  # the client's id: the engine aborts every internal request it maps to
                await self.engine.abort(request_id)
            if reset_prefix_cache:
                await self.clear_kv_cache()
            return {"aborted": True, "request_id": request_id, "engine_request_ids": held}
        task = self._calls.get(request_id)
        if task is not None and not task.done():
            self._cancelled.add(request_id)
            task.cancel()
            return {"aborted": True, "request_id": request_id, "engine_request_ids": []}
        if task is None:
            self._tombstones[request_id] = None
            while len(self._tombstones) > TOMBSTONES:
                self._tombstones.popitem(last=False)
        return {"aborted": False, "request_id": request_id, "error": f"Request {request_id} not found"}


class TailSieveVLLMReplica(vLLMReplica):  # type: ignore[misc]  # verl ships no type information
    """verl's `vLLMReplica` whose server actors are `TailSieveVLLMHttpServer`s (same arguments)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(TailSieveVLLMHttpServer)


@contextlib.contextmanager
def tailsieve_vllm_replicas() -> Iterator[None]:
    """Within this context verl resolves `rollout.name=vllm` to `TailSieveVLLMReplica`; verl's own loader is put
    back on exit (PD-disaggregated rollouts keep verl's `vLLMPDReplica`)."""
    registry = RolloutReplicaRegistry._registry
    previous = registry.get("vllm")
    RolloutReplicaRegistry.register("vllm", lambda: TailSieveVLLMReplica)
    try:
        yield
    finally:
        if previous is None:
            registry.pop("vllm", None)
        else:
            registry["vllm"] = previous
