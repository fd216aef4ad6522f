"""Async client for OpenAI-compatible servers (vLLM, SGLang): `/v1/completions` and `/v1/chat/completions`.

The server flavour lives in the endpoint's backend (`engines/backends.py`, looked up by `Endpoint.kind`): the
path, extra body fields, the abort of a cancelled request, health paths, and the mapping of its responses onto the
OpenAI format parsed here. The client itself has no per-flavour branches.

One `complete()` call is one HTTP request (a whole GRPO group with `n = G`, or one member). Streaming (default)
reports tokens generated so far into a caller-owned `progress` list, so a request cancelled at the cutoff still
says how far it got. Cancelling the awaiting task closes the connection, which aborts the request in vLLM, and
runs the backend's abort hook in the background (SGLang posts `/abort_request`). Failures are classified:
`ReplicaFault` (refused connection, 5xx, stall past the read timeout, dropped connection: the replica's fault) or
`RequestRejected` (4xx: the request's).
The API key is read from an environment variable, sent as a bearer token, and never logged or repr'd.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tailsieve.engines.backends import EngineBackend, get_backend
from tailsieve.engines.types import (
    DEFAULT_API_KEY_ENV,
    Api,
    Choice,
    ClientOptions,
    Completion,
    Endpoint,
    EngineError,
    FaultKind,
    NoHealthyReplica,
    ReplicaFault,
    Request,
    RequestRejected,
    SamplingParams,
    ServerKind,
)

__all__ = [
    "DEFAULT_API_KEY_ENV",
    "Api",
    "Choice",
    "ClientOptions",
    "Completion",
    "Endpoint",
    "EngineClient",
    "EngineError",
    "FaultKind",
    "NoHealthyReplica",
    "ReplicaFault",
    "Request",
    "RequestRejected",
    "SamplingParams",
    "ServerKind",
    "parse_metrics",
]


@dataclass(slots=True)
class _Acc:
    text: list[str] = field(default_factory=list)
    ids: list[int] | None = None
    finish: str | None = None
    tokens: int = 0
    logprobs: list[float] | None = None
    prompt_ids: tuple[int, ...] | None = None

    def choice(self, i: int) -> Choice:
        """The finished choice."""
        return Choice(i, "".join(self.text), self.tokens, self.finish, None if self.ids is None else tuple(self.ids),
                      None if self.logprobs is None else tuple(self.logprobs), self.prompt_ids)


class EngineClient:
    """An aiohttp session shared by every request of a run; use as `async with EngineClient(opts) as c`."""

    def __init__(self, options: ClientOptions | None = None) -> None:
        self.options = options or ClientOptions()
        env = self.options.api_key_env
        self.__key = os.environ.get(env) if env else None
        self._session: aiohttp.ClientSession | None = None
        self._aborts: set[asyncio.Task[None]] = set()
        self._backends: dict[str, EngineBackend] = {}

    def __repr__(self) -> str:
        return f"EngineClient({self.options!r}, api_key={'set' if self.__key else 'unset'})"

    async def __aenter__(self) -> EngineClient:
        self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def open(self) -> None:
        """Create the HTTP session (idempotent)."""
        if self._session is None:
            conn = aiohttp.TCPConnector(limit=0, force_close=self.options.fresh_connections)
            headers = {"Authorization": f"Bearer {self.__key}"} if self.__key else {}
            self._session = aiohttp.ClientSession(connector=conn, headers=headers)

    async def close(self) -> None:
        """Close the session (pending abort notices are awaited briefly)."""
        if self._aborts:
            await asyncio.wait(self._aborts, timeout=2.0)
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session."""
        if self._session is None:
            self.open()
        assert self._session is not None
        return self._session

    def _timeout(self) -> aiohttp.ClientTimeout:
        o = self.options
        return aiohttp.ClientTimeout(total=None, connect=o.connect_timeout_s, sock_connect=o.connect_timeout_s,
                                     sock_read=o.stall_timeout_s)

    def backend(self, endpoint: Endpoint) -> EngineBackend:
        """The backend named by `endpoint.kind` (one instance per name and client); unknown: `UnknownBackend`."""
        name = str(endpoint.kind)
        found = self._backends.get(name)
        if found is None:
            found = self._backends[name] = get_backend(name)
        return found

    def body(self, endpoint: Endpoint, model: str, req: Request, params: SamplingParams) -> dict[str, Any]:
        """The JSON body of one request: the generic OpenAI body plus the backend's fields."""
        body: dict[str, Any] = {"model": model, **params.body(), "n": req.n}
        if self.options.api is Api.CHAT:
            if isinstance(req.prompt, str):
                body["messages"] = [{"role": "user", "content": req.prompt}]
            else:
                body["messages"] = [{"role": r, "content": c} for r, c in req.prompt]
        else:
            body["prompt"] = req.prompt if isinstance(req.prompt, str) else "\n\n".join(c for _, c in req.prompt)
        if req.seed is not None:
            body["seed"] = req.seed
        if req.max_tokens is not None:
            body["max_tokens"] = req.max_tokens
        if self.options.logprobs:
            body |= {"logprobs": True, "top_logprobs": 0} if self.options.api is Api.CHAT else {"logprobs": 0}
        if self.options.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        backend = self.backend(endpoint)
        body.update(backend.extra_body(body, req, self.options))
        return backend.request_body(body, req, self.options)

    async def complete(
        self, endpoint: Endpoint, model: str, req: Request, params: SamplingParams, progress: list[int] | None = None
    ) -> Completion:
        """Send one request and wait for all its choices; `progress[i]` tracks choice i's tokens while streaming."""
        backend = self.backend(endpoint)
        path = backend.path(self.options)
        body = self.body(endpoint, model, req, params)
        t0 = time.perf_counter()
        try:
            async with self.session.post(endpoint.url + path, json=body, timeout=self._timeout(),
                                         headers={"X-Request-Id": req.rid}) as resp:
                if resp.status >= 400:
                    await _raise_status(endpoint, resp)
                if self.options.stream:
                    return await self._read_stream(resp, backend, req, t0, progress)
                data = backend.response(await resp.json(content_type=None), req)
        except asyncio.CancelledError:
            self._abort(backend, endpoint, req)
            raise
        except (ReplicaFault, RequestRejected):
            raise
        except aiohttp.ClientConnectorError as exc:
            raise ReplicaFault(endpoint.url, FaultKind.REFUSED, _short(exc)) from None
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise ReplicaFault(endpoint.url, FaultKind.STALL,
                               f"no data for {self.options.stall_timeout_s:g}s") from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise ReplicaFault(endpoint.url, FaultKind.DISCONNECT, _short(exc)) from None
        return _parse_full(data, body, time.perf_counter() - t0)

    async def _read_stream(
        self, resp: aiohttp.ClientResponse, backend: EngineBackend, req: Request, t0: float, progress: list[int] | None
    ) -> Completion:
        accs = [_Acc() for _ in range(req.n)]
        prog = progress if progress is not None else [0] * req.n
        chat = self.options.api is Api.CHAT
        ttft: float | None = None
        prompt_tokens = 0
        done = False
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            chunk = backend.chunk(json.loads(payload), req)
            if chunk.get("error"):
                _raise_stream_error(resp, chunk["error"])
            usage = chunk.get("usage") or {}
            prompt_tokens = int(usage.get("prompt_tokens") or prompt_tokens)
            choices = chunk.get("choices") or []
            for ch in choices:
                i = int(ch.get("index", 0))
                if not 0 <= i < req.n:
                    continue
                a = accs[i]
                text = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
                ids = ch.get("token_ids")
                _add_extras(a, ch, chunk)
                if text:
                    a.text.append(text)
                if ids is not None:
                    a.ids = (a.ids or []) + list(ids)
                    a.tokens += len(ids)
                elif len(choices) == 1 and usage.get("completion_tokens") is not None and req.n == 1:
                    a.tokens = int(usage["completion_tokens"])
                elif text:
                    a.tokens += 1
                if ch.get("finish_reason") is not None:
                    a.finish = str(ch["finish_reason"])
                prog[i] = a.tokens
                if ttft is None and (text or ids):
                    ttft = time.perf_counter() - t0
            if not choices and usage.get("completion_tokens") is not None and req.n == 1:
                accs[0].tokens = int(usage["completion_tokens"])
                prog[0] = accs[0].tokens
        if any(a.finish is None for a in accs):
            tail = "" if done else " ([DONE] missing)"
            raise aiohttp.ClientPayloadError(f"stream ended before every choice finished{tail}")
        out = tuple(a.choice(i) for i, a in enumerate(accs))
        return Completion(out, prompt_tokens, time.perf_counter() - t0, ttft)

    def _abort(self, backend: EngineBackend, endpoint: Endpoint, req: Request) -> None:
        """Run the backend's abort hook in the background (awaited briefly by `close`); its failures are ignored."""
        if type(backend).abort is EngineBackend.abort:
            return  # the no-op default: closing the connection is the abort, no task needed

        async def send() -> None:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                await backend.abort(self.session, endpoint, req)

        task = asyncio.get_running_loop().create_task(send())
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def health(self, endpoint: Endpoint, timeout_s: float = 2.0) -> bool:
        """True when the backend's first health path that exists (GET /health, else /v1/models) answers 200."""
        for path in self.backend(endpoint).health_paths:
            try:
                async with self.session.get(endpoint.url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                    if r.status == 200:
                        return True
                    if r.status != 404:
                        return False
            except (aiohttp.ClientError, OSError, TimeoutError):
                return False
        return False

    async def models(self, endpoint: Endpoint) -> list[str]:
        """Served model names (GET /v1/models)."""
        try:
            async with self.session.get(endpoint.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status >= 400:
                    await _raise_status(endpoint, r)
                data = await r.json(content_type=None)
        except aiohttp.ClientConnectorError as exc:
            raise ReplicaFault(endpoint.url, FaultKind.REFUSED, _short(exc)) from None
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise ReplicaFault(endpoint.url, FaultKind.DISCONNECT, _short(exc)) from None
        return [str(m["id"]) for m in data.get("data", []) if isinstance(m, dict) and "id" in m]

    async def metrics(self, endpoint: Endpoint) -> dict[str, float]:
        """Prometheus /metrics summed over label sets: `{"vllm:num_requests_running": 3.0, ...}`."""
        async with self.session.get(endpoint.url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
            text = await r.text()
        return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    """Sum every sample of each metric name (labels dropped); comments skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


async def _raise_status(endpoint: Endpoint, resp: aiohttp.ClientResponse) -> None:
    try:
        text = (await resp.text())[:300]
    except (aiohttp.ClientError, OSError, TimeoutError):
        text = ""
    try:
        obj = json.loads(text)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = str(err.get("message", err) if isinstance(err, dict) else err)
    except ValueError:
        msg = text
    msg = " ".join(msg.split())[:200] or resp.reason or ""
    if resp.status >= 500 or resp.status in (408, 429):
        raise ReplicaFault(endpoint.url, FaultKind.HTTP_5XX, f"HTTP {resp.status} {msg}")
    raise RequestRejected(f"{endpoint.url}: HTTP {resp.status}: {msg}")


def _raise_stream_error(resp: aiohttp.ClientResponse, err: Any) -> None:
    """An error event inside a stream: 4xx codes are the request's fault, anything else the replica's."""
    url = str(resp.url.origin())
    info = err if isinstance(err, dict) else {"message": str(err)}
    msg = " ".join(str(info.get("message", "")).split())[:200]
    try:
        code = int(info.get("code") or 500)
    except (TypeError, ValueError):
        code = 500
    if 400 <= code < 500 and code not in (408, 429):
        raise RequestRejected(f"{url}: HTTP {code} (in stream): {msg}")
    raise ReplicaFault(url, FaultKind.HTTP_5XX, f"error in stream: {msg}")


def _token_logprobs(ch: dict[str, Any]) -> list[float] | None:
    """Sampled-token log-probabilities of a choice (completions: `token_logprobs`; chat: `content[].logprob`)."""
    lp = ch.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if isinstance(lp.get("token_logprobs"), list):
        return [float(x) if x is not None else float("nan") for x in lp["token_logprobs"]]
    if isinstance(lp.get("content"), list):
        return [float(c.get("logprob", float("nan"))) for c in lp["content"] if isinstance(c, dict)]
    return None


def _add_extras(a: _Acc, ch: dict[str, Any], outer: dict[str, Any]) -> None:
    """Accumulate a choice's logprobs and take its prompt token ids (per choice, or response-level for chat)."""
    lps = _token_logprobs(ch)
    if lps is not None:
        a.logprobs = (a.logprobs or []) + lps
    pids = ch.get("prompt_token_ids") or outer.get("prompt_token_ids")
    if a.prompt_ids is None and isinstance(pids, list):
        a.prompt_ids = tuple(int(t) for t in pids)


def _parse_full(data: Any, body: dict[str, Any], latency: float) -> Completion:
    """Choices of a non-streamed response; per-choice tokens from token ids, usage (n = 1) or max_tokens."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        raise ValueError("response has no 'choices' list")
    usage = data.get("usage") or {}
    n = int(body.get("n", 1))
    total = int(usage.get("completion_tokens") or 0)
    raw: Sequence[dict[str, Any]] = sorted(data["choices"], key=lambda c: int(c.get("index", 0)))
    out: list[Choice] = []
    for ch in raw:
        text = ch.get("text")
        if text is None:
            text = (ch.get("message") or {}).get("content") or ""
        ids = ch.get("token_ids")
        finish = ch.get("finish_reason")
        if ids is not None:
            tokens = len(ids)
        elif n == 1:
            tokens = total
        elif finish == "length":
            tokens = int(body["max_tokens"])
        else:
            tokens = round(total / max(n, 1))
        acc = _Acc(text=[str(text)], ids=None if ids is None else [int(t) for t in ids], finish=finish, tokens=tokens)
        _add_extras(acc, ch, data)
        out.append(acc.choice(int(ch.get("index", 0))))
    return Completion(tuple(out), int(usage.get("prompt_tokens") or 0), latency, None)
