"""The one validation boundary for server replies: every reply is untrusted until parsed here into frozen records.

`parse_full` turns a non-streamed response (in OpenAI form, after the backend's `response` hook) into a `Completion`;
`parse_chunk` turns one streamed `data:` event into a `Chunk`, and `StreamAcc` (`stream_replies.py`) folds the chunks of
one request into a `Completion`. Anything that breaks the protocol raises `ReplyError` with a one-line reason, which the
client reports as `BadReply` (a `ReplicaFault` of kind `bad-reply`): the replica is marked down and its work is
re-dispatched. Checked: JSON only (no NaN/Infinity), objects where objects belong, `choices` a list of objects, `index`
an integer in [0, n) and never repeated, exactly n finished choices (each with a `finish_reason` the protocol defines as
complete: `stop` or `length`; `abort`, vLLM's answer for a server-side abort with partial output, and any unknown reason
are the replica's fault), text a string, token ids and counts non-negative integers, token counts within n × max_tokens,
token ids that match the text (no text without ids) and the counts (usage, tokens counted), and logprobs finite and
<= 0 (`null`, `1e999` or `7.5` is not a log-probability; no JSON number past a double's range is read). What a reply
may hold by size lives in `reply_bounds.py`: a reply no larger than `reply_limit` bytes (read with that bound before
anything is parsed), `CONTROL_REPLY_BYTES` for every reply that is not a generation (`read_body`), and prompt token
ids that can be the prompt's (`check_prompt_ids`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import orjson  # a C parser: several times faster per stream event; strict RFC 8259 like `loads` below

from tailsieve.engines.transport.types import (
    Choice,
    Completion,
    FaultKind,
    ReplicaFault,
    TopPTokens,
)

MAX_PROMPT_TOKENS = 2**31 - 1
MAX_TOKEN_ID = 2**32
FINISH_REASONS = frozenset({"stop", "length"})  # the only reasons that make a choice a complete sample


class ReplyError(ValueError):
    """A reply that breaks the protocol (one-line reason, no server text beyond a short quote)."""


class BadReply(ReplicaFault):
    """A replica's reply failed validation: mark it down, re-dispatch its work."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(url, FaultKind.BAD_REPLY, detail)


def _reject_constant(name: str) -> Any:
    raise ReplyError(f"JSON constant {name} is not allowed")


def _finite(text: str) -> float:
    """A JSON number that fits a double (`1e999` does not: it would be stored as `Infinity`)."""
    value = float(text)
    if not math.isfinite(value):
        raise ReplyError(f"number {text[:40]} is out of range")
    return value


_DIGITS = bytes(48 if 48 <= c <= 57 else 32 for c in range(256))  # translate table: digits → "0", the rest → " "
_LONG_RUN = b"0" * 19  # 19 digits may exceed 64 bits


def _long_digits(payload: bytes) -> bool:
    """Whether the payload holds a run of 19 or more digits (two C passes: ~20x faster than a regex search)."""
    return _LONG_RUN in payload.translate(_DIGITS)


def loads(payload: bytes | str) -> Any:
    """Strict JSON: NaN and ±Infinity are protocol violations, not numbers. orjson parses what it accepts; anything
    it refuses goes through the standard library, whose answer (value or `ReplyError`) is the reference."""
    # orjson turns integers past 64 bits into floats: those (and text) take the stdlib path
    if isinstance(payload, bytes) and not _long_digits(payload):
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(payload, parse_constant=_reject_constant, parse_float=_finite)
    except ReplyError:
        raise
    except ValueError as exc:
        raise ReplyError(f"not JSON ({str(exc).splitlines()[0][:80]})") from None


