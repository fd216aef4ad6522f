"""SGLang's native API as an engine backend (`kind = "sglang-native"`): `POST /generate` with token ids in and
token ids plus per-token logprobs out, and `POST /abort_request {"rid": ...}` for a cancelled request.

`EngineExecutor` (cutoff, aborts, failover) drives it like any other backend: the backend rewrites the generic
OpenAI body into SGLang's native one (`request_body`) and maps SGLang's answers back onto the OpenAI shape the
client parses (`response`, `chunk`): per choice `text`, `token_ids`, `logprobs.token_logprobs`,
`prompt_token_ids` (when known) and `finish_reason`, plus `usage`.

Native request: `{"text" | "input_ids", "sampling_params": {...}, "rid", "return_logprob": true, "stream"}`; a
prompt given as token ids is a `TokenPrompt` (a `str` carrying `token_ids`, so it passes through
`Request.prompt` unchanged). Native answer: `{"text", "output_ids", "meta_info": {"finish_reason": {"type":
"stop" | "length" | "abort", ...}, "prompt_tokens", "completion_tokens", "output_token_logprobs": [[logprob,
token_id, text], ...], "weight_version", "top_p_token_ids", "top_p_token_offsets"}}` (a list of those when
`n > 1`; the top-p arrays only from SGLang with slime's patch, when `sampling_params.custom_params` asks for them:
kept as `Choice.top_p`, and the reported `weight_version` as `Choice.served_version`). Streamed events are cumulative by
default and deltas with `--incremental-streaming-output`; `meta_info.completion_tokens` is cumulative in both,
so each event's new tokens are the last `completion_tokens - seen` entries of its lists. A choice SGLang aborted
itself (`finish_reason.type == "abort"`: an operator's abort, a weight update) is unfinished work, reported as a
replica error so the executor re-dispatches it.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp

from tailsieve.engines.transport.backends import EngineBackend, SGLangBackend, register_backend
from tailsieve.engines.transport.types import Api, ClientOptions, Endpoint, Request

__all__ = ["SGLangNativeBackend", "TokenPrompt", "finish_type", "int32_list"]

# Top-level fields of SGLang's GenerateReqInput that a `SamplingParams.extra` entry may set; any other extra
# goes into `sampling_params` (no_stop_trim, stop_token_ids, skip_special_tokens, min_new_tokens, ...).
_TOP_LEVEL = frozenset({"return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs",
                        "image_data", "lora_path", "custom_logit_processor", "return_routed_experts", "priority",
                        "session_params", "bootstrap_host", "bootstrap_port", "bootstrap_room"})
_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "max_tokens": "max_new_tokens",
             "stop": "stop", "ignore_eos": "ignore_eos", "presence_penalty": "presence_penalty", "n": "n",
             "seed": "sampling_seed"}
# OpenAI-only fields (the native body always asks for logprobs: `return_logprob`)
_OPENAI_ONLY = frozenset({"model", "prompt", "messages", "stream", "stream_options", "rid", "logprobs", "top_logprobs",
                          "return_token_ids"})


class TokenPrompt(str):
    """A prompt given as token ids: its text is the `str` value (what text-only backends send); the native
    backend sends `token_ids` as `input_ids`."""

    token_ids: tuple[int, ...]

    def __new__(cls, token_ids: Sequence[int], text: str = "") -> TokenPrompt:
        obj = super().__new__(cls, text)
        obj.token_ids = tuple(int(t) for t in token_ids)
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (TokenPrompt, (self.token_ids, str(self)))


def finish_type(reason: Any) -> str | None:
    """SGLang's finish reason (`{"type": "stop", ...}`, a plain string, or None while running) as one word."""
    if reason is None:
        return None
    if isinstance(reason, Mapping):
        kind = reason.get("type")
        return None if kind is None else str(kind)
    return str(reason)


@dataclass(slots=True)
class _Seen:
    """What a streamed choice has reported so far (to turn cumulative events into deltas)."""

    tokens: int = 0
    text: str = ""
    prompt_sent: bool = False
    cumulative: bool | None = None  # decided by the first event whose lists hold more than its new tokens

    def text_delta(self, text: str) -> str:
        """The new text of an event (all of it when the stream is incremental; none when it carries none)."""
        if not text:
            return ""
        if self.cumulative:
            delta = text[len(self.text):] if text.startswith(self.text) else text
            self.text = text
            return delta
        self.text += text
        return text


