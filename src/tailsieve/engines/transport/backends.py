"""Engine backends: the one place that knows a server flavour, behind `EngineClient`.

A backend names the request path, adds its own body fields to the generic OpenAI body, says how a cancelled
request is aborted on the server, which paths answer a health probe, and (optionally) maps its server's responses
onto the OpenAI format the client parses. Every hook has a default (the plain OpenAI behaviour), so a backend
overrides only what differs. Backends are chosen by name (`Endpoint.kind`, `--kind`) from `BACKENDS`, which
`@register_backend(name)` fills: `vllm`, `sglang` and `openai` are built in, and `sglang-native` (SGLang's own
`/generate` with token ids and logprobs, `engines/transport/sglang_native.py`). See docs/engines.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

import aiohttp

from tailsieve.engines.transport.replies import ReplyError
from tailsieve.engines.transport.reply_bounds import read_body
from tailsieve.engines.transport.types import (
    Api,
    ClientOptions,
    Endpoint,
    EngineError,
    Request,
    WeightUpdateUnsupported,
)
from tailsieve.errors import ConfigError
from tailsieve.redact import clip
from tailsieve.registry import Registry

__all__ = ["BACKENDS", "EngineBackend", "OpenAIBackend", "SGLangBackend", "UnknownBackend", "VLLMBackend",
           "backend_names", "get_backend", "register_backend"]


class EngineBackend:
    """One server flavour. Every hook defaults to the plain OpenAI-compatible behaviour; override what differs.

    One instance serves every request of an `EngineClient`, concurrently: keep per-request state keyed by `req.rid`.
    """

    name: ClassVar[str] = ""
    health_paths: ClassVar[tuple[str, ...]] = ("/health", "/v1/models")  # 200: up; 404: try the next; else down
    version_paths: ClassVar[tuple[str, ...]] = ()  # GETs answering `{"weight_version": ...}`; 404: try the next

    def path(self, options: ClientOptions) -> str:
        """The request path, appended to the endpoint's base URL."""
        return "/v1/chat/completions" if options.api is Api.CHAT else "/v1/completions"

    def extra_body(self, body: Mapping[str, Any], req: Request, options: ClientOptions) -> dict[str, Any]:
        """Fields added to (or replacing ones in) the generic OpenAI body; none by default."""
        return {}

    def request_body(self, body: dict[str, Any], req: Request, options: ClientOptions) -> dict[str, Any]:
        """The body actually sent, from the OpenAI body with `extra_body` applied: unchanged by default; a server
        with its own request format (SGLang's native `/generate`) rewrites the whole body here."""
        return body

    async def abort(self, session: aiohttp.ClientSession, endpoint: Endpoint, req: Request) -> None:
        """Abort a cancelled request on the server; by default nothing (closing the connection is enough)."""

    def response(self, data: Any, req: Request) -> Any:
        """A non-streamed response in OpenAI form (`{"choices": [...], "usage": {...}}`); unchanged by default."""
        return data

    def chunk(self, chunk: dict[str, Any], req: Request) -> dict[str, Any]:
        """One streamed `data:` event in OpenAI chunk form; unchanged by default."""
        return chunk

    async def update_weights(self, session: aiohttp.ClientSession, endpoint: Endpoint, path: str,
                             version: int) -> None:
        """Make the server serve the checkpoint in folder `path` (tagged `version`) from its next request on, in
        place; by default unsupported (`WeightUpdateUnsupported`: the caller restarts the replica instead)."""
        raise WeightUpdateUnsupported(f"{endpoint.url}: the {self.name or 'openai'} backend cannot reload weights "
                                      "in place")

    async def served_version(self, session: aiohttp.ClientSession, endpoint: Endpoint) -> str | None:
        """The weight version the server says it serves (its `weight_version`, read from the first of
        `version_paths` it has); None when it does not say (no such path: 404, or an answer without the field).
        Anything else that keeps it from saying (a timeout, an error status, a reply that is not a JSON object, or
        a version that is not text or an integer) is an `EngineError`: the version cannot be verified."""
        for path in self.version_paths:
            status, data = await get_json(session, endpoint.target(path), timeout_s=VERSION_TIMEOUT_S)
            if status == 404:
                continue
            _check(endpoint.url, status, data, f"GET {path}")
            if not isinstance(data, dict):
                raise EngineError(f"{endpoint.url}: GET {path} answered {type(data).__name__}, expected a JSON "
                                  "object")
            version = data.get("weight_version")
            if version is not None and (isinstance(version, bool) or not isinstance(version, str | int)):
                raise EngineError(f"{endpoint.url}: GET {path} weight_version is {type(version).__name__}, expected "
                                  "text or an integer")
            return None if version is None else str(version)
        return None

    async def tag_version(self, session: aiohttp.ClientSession, endpoint: Endpoint, version: int) -> None:
        """Label the weights the server now serves as `version` (`POST /update_weight_version`, vLLM's and
        SGLang's); a server without the endpoint (404) is left as it is."""
        if not self.version_paths:
            return
        status, data = await post_json(session, endpoint.target("/update_weight_version"),
                                       {"new_version": str(version)})
        if status != 404:
            _check(endpoint.url, status, data, "update_weight_version")