def _quote(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def count(v: Any, what: str, hi: int) -> int:
    """A token count: an integer (not a bool) in [0, hi]."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
        raise ReplyError(f"{what} is {_quote(v)}, expected an integer in [0, {hi}]")
    return v


def _obj(v: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise ReplyError(f"{what} is {type(v).__name__}, expected an object")
    return v


def _opt_obj(v: Any, what: str) -> Mapping[str, Any]:
    return {} if v is None else _obj(v, what)


def _ids(v: Any, what: str) -> tuple[int, ...] | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise ReplyError(f"{what} is {type(v).__name__}, expected a list")
    if not v:
        return ()
    if set(map(type, v)) == {int} and min(v) >= 0 and max(v) <= MAX_TOKEN_ID:  # the usual reply, checked in C
        return tuple(v)
    return tuple(count(t, what, MAX_TOKEN_ID) for t in v)


def _lp(v: Any) -> float:
    """A sampled token's log-probability: a finite number <= 0 (`null` is not one)."""
    try:
        x = float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan
    except OverflowError:  # an integer past a double's range
        x = math.nan
    if not (math.isfinite(x) and x <= 0):
        raise ReplyError(f"logprob is {_quote(v)}, expected a finite number <= 0")
    return x


def _logprobs(ch: Mapping[str, Any]) -> tuple[float, ...] | None:
    """Sampled-token log-probabilities (completions: `token_logprobs`; chat: `content[].logprob`)."""
    lp = ch.get("logprobs")
    if lp is None:
        return None
    lp = _obj(lp, "logprobs")
    if lp.get("token_logprobs") is not None:
        raw = lp["token_logprobs"]
        if not isinstance(raw, list):
            raise ReplyError("logprobs.token_logprobs is not a list")
        if raw and set(map(type, raw)) == {float} and -math.inf < min(raw) and max(raw) <= 0:
            return tuple(raw)  # the usual reply, checked in C (JSON parsing never yields NaN)
        return tuple(_lp(x) for x in raw)
    if lp.get("content") is not None:
        raw = lp["content"]
        if not isinstance(raw, list):
            raise ReplyError("logprobs.content is not a list")
        return tuple(_lp(_obj(c, "logprobs.content[]").get("logprob")) for c in raw)
    return None


def _text(ch: Mapping[str, Any], i: int) -> str | None:
    """A choice's text: `text` (completions), else `message.content` / `delta.content` (chat); None when absent."""
    if "text" in ch and ch["text"] is not None:
        raw = ch["text"]
    else:
        inner = ch.get("message") if ch.get("message") is not None else ch.get("delta")
        raw = _opt_obj(inner, f"choice {i} message").get("content")
    if raw is not None and not isinstance(raw, str):
        raise ReplyError(f"choice {i} text is {type(raw).__name__}, expected a string")
    return raw


@dataclass(frozen=True, slots=True)
class ReplyChoice:
    """One validated choice (a whole one, or what a stream chunk adds to it)."""

    index: int
    text: str | None
    token_ids: tuple[int, ...] | None
    finish_reason: str | None
    logprobs: tuple[float, ...] | None
    prompt_token_ids: tuple[int, ...] | None
    served_version: str | None = None
    top_p: TopPTokens | None = None

    @property
    def progress(self) -> bool:
        """Whether it carries generated tokens or finishes its choice (what resets the stall timer)."""
        return bool(self.text or self.token_ids or self.finish_reason is not None)


@dataclass(frozen=True, slots=True)
class Usage:
    """Validated token counts (`completion_tokens` None: not reported)."""

    prompt_tokens: int = 0
    completion_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Chunk:
    """One validated stream event."""

    choices: tuple[ReplyChoice, ...]
    usage: Usage | None

    @property
    def progress(self) -> bool:
        """Whether any choice made progress."""
        return any(c.progress for c in self.choices)


def _choice(raw: Any, position: int, n: int, outer: Mapping[str, Any],
            reasons: frozenset[str] = FINISH_REASONS) -> ReplyChoice:
    ch = _obj(raw, f"choice {position}")
    if "index" in ch:
        i = ch["index"]
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise ReplyError(f"choice index is {_quote(i)}, expected an integer in [0, {n})")
    elif position < n:
        i = position
    else:
        raise ReplyError(f"choice {position} has no index and there are only {n} choice(s)")
    finish = ch.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise ReplyError(f"choice {i} finish_reason is {_quote(finish)}, expected a string")
    if finish and finish not in reasons:
        raise ReplyError(f"choice {i} finish_reason is {_quote(finish)}, not a complete sample (stop or length)")
    pids = ch.get("prompt_token_ids") if ch.get("prompt_token_ids") is not None else outer.get("prompt_token_ids")
    version = ch.get("weight_version")
    return ReplyChoice(i, _text(ch, i), _ids(ch.get("token_ids"), f"choice {i} token_ids"), finish or None,
                       _logprobs(ch), _ids(pids, "prompt_token_ids"), None if version is None else str(version),
                       _top_p(ch, i))


def _top_p(ch: Mapping[str, Any], i: int) -> TopPTokens | None:
    """`top_p_token_ids` and `top_p_token_offsets` (both or neither) as `TopPTokens`; offsets start at 0, never
    decrease and end at the number of ids."""
    ids, offsets = ch.get("top_p_token_ids"), ch.get("top_p_token_offsets")
    if ids is None and offsets is None:
        return None
    kept, offs = _ids(ids, f"choice {i} top_p_token_ids"), _ids(offsets, f"choice {i} top_p_token_offsets")
    if kept is None or offs is None:
        raise ReplyError(f"choice {i} has top_p_token_ids or top_p_token_offsets without the other")
    if not offs or offs[0] != 0 or offs[-1] != len(kept) or any(a > b for a, b in pairwise(offs)):
        raise ReplyError(f"choice {i} top_p_token_offsets do not index its {len(kept)} top_p_token_ids")
    return TopPTokens(kept, offs)


def _usage(raw: Any, n: int, cap: int) -> Usage | None:
    if raw is None:
        return None
    u = _obj(raw, "usage")
    done = u.get("completion_tokens")
    return Usage(count(u.get("prompt_tokens") or 0, "usage.prompt_tokens", MAX_PROMPT_TOKENS),
                 None if done is None else count(done, "usage.completion_tokens", n * cap))


def _choices(obj: Mapping[str, Any], n: int, *, required: bool,
             reasons: frozenset[str] = FINISH_REASONS) -> tuple[ReplyChoice, ...]:
    raw = obj.get("choices")
    if raw is None and not required:
        return ()
    if not isinstance(raw, list):
        raise ReplyError(f"'choices' is {type(raw).__name__}, expected a list")
    return tuple(_choice(c, k, n, obj, reasons) for k, c in enumerate(raw))


def parse_chunk(obj: Any, n: int, cap: int) -> Chunk:
    """One stream event (OpenAI chunk form) → `Chunk`; a violation raises `ReplyError`."""
    o = _obj(obj, "stream chunk")
    return Chunk(_choices(o, n, required=False), _usage(o.get("usage"), n, cap))


def parse_full(obj: Any, n: int, cap: int, latency_s: float,
               reasons: frozenset[str] = FINISH_REASONS) -> Completion:
    """A non-streamed response → `Completion` with exactly n finished choices (`reasons`: the finish reasons that
    end one; a caller that hands partial samples on adds `abort`); a violation raises `ReplyError`.
    Per-choice tokens: the token ids, else usage (n = 1), else max_tokens for `length`, else an even share."""
    o = _obj(obj, "response")
    got = _choices(o, n, required=True, reasons=reasons)
    usage = _usage(o.get("usage"), n, cap) or Usage()
    by_index = {c.index: c for c in got}
    if len(by_index) != len(got):
        raise ReplyError("a choice index is repeated")
    if len(got) != n:
        raise ReplyError(f"{len(got)} choices returned, {n} requested")
    total = usage.completion_tokens or 0
    out: list[Choice] = []
    for i in range(n):
        c = by_index[i]
        if c.finish_reason is None:
            raise ReplyError(f"choice {i} has no finish_reason")
        ids_match_text(i, c.text, c.token_ids)
        if c.token_ids is not None:
            tokens = count(len(c.token_ids), f"choice {i} token count", cap)
        elif n == 1:
            tokens = total
        else:
            tokens = cap if c.finish_reason == "length" else round(total / n)
        out.append(Choice(i, c.text or "", tokens, c.finish_reason, c.token_ids, c.logprobs, c.prompt_token_ids,
                          c.served_version, c.top_p))
    usage_matches_ids(usage.completion_tokens, out)
    return Completion(aligned(tuple(out), usage.completion_tokens), usage.prompt_tokens, latency_s, None)


def ids_match_text(i: int, text: str | None, ids: tuple[int, ...] | list[int] | None) -> None:
    """Token ids, when a server sends them, are the sample: text with an empty id list is not one."""
    if ids is not None and text and not ids:
        raise ReplyError(f"choice {i} has text but no token ids")


def usage_matches_ids(reported: int | None, choices: list[Choice] | tuple[Choice, ...]) -> None:
    """The reported completion tokens must equal the token ids returned (when every choice has its ids)."""
    if reported is None or any(c.token_ids is None for c in choices):
        return
    held = sum(len(c.token_ids or ()) for c in choices)
    if held != reported:
        raise ReplyError(f"usage.completion_tokens is {reported} but the choices carry {held} token ids")


def aligned(choices: tuple[Choice, ...], total: int | None = None) -> tuple[Choice, ...]:
    """Logprobs must describe the returned tokens one to one (a trainer pairs them), whether or not token ids come:
    against the ids when they do, else against `total`, the completion tokens the server's usage reports (the sum
    over the choices that carry logprobs without ids; issue 49); and top-p offsets have one entry per token and one
    more."""
    for c in choices:
        if c.logprobs is not None and c.token_ids is not None and len(c.logprobs) != len(c.token_ids):
            raise ReplyError(f"choice {c.index}: {len(c.logprobs)} logprobs for {len(c.token_ids)} tokens")
        if c.top_p is not None and len(c.top_p.offsets) != c.tokens + 1:
            raise ReplyError(f"choice {c.index}: {len(c.top_p.offsets)} top_p_token_offsets for {c.tokens} tokens "
                             "(expected one per token and one more)")
    if total is not None and choices and all(c.logprobs is not None for c in choices):
        held = sum(len(c.logprobs or ()) for c in choices)
        if held != total:
            raise ReplyError(f"{held} logprobs for the {total} completion tokens the usage reports (one per token)")
    return choices


def model_names(obj: Any) -> list[str]:
    """The served names of a `/v1/models` reply (`{"data": [{"id": ...}, ...]}`)."""
    data = _obj(obj, "/v1/models reply").get("data")
    if not isinstance(data, list):
        raise ReplyError(f"/v1/models 'data' is {type(data).__name__}, expected a list")
    return [m["id"] for m in data if isinstance(m, Mapping) and isinstance(m.get("id"), str) and m["id"]]


__all__ = ["FINISH_REASONS", "BadReply", "Chunk", "ReplyChoice", "ReplyError", "Usage", "aligned", "count",
           "ids_match_text", "loads", "model_names", "parse_chunk", "parse_full", "usage_matches_ids"]