@dataclass(slots=True)
class _Streams:
    by_key: dict[tuple[str, int], _Seen] = field(default_factory=dict)

    def get(self, rid: str, index: int) -> _Seen:
        return self.by_key.setdefault((rid, index), _Seen())

    def drop(self, rid: str) -> None:
        for key in [k for k in self.by_key if k[0] == rid]:
            del self.by_key[key]


def _native_body(body: Mapping[str, Any], req: Request, options: ClientOptions) -> dict[str, Any]:
    """The generic OpenAI body (sampling fields, prompt or messages, stream, seed, n, extras) as SGLang's native
    `/generate` body."""
    sampling: dict[str, Any] = {}
    top: dict[str, Any] = {}
    for key, value in body.items():
        if key in _OPENAI_ONLY:
            continue
        if key in _SAMPLING:
            if key != "n" or int(value) != 1:
                sampling[_SAMPLING[key]] = value
        elif key in _TOP_LEVEL:
            top[key] = value
        else:
            sampling[key] = value
    out: dict[str, Any] = {}
    if isinstance(req.prompt, TokenPrompt):
        out["input_ids"] = list(req.prompt.token_ids)
    elif isinstance(req.prompt, str):
        out["text"] = req.prompt
    else:
        out["text"] = "\n\n".join(c for _, c in req.prompt)
    out |= {"sampling_params": sampling, "rid": req.rid, "return_logprob": True, **top}
    if body.get("stream"):
        out["stream"] = True
    return out


def _token_lists(meta: Mapping[str, Any], output_ids: Any) -> tuple[list[int], list[Any] | None]:
    """Token ids and their logprobs (as sent: `replies` checks them) from the `output_token_logprobs` triples
    when present, else `output_ids`."""
    triples = meta.get("output_token_logprobs")
    if isinstance(triples, list) and triples:
        return [int(t[1]) for t in triples], [t[0] for t in triples]
    return [int(t) for t in (output_ids or [])], None


def _prompt_ids(req: Request, meta: Mapping[str, Any]) -> list[int] | None:
    """The prompt's token ids: the ones sent, else SGLang's prompt logprobs (when it returned them)."""
    if isinstance(req.prompt, TokenPrompt):
        return list(req.prompt.token_ids)
    triples = meta.get("input_token_logprobs")
    if isinstance(triples, list) and triples and meta.get("prompt_tokens") == len(triples):
        return [int(t[1]) for t in triples]
    return None


def _choice(index: int, text: str, ids: list[int], lps: list[float] | None, finish: str | None,
            meta: Mapping[str, Any], prompt_ids: list[int] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"index": index, "text": text, "token_ids": ids, "finish_reason": finish}
    if lps is not None:
        out["logprobs"] = {"token_logprobs": lps}
    if prompt_ids is not None:
        out["prompt_token_ids"] = prompt_ids
    if meta.get("weight_version") is not None:
        out["weight_version"] = meta["weight_version"]
    for key, names in _TOP_P_KEYS:
        found = next((meta[n] for n in names if meta.get(n) is not None), None)
        if found is not None:
            out[key] = int32_list(found, key)
    return out


# slime's names for the top-p kept token ids and their offsets in `meta_info` (slime/utils/misc.py)
_TOP_P_KEYS = (("top_p_token_ids", ("top_p_token_ids", "top_p_kept_token_ids")),
               ("top_p_token_offsets", ("top_p_token_offsets", "top_p_kept_token_offsets")))


def int32_list(value: Any, what: str) -> list[int]:
    """An int32 array of `meta_info`: a list of integers, or base64 of little-endian int32 (SGLang's packed form)."""
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise ValueError(f"meta_info.{what} is {type(value).__name__}, expected a list or base64 text")
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (ValueError, UnicodeError):
        raise ValueError(f"meta_info.{what} is not base64") from None
    if len(raw) % 4:
        raise ValueError(f"meta_info.{what} holds {len(raw)} bytes, not a whole number of int32s")
    return [v for (v,) in struct.iter_unpack("<i", raw)]


