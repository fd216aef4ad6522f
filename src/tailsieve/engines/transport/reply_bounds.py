"""What a reply may hold, by size: the byte cap of a generation's reply (`reply_limit`, from its n, max_tokens and
prompt), the one cap of every reply that is not a generation (`CONTROL_REPLY_BYTES`: `/v1/models`, `/metrics`, the
weight-version reads, the answers to weight updates, sglang-router's worker list), both read with the bound before
anything is parsed (`read_capped`, `read_body`; `read_capped_file` for a blocking reply), the most of a 4xx/5xx
reply read for its message (`ERROR_BODY_BYTES`, `error_message`), and the prompt token ids a reply may carry
(`check_prompt_ids`: the very ids sent, or one list for every choice and event, as many as `usage.prompt_tokens` and
at most `prompt_ids_bound`). A breach is a `ReplyError` (`replies.py`), which the client reports as `BadReply`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Protocol

import aiohttp

from tailsieve.engines.transport.replies import ReplyError
from tailsieve.engines.transport.types import Completion, Request
from tailsieve.redact import clip, redact

REPLY_BASE_BYTES = 1 << 20  # a reply's size cap: this, plus per choice ...
BYTES_PER_TOKEN = 4096  # ... per generated token (a streamed event per token: ids, text, logprobs, usage) ...
BYTES_PER_ID = 16  # ... and per prompt token id it may echo back (an id of up to 10 digits and its separators)
IDS_PER_PROMPT_BYTE = 4  # a prompt's token ids: at most this many per byte of its text (or per id sent) ...
TEMPLATE_TOKENS = 4096  # ... plus what the server adds (BOS, a chat template's roles and system prompt)
CONTROL_REPLY_BYTES = 4 << 20  # any reply that is not a generation: /v1/models, /metrics, versions, updates
ERROR_BODY_BYTES = 64 << 10  # the most of a 4xx/5xx reply's body read for its message (the rest is never read)


class _Readable(Protocol):
    def read(self, amt: int, /) -> bytes: ...


def _prompt_bytes(req: Request) -> int:
    """A prompt's size: its UTF-8 bytes (chat: roles and contents), an id sent counting as 4 bytes."""
    if isinstance(req.prompt, str):
        return len(req.prompt.encode("utf-8", "replace")) + 4 * len(getattr(req.prompt, "token_ids", ()))
    return sum(len(r) + len(c.encode("utf-8", "replace")) for r, c in req.prompt)


def prompt_ids_bound(req: Request) -> int:
    """The most prompt token ids a reply to `req` may carry."""
    return IDS_PER_PROMPT_BYTE * _prompt_bytes(req) + TEMPLATE_TOKENS


def reply_limit(req: Request, max_tokens: int) -> int:
    """The most bytes the reply to `req` (n choices of at most `max_tokens` tokens) may take; a larger one is a
    `ReplyError` before it is parsed. A prompt's size counts too (servers may echo its token ids per choice)."""
    return REPLY_BASE_BYTES + req.n * (max_tokens * BYTES_PER_TOKEN + prompt_ids_bound(req) * BYTES_PER_ID)


def check_size(size: int, limit: int, cap: str = "its n and max_tokens") -> None:
    """A reply of `size` bytes so far must stay within `limit` (`cap`: what the limit is for, for the message)."""
    if size > limit:
        raise ReplyError(f"reply is over {limit} bytes (the cap for {cap})")


async def read_capped(chunks: AsyncIterator[bytes], limit: int, declared: int | None = None,
                      cap: str = "its n and max_tokens") -> bytes:
    """A whole body of at most `limit` bytes: a declared (Content-Length) or received size past it is a
    `ReplyError` at once, so the rest is never read and none of it is parsed."""
    if declared is not None:
        check_size(declared, limit, cap)
    parts: list[bytes] = []
    size = 0
    async for data in chunks:
        size += len(data)
        check_size(size, limit, cap)
        parts.append(data)
    return b"".join(parts)


async def read_body(resp: aiohttp.ClientResponse, what: str) -> bytes:
    """The body of a reply that is not a generation (`what`: the endpoint, for the message), at most
    `CONTROL_REPLY_BYTES` (decompressed), read with that bound like a generation's."""
    return await read_capped(resp.content.iter_any(), CONTROL_REPLY_BYTES, resp.content_length, f"a {what} reply")


def read_capped_file(fh: _Readable, limit: int, declared: int | None = None,
                     cap: str = "its n and max_tokens") -> bytes:
    """`read_capped` for a blocking reply (`urllib`'s response): at most `limit` bytes, one byte more is never kept
    and a larger one is a `ReplyError` before any of it is parsed."""
    if declared is not None:
        check_size(declared, limit, cap)
    data = fh.read(limit + 1)
    check_size(len(data), limit, cap)
    return data


async def error_message(resp: aiohttp.ClientResponse) -> str:
    """What a 4xx/5xx reply says, as an error message quotes it: at most `ERROR_BODY_BYTES` of its body, its JSON
    `error.message` (or `message`) when it is JSON, on one line, redacted and clipped (`redact.clip`); the HTTP
    reason when the body says nothing. The server's text is redacted before it is parsed too (it may echo headers)."""
    parts: list[bytes] = []
    size = 0
    try:
        async for data in resp.content.iter_any():
            parts.append(data)
            size += len(data)
            if size >= ERROR_BODY_BYTES:
                break
    except (aiohttp.ClientError, OSError, TimeoutError):
        pass
    text = redact(b"".join(parts)[:ERROR_BODY_BYTES].decode("utf-8", "replace"))
    try:
        obj = json.loads(text)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = str(err.get("message", err) if isinstance(err, dict) else err)
    except (ValueError, RecursionError):
        msg = text
    msg = " ".join(msg.split())
    return clip(msg) if msg else (resp.reason or "")


def check_prompt_ids(req: Request, comp: Completion) -> Completion:
    """The prompt token ids of a reply must be the prompt's: the very ids sent (a prompt sent as ids); else one list
    for every choice, as many ids as `usage.prompt_tokens` (when reported) and at most `prompt_ids_bound`."""
    sent = getattr(req.prompt, "token_ids", None)
    bound = prompt_ids_bound(req)
    first: tuple[int, ...] | None = None
    for c in comp.choices:
        ids = c.prompt_token_ids
        if ids is None:
            continue
        if sent is not None and ids != tuple(sent):
            raise ReplyError(f"choice {c.index}: prompt_token_ids differ from the {len(sent)} token ids sent")
        if len(ids) > bound:
            raise ReplyError(f"choice {c.index}: {len(ids)} prompt_token_ids for a prompt of {_prompt_bytes(req)} "
                             f"bytes (at most {bound})")
        if comp.prompt_tokens and len(ids) != comp.prompt_tokens:
            raise ReplyError(f"choice {c.index}: {len(ids)} prompt_token_ids but usage.prompt_tokens is "
                             f"{comp.prompt_tokens}")
        if first is not None and ids != first:
            raise ReplyError(f"choice {c.index}: prompt_token_ids differ from another choice's (one prompt)")
        first = ids
    return comp


__all__ = ["BYTES_PER_ID", "BYTES_PER_TOKEN", "CONTROL_REPLY_BYTES", "ERROR_BODY_BYTES", "IDS_PER_PROMPT_BYTE",
           "REPLY_BASE_BYTES", "TEMPLATE_TOKENS", "check_prompt_ids", "check_size", "error_message", "prompt_ids_bound",
           "read_body", "read_capped", "read_capped_file", "reply_limit"]