WEIGHT_UPDATE_TIMEOUT_S = 600.0
VERSION_TIMEOUT_S = 10.0  # reading back the version a server reports


async def post_json(session: aiohttp.ClientSession, url: str, body: Mapping[str, Any], *,
                    timeout_s: float = WEIGHT_UPDATE_TIMEOUT_S) -> tuple[int, Any]:
    """POST a JSON body; (status, parsed JSON or text). Connection failures become one-line `EngineError`s."""
    return await _json(session.post(url, json=dict(body), timeout=aiohttp.ClientTimeout(total=timeout_s)), url)


async def get_json(session: aiohttp.ClientSession, url: str, *,
                   timeout_s: float = VERSION_TIMEOUT_S) -> tuple[int, Any]:
    """GET a JSON answer; (status, parsed JSON or text). Connection failures become one-line `EngineError`s."""
    return await _json(session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)), url)


async def _json(call: Any, url: str) -> tuple[int, Any]:
    """(status, parsed JSON, or the text when it is not JSON) of a reply read within `CONTROL_REPLY_BYTES`."""
    try:
        async with call as r:
            text = (await read_body(r, urlsplit(url).path or "/")).decode("utf-8", "replace")
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise EngineError(f"{url}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]) \
            from None
    except ReplyError as exc:
        raise EngineError(f"{url}: {exc}") from None
    try:
        return r.status, json.loads(text) if text else None
    except ValueError:
        return r.status, text


def _check(url: str, status: int, data: Any, what: str) -> None:
    """A 404 means the server lacks the endpoint (unsupported); any other failure is a one-line `EngineError`."""
    if status == 404:
        raise WeightUpdateUnsupported(f"{url}: no {what} endpoint (HTTP 404)")
    if status >= 400 or (isinstance(data, dict) and data.get("success") is False):
        detail = data.get("message", data.get("detail", data)) if isinstance(data, dict) else data
        raise EngineError(f"{url}: {what} failed: HTTP {status}: {clip(' '.join(str(detail).split()))}")


class UnknownBackend(ConfigError, EngineError):
    """An endpoint or `--kind` names no registered backend."""


def _backend_class(obj: object) -> str | None:
    return None if isinstance(obj, type) and issubclass(obj, EngineBackend) else "not a subclass of EngineBackend"


def _named(name: str, cls: type[EngineBackend]) -> None:
    cls.name = name


# engine backends (`tailsieve.registry.Registry`; plugins: `pkg.module:Class`, group tailsieve.backends)
BACKENDS: Registry[type[EngineBackend]] = Registry("engine backend", "tailsieve.backends", check=_backend_class,
                                                   on_add=_named, error=UnknownBackend)
B = TypeVar("B", bound=type[EngineBackend])


def register_backend(name: str) -> Callable[[B], B]:
    """Class decorator adding a backend to `BACKENDS` under `name` (a name taken by another class is refused)."""
    return BACKENDS.register(name)


def backend_names() -> list[str]:
    """Registered backend names, sorted (the `--kind` choices; a plugin is named `pkg.module:Class`)."""
    return sorted(BACKENDS.names())


def get_backend(name: str) -> EngineBackend:
    """A new instance of the backend registered as `name`; an unknown name is a one-line `UnknownBackend`."""
    return BACKENDS.resolve(str(name))()


@register_backend("openai")
class OpenAIBackend(EngineBackend):
    """A generic OpenAI-compatible server: the plain body; closing the connection is the only abort."""


@register_backend("vllm")
class VLLMBackend(EngineBackend):
    """vLLM's OpenAI server: per-chunk usage while streaming and the generated token ids (`return_token_ids`); with
    `VLLM_SERVER_DEV_MODE=1` it reports its weight version at `GET /weight_info` (vLLM 0.32)."""

    version_paths: ClassVar[tuple[str, ...]] = ("/weight_info",)

    def extra_body(self, body: Mapping[str, Any], req: Request, options: ClientOptions) -> dict[str, Any]:
        """`continuous_usage_stats` inside `stream_options`, and `return_token_ids` unless the options turn it off."""
        out: dict[str, Any] = {}
        stream_options = body.get("stream_options")
        if isinstance(stream_options, Mapping):
            out["stream_options"] = {**stream_options, "continuous_usage_stats": True}
        if options.return_token_ids:
            out["return_token_ids"] = True
        return out

    async def update_weights(self, session: aiohttp.ClientSession, endpoint: Endpoint, path: str,
                             version: int) -> None:
        """Reload in place through the development-mode RPC (`VLLM_SERVER_DEV_MODE=1`): every worker's
        `reload_weights(weights_path=path)`, then the prefix cache is reset (its KV came from the old weights) and
        the server's weight version label is set."""
        url = endpoint.url
        status, data = await post_json(session, endpoint.target("/collective_rpc"),
                                       {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
        if status == 404:
            raise WeightUpdateUnsupported(f"{url}: no /collective_rpc endpoint: start vLLM with "
                                          "VLLM_SERVER_DEV_MODE=1 to reload weights in place")
        _check(url, status, data, "reload_weights")
        status, data = await post_json(session, endpoint.target("/reset_prefix_cache"), {})
        if status != 404:
            _check(url, status, data, "reset_prefix_cache")
        await self.tag_version(session, endpoint, version)


@register_backend("sglang")
class SGLangBackend(EngineBackend):
    """SGLang's OpenAI server: the request id travels as `rid`, and a cancelled request is aborted explicitly; it
    reports its weight version at `GET /model_info` (`/get_model_info` before SGLang 0.5.x)."""

    abort_timeout_s: ClassVar[float] = 2.0
    version_paths: ClassVar[tuple[str, ...]] = ("/model_info", "/get_model_info")

    def extra_body(self, body: Mapping[str, Any], req: Request, options: ClientOptions) -> dict[str, Any]:
        """`rid`: the id `/abort_request` names."""
        return {"rid": req.rid}

    async def abort(self, session: aiohttp.ClientSession, endpoint: Endpoint, req: Request) -> None:
        """POST `/abort_request {"rid": ...}` (SGLang may keep generating after the connection closes)."""
        async with session.post(endpoint.target("/abort_request"), json={"rid": req.rid},
                                timeout=aiohttp.ClientTimeout(total=self.abort_timeout_s)):
            pass

    async def update_weights(self, session: aiohttp.ClientSession, endpoint: Endpoint, path: str,
                             version: int) -> None:
        """`POST /update_weights_from_disk {"model_path": path, "weight_version": "<version>"}` (SGLang flushes its
        cache itself)."""
        body = {"model_path": str(path), "weight_version": str(version)}
        status, data = await post_json(session, endpoint.target("/update_weights_from_disk"), body)
        _check(endpoint.url, status, data, "update_weights_from_disk")
