"""A streamed reply, after `replies.parse_chunk` has validated each event: `StreamAcc` folds one request's chunks into
its `Completion` (the same checks as `replies.parse_full` on the whole), and `raise_stream_error` turns an error event
inside a stream into the request's fault (4xx) or the replica's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tailsieve.engines.transport.replies import (
    Chunk,
    ReplyError,
    aligned,
    count,
    ids_match_text,
    usage_matches_ids,
)
from tailsieve.engines.transport.types import (
    Choice,
    Completion,
    FaultKind,
    Progress,
    ReplicaFault,
    RequestRejected,
    TopPTokens,
)
from tailsieve.redact import clip, redact


@dataclass(slots=True)
class _Acc:
    text: list[str] = field(default_factory=list)
    ids: list[int] | None = None
    finish: str | None = None
    tokens: int = 0
    logprobs: list[float] | None = None
    prompt_ids: tuple[int, ...] | None = None
    served_version: str | None = None  # the latest event's
    top_p: TopPTokens | None = None  # the latest event's (SGLang sends the whole response's in its last event)


class StreamAcc:
    """Folds the validated chunks of one streamed request into its `Completion`; `progress[i]` mirrors choice i's
    tokens so far (and, for a `Progress`, `progress.texts[i]` its text)."""

    def __init__(self, n: int, cap: int, progress: list[int]) -> None:
        self.n, self.cap, self.progress = n, cap, progress
        self.texts = progress.texts if isinstance(progress, Progress) else None  # text so far per choice
        self.accs = [_Acc() for _ in range(n)]
        self.prompt_tokens = 0
        self.final_tokens: int | None = None  # completion tokens of the usage-only event (all choices)
        self.usage_tokens: int | None = None  # the latest usage's completion tokens (all choices so far)

    def add(self, chunk: Chunk) -> None:
        """Apply one chunk (token counts past max_tokens are a `ReplyError`)."""
        u = chunk.usage
        if u is not None:
            self.prompt_tokens = u.prompt_tokens or self.prompt_tokens
            if u.completion_tokens is not None:
                self.usage_tokens = u.completion_tokens
        single = self.n == 1 and u is not None and u.completion_tokens is not None
        for c in chunk.choices:
            a = self.accs[c.index]
            if c.logprobs is not None:
                if a.logprobs is None:
                    a.logprobs = []
                a.logprobs.extend(c.logprobs)  # in place: a long stream of one-token chunks stays linear
            if c.prompt_token_ids is not None:
                if a.prompt_ids is not None and c.prompt_token_ids != a.prompt_ids:
                    raise ReplyError(f"choice {c.index}: prompt_token_ids change within the stream (one prompt)")
                a.prompt_ids = c.prompt_token_ids
            a.served_version = c.served_version or a.served_version
            a.top_p = c.top_p or a.top_p
            if c.text:
                a.text.append(c.text)
                if self.texts is not None:
                    self.texts[c.index].append(c.text)
            if c.token_ids is not None:
                if a.ids is None:
                    a.ids = []
                a.ids.extend(c.token_ids)
                a.tokens = count(a.tokens + len(c.token_ids), f"choice {c.index} token count", self.cap)
            elif single and len(chunk.choices) == 1 and u is not None:
                a.tokens = u.completion_tokens or 0
            elif c.text:
                a.tokens = min(self.cap, a.tokens + 1)
            if c.finish_reason is not None:
                a.finish = c.finish_reason
            self.progress[c.index] = a.tokens
        if not chunk.choices and u is not None and u.completion_tokens is not None:
            self.final_tokens = u.completion_tokens
            if single:
                self.accs[0].tokens = self.progress[0] = u.completion_tokens

    def result(self, done: bool, latency_s: float, ttft_s: float | None) -> Completion:
        """The finished completion; unfinished choices raise `ReplyError` after `[DONE]`, `EOFError` without it
        (the connection dropped)."""
        left = [i for i, a in enumerate(self.accs) if a.finish is None]
        if left:
            if done:
                raise ReplyError(f"[DONE] before choice {left[0]} finished ({len(left)} of {self.n} unfinished)")
            raise EOFError("stream ended before every choice finished ([DONE] missing)")
        out = tuple(Choice(i, "".join(a.text), a.tokens, a.finish, None if a.ids is None else tuple(a.ids),
                           None if a.logprobs is None else tuple(a.logprobs), a.prompt_ids, a.served_version, a.top_p)
                    for i, a in enumerate(self.accs))
        for c in out:
            ids_match_text(c.index, c.text, c.token_ids)
            if c.token_ids is not None and c.tokens != len(c.token_ids):
                raise ReplyError(f"choice {c.index}: {c.tokens} tokens reported but {len(c.token_ids)} token ids")
        usage_matches_ids(self.final_tokens, out)
        return Completion(aligned(out, self.usage_tokens), self.prompt_tokens, latency_s, ttft_s)


def raise_stream_error(url: str, err: Any) -> None:
    """An error event inside a stream: 4xx codes are the request's fault, anything else the replica's."""
    info = err if isinstance(err, Mapping) else {"message": str(err)}
    msg = clip(" ".join(redact(str(info.get("message", ""))).split()))
    try:
        code = int(info.get("code") or 500)
    except (TypeError, ValueError, OverflowError):
        code = 500
    if 400 <= code < 500 and code not in (408, 429):
        raise RequestRejected(f"{url}: HTTP {code} (in stream): {msg}")
    raise ReplicaFault(url, FaultKind.HTTP_5XX, f"error in stream: {msg}")


__all__ = ["StreamAcc", "raise_stream_error"]