def _aborted(req: Request) -> ValueError:
    return ValueError(f"request {req.rid} was aborted by the server (finish_reason abort)")


@register_backend("sglang-native")
class SGLangNativeBackend(EngineBackend):
    """SGLang's native `/generate` (token ids and logprobs) and `/abort_request` by request id; weight updates and
    the reported weight version as SGLang's OpenAI backend (`/update_weights_from_disk`, `GET /model_info`)."""

    abort_timeout_s: ClassVar[float] = 2.0
    health_paths: ClassVar[tuple[str, ...]] = ("/health", "/get_model_info")
    version_paths: ClassVar[tuple[str, ...]] = SGLangBackend.version_paths
    update_weights = SGLangBackend.update_weights

    def __init__(self) -> None:
        self._streams = _Streams()

    def path(self, options: ClientOptions) -> str:
        """Always `/generate` (chat prompts are sent as their joined text)."""
        return "/generate"

    def request_body(self, body: dict[str, Any], req: Request, options: ClientOptions) -> dict[str, Any]:
        """The native body (see the module docstring)."""
        if options.api is Api.CHAT and not isinstance(req.prompt, str):
            req = Request(req.rid, "\n\n".join(c for _, c in req.prompt), req.n, req.seed, req.max_tokens)
        return _native_body(body, req, options)

    async def abort(self, session: aiohttp.ClientSession, endpoint: Endpoint, req: Request) -> None:
        """POST `/abort_request {"rid": ...}`; the request's stream bookkeeping is dropped."""
        self._streams.drop(req.rid)
        async with session.post(endpoint.target("/abort_request"), json={"rid": req.rid},
                                timeout=aiohttp.ClientTimeout(total=self.abort_timeout_s)):
            pass

    def response(self, data: Any, req: Request) -> Any:
        """A native answer (one dict, or a list when n > 1) in OpenAI form."""
        outs = data if isinstance(data, list) else [data]
        choices: list[dict[str, Any]] = []
        prompt_tokens = completion = 0
        for i, out in enumerate(outs):
            if not isinstance(out, Mapping):
                raise ValueError("native /generate answer is not an object")
            meta = out.get("meta_info") or {}
            finish = finish_type(meta.get("finish_reason"))
            if finish == "abort":
                raise _aborted(req)
            ids, lps = _token_lists(meta, out.get("output_ids"))
            choices.append(_choice(int(out.get("index", i)), str(out.get("text") or ""), ids, lps, finish, meta,
                                   _prompt_ids(req, meta)))
            prompt_tokens = int(meta.get("prompt_tokens") or prompt_tokens)
            completion += int(meta.get("completion_tokens") or len(ids))
        return {"choices": choices, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion}}

    def chunk(self, chunk: dict[str, Any], req: Request) -> dict[str, Any]:
        """One native stream event (cumulative or incremental) as an OpenAI chunk carrying only what is new."""
        if chunk.get("error"):
            return chunk
        meta = chunk.get("meta_info") or {}
        index = int(chunk.get("index", 0))
        seen = self._streams.get(req.rid, index)
        finish = finish_type(meta.get("finish_reason"))
        if finish == "abort":
            self._streams.drop(req.rid)
            return {"error": {"message": str(_aborted(req)), "code": 503}}
        ids, lps = _token_lists(meta, chunk.get("output_ids"))
        total = int(meta.get("completion_tokens") or (seen.tokens + len(ids)))
        new = max(0, min(total - seen.tokens, len(ids)))
        if seen.cumulative is None and len(ids) != new:
            seen.cumulative = len(ids) == total
        ids, lps = ids[len(ids) - new:], None if lps is None else lps[len(lps) - new:]
        delta = seen.text_delta(str(chunk.get("text") or ""))
        seen.tokens = total
        prompt_ids = None if seen.prompt_sent else _prompt_ids(req, meta)
        seen.prompt_sent = seen.prompt_sent or prompt_ids is not None
        if finish is not None:
            del self._streams.by_key[(req.rid, index)]
        usage = {"prompt_tokens": int(meta.get("prompt_tokens") or 0), "completion_tokens": total}
        return {"choices": [_choice(index, delta, ids, lps, finish, meta, prompt_ids)], "usage": usage}
