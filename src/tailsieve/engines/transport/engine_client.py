"""Async client for OpenAI-compatible servers (vLLM, SGLang): `/v1/completions` and `/v1/chat/completions`.

The server flavour lives in the endpoint's backend (`engines/transport/backends.py`, looked up by `Endpoint.kind`): the
path, extra body fields, the abort of a cancelled request, health paths, and the mapping of its responses onto the
OpenAI format parsed here. The client itself has no per-flavour branches.

One `complete()` call is one HTTP request (a whole GRPO group with `n = G`, or one member). Streaming (default)
reports tokens generated so far into a caller-owned `progress` list, so a request cancelled at the cutoff still
says how far it got. Cancelling the awaiting task closes the connection, which aborts the request in vLLM, and
runs the backend's abort hook in the background (SGLang posts `/abort_request`). Failures are classified:
`ReplicaFault` (refused connection, 5xx, no new token for the stall timeout, past the deadline, dropped connection,
a reply that fails validation in `engines/transport/replies.py`: the replica's fault) or `RequestRejected` (4xx:
the request's).
The API key is read from an environment variable, sent as a bearer token, and never logged or repr'd.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tailsieve.engines.transport.backends import EngineBackend, get_backend
from tailsieve.engines.transport.replies import BadReply, ReplyError, loads, model_names, parse_chunk, parse_full
from tailsieve.engines.transport.reply_bounds import (
    check_prompt_ids,
    check_size,
    error_message,
    read_body,
    read_capped,
    reply_limit,
)
from tailsieve.engines.transport.request_clock import RequestClock
from tailsieve.engines.transport.stream_replies import StreamAcc, raise_stream_error
from tailsieve.engines.transport.types import (
    DEFAULT_API_KEY_ENV,
    Api,
    BadEndpoint,
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
from tailsieve.redact import EXCERPT_CHARS, clip, register_secret

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

TRANSPORT_ERROR_CHARS = 200  # the most of a transport error's own text (aiohttp's, the OS's) a fault message quotes


@dataclass(slots=True)
class _StreamState:
    """What one streamed reply has shown so far beyond its samples."""

    origin: str
    done: bool = False
    progress: bool = False  # tokens since the stall timer was last considered
    ttft: float | None = None


class EngineClient:
    """An aiohttp session shared by every request of a run; use as `async with EngineClient(opts) as c`."""

    def __init__(self, options: ClientOptions | None = None) -> None:
        self.options = options or ClientOptions()
        env = self.options.api_key_env
        self.__key = os.environ.get(env) if env else None
        register_secret(self.__key)
        self._session: aiohttp.ClientSession | None = None
        self._aborts: set[asyncio.Task[None]] = set()
        self._backends: dict[str, EngineBackend] = {}
        self.stale_retries = 0  # requests re-sent because a pooled connection had been closed by the server

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
            o = self.options
            conn = (aiohttp.TCPConnector(limit=0, force_close=True) if o.fresh_connections
                    else aiohttp.TCPConnector(limit=0, keepalive_timeout=o.keepalive_s))
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

    def check_endpoint(self, endpoint: Endpoint) -> None:
        """Credentials in an endpoint's URL are sent as HTTP basic auth; with an API key as well the request would
        carry two `Authorization`s: refused in one line (before any request)."""
        if endpoint.credentials is not None and self.__key:
            raise BadEndpoint(f"endpoint {endpoint.url} carries user:password credentials and the API key variable "
                              f"{self.options.api_key_env} is set: give one of them")

    def _url(self, endpoint: Endpoint, path: str) -> str:
        self.check_endpoint(endpoint)
        return endpoint.target(path)

    def _timeout(self) -> aiohttp.ClientTimeout:
        o = self.options
        return aiohttp.ClientTimeout(total=None, connect=o.connect_timeout_s, sock_connect=o.connect_timeout_s)

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
        """Send one request and wait for all its choices; `progress[i]` tracks choice i's tokens while streaming.
        The stall timer restarts only on chunks that carry tokens (keep-alive comments and empty events do not
        count); `ClientOptions.deadline_s` bounds the whole request."""
        backend = self.backend(endpoint)
        self.check_endpoint(endpoint)
        body = self.body(endpoint, model, req, params)
        clock = RequestClock(asyncio.get_running_loop(), self.options.stall_timeout_s, self.options.deadline_s)
        try:
            async with asyncio.timeout_at(clock.limit()) as scope:
                try:
                    return await self._send(endpoint, backend, body, req, params, progress, clock, scope)
                except asyncio.CancelledError:
                    self._abort(backend, endpoint, req)
                    raise
        except TimeoutError:
            raise clock.fault(endpoint.url) from None

    async def _send(self, endpoint: Endpoint, backend: EngineBackend, body: dict[str, Any], req: Request,
                    params: SamplingParams, progress: list[int] | None, clock: RequestClock,
                    scope: asyncio.Timeout) -> Completion:
        """POST the body and parse the reply; transport failures and bad replies become `ReplicaFault`s. A pooled
        keep-alive connection the server closed while idle fails before any reply ("Server disconnected"): the
        request never started there, so it is sent once more on a new connection."""
        cap = req.max_tokens or params.max_tokens
        limit = reply_limit(req, cap)
        try:
            try:
                ctx = await self.session.post(self._url(endpoint, backend.path(self.options)), json=body,
                                              timeout=self._timeout(), headers={"X-Request-Id": req.rid})
            except aiohttp.ServerDisconnectedError:
                if self.options.fresh_connections:
                    raise
                self.stale_retries += 1
                ctx = await self.session.post(self._url(endpoint, backend.path(self.options)), json=body,
                                              timeout=self._timeout(), headers={"X-Request-Id": req.rid,
                                                                                "Connection": "close"})
            async with ctx as resp:
                if resp.status >= 400:
                    await _raise_status(endpoint, resp)
                if self.options.stream:
                    prog = progress if progress is not None else [0] * req.n
                    return await self._read_stream(resp, backend, req, StreamAcc(req.n, cap, prog), clock, scope,
                                                   limit)
                body_bytes = await read_capped(resp.content.iter_any(), limit, resp.content_length)
                data = backend.response(loads(body_bytes), req)
                return check_prompt_ids(req, parse_full(data, req.n, cap, clock.elapsed()))
        except (ReplicaFault, RequestRejected):
            raise
        except aiohttp.ClientConnectorError as exc:
            raise ReplicaFault(endpoint.url, FaultKind.REFUSED, _short(exc)) from None
        except aiohttp.ServerTimeoutError as exc:
            raise ReplicaFault(endpoint.url, FaultKind.REFUSED, f"connect: {_short(exc)}") from None
        except (aiohttp.ClientError, OSError, EOFError) as exc:
            raise ReplicaFault(endpoint.url, FaultKind.DISCONNECT, _short(exc)) from None
        except ReplyError as exc:
            raise BadReply(endpoint.url, str(exc)) from None
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as exc:
            # the backend's mapping hooks met a reply shape they do not expect: still the replica's fault
            raise BadReply(endpoint.url, f"{type(exc).__name__}: {_short(exc, EXCERPT_CHARS)}") from None

    async def _read_stream(self, resp: aiohttp.ClientResponse, backend: EngineBackend, req: Request, acc: StreamAcc,
                           clock: RequestClock, scope: asyncio.Timeout, limit: int) -> Completion:
        """Read SSE events as they arrive (one read often holds several), parse each `data:` line into `acc`. The
        stream's bytes are capped (`limit`) as they arrive, so no event larger than the cap is ever parsed."""
        state = _StreamState(str(resp.url.origin()))
        buf = bytearray()
        size = 0
        async for data in resp.content.iter_any():
            size += len(data)
            check_size(size, limit)
            buf += data
            if b"\n" not in data:
                continue
            end = buf.rfind(b"\n")
            lines = bytes(buf[:end]).split(b"\n")
            del buf[:end + 1]
            if self._feed(lines, backend, req, acc, clock, state):
                break
            if state.progress:
                clock.progressed(scope)
                state.progress = False
        else:
            self._feed([bytes(buf)], backend, req, acc, clock, state)  # a last line without its newline
        return check_prompt_ids(req, acc.result(state.done, clock.elapsed(), state.ttft))

    @staticmethod
    def _feed(lines: list[bytes], backend: EngineBackend, req: Request, acc: StreamAcc, clock: RequestClock,
              state: _StreamState) -> bool:
        """Parse complete SSE lines into `acc`; True at `data: [DONE]`."""
        for raw in lines:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue  # SSE comments (`: keep-alive`), event names, blank lines: no progress
            payload = line[5:].strip()
            if payload == b"[DONE]":
                state.done = True
                return True
            obj = loads(payload)
            if isinstance(obj, dict) and obj.get("error"):
                raise_stream_error(state.origin, obj["error"])
            if not isinstance(obj, dict):
                raise ReplyError(f"stream chunk is {type(obj).__name__}, expected an object")
            mapped = backend.chunk(obj, req)
            if mapped is not obj and isinstance(mapped, dict) and mapped.get("error"):
                raise_stream_error(state.origin, mapped["error"])
            chunk = parse_chunk(mapped, req.n, acc.cap)
            acc.add(chunk)
            if chunk.progress:
                state.progress = True
                if state.ttft is None and any(c.text or c.token_ids for c in chunk.choices):
                    state.ttft = clock.elapsed()
        return False

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
                async with self.session.get(self._url(endpoint, path),
                                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
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
            async with self.session.get(self._url(endpoint, "/v1/models"),
                                        timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status >= 400:
                    await _raise_status(endpoint, r)
                return model_names(loads(await read_body(r, "/v1/models")))
        except aiohttp.ClientConnectorError as exc:
            raise ReplicaFault(endpoint.url, FaultKind.REFUSED, _short(exc)) from None
        except ReplyError as exc:
            raise BadReply(endpoint.url, str(exc)) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ReplicaFault(endpoint.url, FaultKind.DISCONNECT, _short(exc)) from None

    async def metrics(self, endpoint: Endpoint) -> dict[str, float]:
        """Prometheus /metrics summed over label sets: `{"vllm:num_requests_running": 3.0, ...}`."""
        try:
            async with self.session.get(self._url(endpoint, "/metrics"), timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status >= 400:
                    await _raise_status(endpoint, r)
                return parse_metrics((await read_body(r, "/metrics")).decode("utf-8", "replace"))
        except ReplyError as exc:
            raise BadReply(endpoint.url, str(exc)) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ReplicaFault(endpoint.url, FaultKind.DISCONNECT, _short(exc)) from None


def parse_metrics(text: str) -> dict[str, float]:
    """Sum every sample of each sample name (labels dropped), read with `prometheus_client`'s text parser; a
    malformed exposition is a `ReplyError`."""
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise ReplyError(f"malformed /metrics text ({_short(exc, EXCERPT_CHARS)})") from None
    return out


def _short(exc: BaseException, limit: int = TRANSPORT_ERROR_CHARS) -> str:
    """An exception's first line as an error message quotes it, redacted and clipped (`redact.clip`): a transport
    error's own text up to `limit`; one that may quote a reply's content with `limit=EXCERPT_CHARS`."""
    return clip(str(exc).splitlines()[0], limit) if str(exc) else type(exc).__name__


async def _raise_status(endpoint: Endpoint, resp: aiohttp.ClientResponse) -> None:
    """A 4xx/5xx reply as a one-line error quoting what the server said (`reply_bounds.error_message`)."""
    msg = await error_message(resp)
    if resp.status >= 500 or resp.status in (408, 429):
        raise ReplicaFault(endpoint.url, FaultKind.HTTP_5XX, f"HTTP {resp.status} {msg}")
    raise RequestRejected(f"{endpoint.url}: HTTP {resp.status}: {msg}")
