"""Types shared by the engine client and executor: endpoints, sampling parameters, requests, completions, transport
options, and the error classes (`ReplicaFault`: the replica's fault; `RequestRejected`: the request's)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from tailsieve.errors import ConfigError, TailSieveError
from tailsieve.redact import redact, register_secret

DEFAULT_API_KEY_ENV = "TAILSIEVE_API_KEY"


class Api(StrEnum):
    """Which OpenAI endpoint requests go to."""

    COMPLETIONS = "completions"
    CHAT = "chat"


class ServerKind(StrEnum):
    """The built-in server flavours; each value names a backend in `engines/transport/backends.py` (which decides
    the path, extra request fields and how an abort is sent).
    `Endpoint.kind` also takes any other registered backend name."""

    VLLM = "vllm"
    SGLANG = "sglang"
    OPENAI = "openai"


class FaultKind(StrEnum):
    """Why a replica is considered faulty."""

    REFUSED = "refused"
    HTTP_5XX = "5xx"
    STALL = "stall"  # no progress (tokens) for the stall timeout; keep-alive bytes do not count
    DEADLINE = "deadline"  # the request ran past its total deadline
    DISCONNECT = "disconnect"
    BAD_REPLY = "bad-reply"  # a reply that breaks the protocol (engines/transport/replies.py)


class EngineError(TailSieveError):
    """A real-engine failure reported to the user as one line (secrets redacted: the text may quote a server)."""

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(" ".join(redact(str(message)).split()), *args)


class ReplicaFault(EngineError):
    """The replica failed (not the request): mark it down and re-dispatch its work elsewhere."""

    def __init__(self, url: str, kind: FaultKind, detail: str) -> None:
        super().__init__(f"{url}: {kind.value}: {detail}")
        self.url = url
        self.kind = kind


class RequestRejected(EngineError):
    """The server refused the request itself (HTTP 4xx): retrying elsewhere would not help."""


class WeightUpdateUnsupported(EngineError):
    """The server cannot load new weights in place (no such endpoint, or not enabled): restart it instead."""


class NoHealthyReplica(EngineError):
    """Every replica is down."""


class BadEndpoint(ConfigError, EngineError):
    """An endpoint URL that is not `http(s)://[USER:PASSWORD@]HOST[:PORT][/PATH]` (one line, credentials redacted)."""


_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")


def _strict_url(text: str) -> tuple[str, str | None]:
    """(the credential-free base URL, "user:password" percent-encoded or None) of an endpoint URL: scheme http or
    https, a host name or IP, a port in 1..65535 when given, a path but no query or fragment; a trailing `/` or
    `/v1` is dropped. Anything else is a one-line `BadEndpoint` that never shows the credentials."""
    raw = str(text).strip()
    shown = redact(raw)

    def bad(why: str) -> BadEndpoint:
        return BadEndpoint(f"endpoint {shown!r}: {why}; expected http(s)://HOST:PORT")

    parts = urlsplit(raw)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise bad("not an http or https URL")
    userinfo, at, hostport = parts.netloc.rpartition("@")
    host = hostport[:hostport.index("]") + 1] if hostport.startswith("[") and "]" in hostport else \
        hostport.partition(":")[0]
    port_text = hostport[len(host):]
    if not host or not _HOSTNAME.fullmatch(host):
        raise bad(f"host {host!r} is not a host name or IP address")
    if port_text:
        digits = port_text[1:]
        if not port_text.startswith(":") or not (digits.isascii() and digits.isdigit()) \
                or not 1 <= int(digits) <= 65535:
            raise bad(f"port {digits or port_text!r} is not an integer in 1..65535")
        hostport = f"{host}:{int(digits)}"
    if parts.query or parts.fragment or "?" in raw or "#" in raw:
        raise bad("a query or fragment is not part of a base URL")
    creds = None
    if at:
        user, colon, password = userinfo.partition(":")
        if not user:
            raise bad("credentials without a user name")
        creds = f"{quote(unquote(user), safe='')}:{quote(unquote(password), safe='')}" if colon else \
            quote(unquote(user), safe="")
        register_secret(unquote(password) if colon else unquote(user))
    path = parts.path.rstrip("/").removesuffix("/v1").rstrip("/")
    return f"{parts.scheme.lower()}://{hostport}{path}", creds


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One replica: base URL (without /v1), server kind (a registered backend name; built-ins become `ServerKind`),
    served model name (None: ask /v1/models). The URL is parsed strictly, once, here (`_strict_url`): `url` never
    holds credentials; `user:password@` in the given URL moves to `credentials` (never shown: the password is
    registered with `redact`), and `target(path)` puts them back for the request, which sends them as HTTP basic
    auth."""

    url: str
    kind: ServerKind | str = ServerKind.VLLM
    model: str | None = None
    credentials: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ServerKind) and self.kind in ServerKind.__members__.values():
            object.__setattr__(self, "kind", ServerKind(self.kind))
        url, creds = _strict_url(self.url)
        object.__setattr__(self, "url", url)
        if creds is not None:
            object.__setattr__(self, "credentials", creds)

    @classmethod
    def parse(cls, text: str, kind: ServerKind | str = ServerKind.VLLM) -> Endpoint:
        """`http(s)://[USER:PASSWORD@]HOST[:PORT]` (a trailing `/v1` or `/` is dropped); see `_strict_url`."""
        return cls(text, kind)

    def target(self, path: str) -> str:
        """The URL a request to `path` goes to (with the credentials, when the endpoint has them)."""
        if self.credentials is None:
            return self.url + path
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{self.credentials}@{rest}{path}"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling parameters sent with every request (App. A.1 names); `extra` is merged into the body verbatim."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    presence_penalty: float = 0.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    extra: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise EngineError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise EngineError(f"need temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}")

    def body(self) -> dict[str, Any]:
        """The request fields these parameters set."""
        out: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}
        if self.top_k is not None:
            out["top_k"] = self.top_k
        if self.presence_penalty:
            out["presence_penalty"] = self.presence_penalty
        if self.stop:
            out["stop"] = list(self.stop)
        if self.ignore_eos:
            out["ignore_eos"] = True
        out.update(dict(self.extra))
        return out


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request: a prompt (text, or chat messages), n choices, seed, and an optional max_tokens override."""

    rid: str
    prompt: str | tuple[tuple[str, str], ...]  # text for completions; ((role, content), ...) for chat
    n: int = 1
    seed: int | None = None
    max_tokens: int | None = None


class Progress(list[int]):
    """A request's live progress: `progress[i]` is choice i's tokens so far (what every `progress` list holds), and
    `texts[i]` its text pieces so far (streamed requests; what a cut request had generated, for a partial rollout
    that continues it)."""

    def __init__(self, n: int) -> None:
        super().__init__([0] * n)
        self.texts: list[list[str]] = [[] for _ in range(n)]


@dataclass(frozen=True, slots=True)
class TopPTokens:
    """Per generated token, the token ids the sampler's top-p (with top-k) kept, in CSR form: token t's ids are
    `token_ids[offsets[t]:offsets[t + 1]]`, so `offsets` has one entry more than the response has tokens (SGLang's
    `meta_info.top_p_token_ids` / `top_p_token_offsets`, which slime asks for when `--rollout-top-p` < 1)."""

    token_ids: tuple[int, ...]
    offsets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Choice:
    """One generated sample."""

    index: int
    text: str
    tokens: int
    finish_reason: str | None
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None  # per generated token, when `ClientOptions.logprobs` asked for them
    prompt_token_ids: tuple[int, ...] | None = None  # when the server returns them (vLLM `return_token_ids`)
    served_version: str | None = None  # the weight version the server says generated it (SGLang's meta_info)
    top_p: TopPTokens | None = None  # top-p kept token ids, when asked for and returned (SGLang with slime's patch)


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished request: its choices (by index), prompt tokens, latency and time to first token."""

    choices: tuple[Choice, ...]
    prompt_tokens: int
    latency_s: float
    ttft_s: float | None


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """Transport options: streaming, timeouts, fresh connections, API flavour, where the API key lives."""

    api: Api = Api.COMPLETIONS
    stream: bool = True
    connect_timeout_s: float = 5.0
    stall_timeout_s: float = 60.0  # streaming: max time without a new token; else the whole request
    fresh_connections: bool = False  # True: a new TCP connection per request (about 0.14 ms more CPU each)
    keepalive_s: float = 2.0  # an idle pooled connection is closed after this (below uvicorn's 5 s server-side)
    api_key_env: str | None = DEFAULT_API_KEY_ENV
    return_token_ids: bool = True  # vLLM only; other kinds never get the field
    logprobs: bool = False  # ask for each generated token's log-probability (trainer-ready samples)
    deadline_s: float | None = None  # total seconds one request may take (None: no limit beyond the stall timeout)

    def __post_init__(self) -> None:
        check_seconds("stall timeout", self.stall_timeout_s)
        check_seconds("connect timeout", self.connect_timeout_s)
        check_seconds("keep-alive", self.keepalive_s)
        if self.deadline_s is not None:
            check_seconds("request deadline", self.deadline_s)


def check_seconds(what: str, value: float, *, zero: bool = False) -> None:
    """A finite number of seconds, > 0 (>= 0 with `zero`); else a one-line `EngineError` naming `what`."""
    ok = isinstance(value, int | float) and math.isfinite(value) and (value >= 0 if zero else value > 0)
    if not ok:
        raise EngineError(f"{what} must be a finite number of seconds {'>= 0' if zero else '> 0'}, got {value!r}")
