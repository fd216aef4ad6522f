"""Replies whose values are not what they must be (issue 41), generated: values × endpoints. Each case is one
misbehaving fake server beside a healthy one (`reply_harness.py`): the bad replica is marked down as `bad-reply`,
its work re-dispatched, and the step completes on the healthy replica with every stored value valid.

- logprobs: finite and <= 0 (`1e999` was stored as `Infinity`, `null` as `NaN`, `7.5` as is) on the four vLLM
  shapes (completions/chat × full/stream), and on SGLang's native answers;
- prompt token ids: as many as `usage.prompt_tokens` says, within the prompt's bound, one list per prompt (every
  choice, every event), and the very ids sent when the prompt was sent as ids;
- replies that are not generations (`/v1/models`, `/metrics`, `/weight_info`, `/model_info`, the update answers):
  one byte cap (`CONTROL_REPLY_BYTES`), declared or streamed, refused before parsing (tests/test_reply_sizes.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from bad_fake import BadFake
from engine_fake import FakeServer
from reply_harness import BAD, cfg, check_complete, one_step
from tailsieve.engines.rollout.engine_executor import RequestMode
from tailsieve.engines.transport.backends import get_backend
from tailsieve.engines.transport.engine_client import ClientOptions, Endpoint, EngineClient, Request, SamplingParams
from tailsieve.engines.transport.replies import BadReply, ReplyError, loads, parse_chunk, parse_full
from tailsieve.engines.transport.reply_bounds import IDS_PER_PROMPT_BYTE, TEMPLATE_TOKENS
from tailsieve.engines.transport.sglang_native import TokenPrompt
from tailsieve.engines.transport.stream_replies import StreamAcc
from tailsieve.engines.transport.types import Api

Make = Callable[[dict[str, Any]], str | list[str]]
MARK = '"@VALUE@"'  # a placeholder spliced with raw JSON text (`1e999`, `NaN` cannot be written by json.dumps)

# logprob values as a server sends them (JSON text): each is refused. The first six were stored before issue 41.
LOGPROBS = ("1e999", "-1e999", "null", "7.5", "0.001", "5e-324", "NaN", "-Infinity", '"-0.5"', "true", "[]")
ENDPOINTS = (("completions", "full"), ("completions", "stream"), ("chat", "full"), ("chat", "stream"))


def _n(body: dict[str, Any]) -> int:
    return int(body.get("n", 1))


def _lp_json(chat: bool, values: list[str]) -> str:
    if chat:
        return '{"content": [' + ", ".join(f'{{"token": "x", "logprob": {v}}}' for v in values) + "]}"
    return '{"token_logprobs": [' + ", ".join(values) + "]}"


def _choice(chat: bool, i: int, text: str, ids: list[int], finish: str | None, stream: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"index": i, "token_ids": ids, "finish_reason": finish, "logprobs": "@VALUE@"}
    return out | ({"delta" if stream else "message": {"content": text}} if chat else {"text": text})


def logprob_reply(value: str, stream: bool) -> Make:
    """Two tokens per choice: the first one's logprob -0.5, the second one's `value`."""
    def make(b: dict[str, Any]) -> str | list[str]:
        chat = "messages" in b
        if not stream:
            doc = {"choices": [_choice(chat, i, "xx", [1, 2], "stop", False) for i in range(_n(b))],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 2 * _n(b)}}
            return json.dumps(doc).replace(MARK, _lp_json(chat, ["-0.5", value]))
        return [json.dumps({"choices": [_choice(chat, i, "x", [t + 1], "stop" if t else None, True)]})
                .replace(MARK, _lp_json(chat, ["-0.5" if t == 0 else value])) for i in range(_n(b)) for t in (0, 1)]

    return make


def _check_samples(batch: Any) -> None:
    """Every stored logprob is a finite number <= 0, and the trainer's rows are strict JSON."""
    rows = batch.trainer_samples()
    assert rows and all(r.logprobs is not None for r in rows)
    assert all(math.isfinite(x) and x <= 0 for r in rows for x in r.logprobs or ())
    json.dumps([r.to_json() for r in rows], allow_nan=False)


LOGPROB_CASES = [(v, api, mode) for v in LOGPROBS for api, mode in ENDPOINTS]


@pytest.mark.parametrize(("value", "api", "mode"), LOGPROB_CASES, ids=[f"{v}-{a}-{m}" for v, a, m in LOGPROB_CASES])
def test_a_logprob_that_is_not_finite_and_at_most_zero_is_a_bad_reply(value: str, api: str, mode: str) -> None:
    c = replace(cfg(mode == "stream"), logprobs=True, api=Api(api))
    with BadFake(custom=logprob_reply(value, mode == "stream")) as bad, FakeServer() as good:
        batch, events = asyncio.run(one_step([bad.url, good.url], c))
    check_complete(batch)
    _check_samples(batch)
    downs = [why for i, up, why in events if i == 0 and not up]
    # a number past a double's range or a NaN/Infinity constant is refused by the JSON reader itself
    assert downs and downs[0].startswith(f"{BAD}:") and re.search(r"logprob|out of range|JSON constant", downs[0]), \
        events


def _native(value: Any) -> dict[str, Any]:
    return {"text": "xx", "output_ids": [4, 5],
            "meta_info": {"finish_reason": {"type": "stop"}, "prompt_tokens": 1, "completion_tokens": 2,
                          "output_token_logprobs": [[-0.5, 4, "x"], [value, 5, "x"]]}}


NATIVE = [(v, m) for v in LOGPROBS for m in ("full", "stream")]


@pytest.mark.parametrize(("value", "mode"), NATIVE, ids=[f"{v}-{m}" for v, m in NATIVE])
def test_sglang_native_logprobs_hold_the_same_contract(value: str, mode: str) -> None:
    """SGLang's `output_token_logprobs` go through the same check (a `null` was stored as 0.0 before)."""
    backend, req = get_backend("sglang-native"), Request("r", TokenPrompt([1]))
    raw = json.dumps(_native("@VALUE@")).replace(MARK, value)
    with pytest.raises(ReplyError, match=r"logprob|out of range|JSON constant"):
        obj = loads(raw.encode())
        if mode == "full":
            parse_full(backend.response(obj, req), 1, 16, 0.0)
        else:
            acc = StreamAcc(1, 16, [0])
            acc.add(parse_chunk(backend.chunk(obj, req), 1, 16))
            acc.result(True, 0.0, None)


def test_valid_logprobs_pass_every_shape() -> None:
    """The control: 0, -0.0, -9999.0 (vLLM's floor for -inf) and a tiny negative are kept as they are."""
    obj = loads(json.dumps({"choices": [{"index": 0, "text": "xxxx", "token_ids": [1, 2, 3, 4], "finish_reason":
                                         "stop", "logprobs": {"token_logprobs": [0, -0.0, -9999.0, -5e-324]}}]}))
    got = parse_full(obj, 1, 16, 0.0).choices[0].logprobs
    assert got == (0.0, 0.0, -9999.0, -5e-324)


# ---- prompt token ids --------------------------------------------------------------------------------------------
SHORT = len("prompt number 39")  # the longest prompt of the harness (bytes)
TOO_MANY = IDS_PER_PROMPT_BYTE * SHORT + TEMPLATE_TOKENS + 1


def prompt_ids_reply(per_choice: Callable[[int, int], list[list[int]]], usage: Callable[[int], int | None],
                     stream: bool) -> Make:
    """`per_choice(i, n)`: the prompt ids each event of choice i carries (one event per list; a second token event
    follows without ids); `usage(n)`: usage.prompt_tokens (None: no usage)."""
    def make(b: dict[str, Any]) -> str | list[str]:
        n, chat = _n(b), "messages" in b
        where = "outer" if chat else "choice"

        def doc(i: int, ids: list[int] | None, tok: int, fin: str | None, text: str) -> dict[str, Any]:
            ch = {"index": i, "token_ids": [tok] if stream else [1, 2], "finish_reason": fin}
            ch |= {"delta" if stream else "message": {"content": text}} if chat else {"text": text}
            if ids is not None and where == "choice":
                ch["prompt_token_ids"] = ids
            out: dict[str, Any] = {"choices": [ch]}
            if ids is not None and where == "outer":
                out["prompt_token_ids"] = ids
            return out

        u = usage(n)
        if not stream:
            full = {"choices": [doc(i, per_choice(i, n)[0], 1, "stop", "xx")["choices"][0] for i in range(n)]}
            if chat:
                full["prompt_token_ids"] = per_choice(0, n)[0]
            if u is not None:
                full["usage"] = {"prompt_tokens": u, "completion_tokens": 2 * n}
            return json.dumps(full)
        events, tokens = [], 0
        for i in range(n):
            lists = per_choice(i, n)
            events += [json.dumps(doc(i, ids, 1, None, "x")) for ids in lists]
            events.append(json.dumps(doc(i, None, 2, "stop", "x")))
            tokens += len(lists) + 1
        if u is not None:
            events.append(json.dumps({"choices": [], "usage": {"prompt_tokens": u, "completion_tokens": tokens}}))
        return events

    return make


# variant -> (per_choice, usage, the request modes it applies to, the stream modes it applies to, expected reason)
PROMPT_VARIANTS: dict[str, tuple[Callable[[int, int], list[list[int]]], Callable[[int], int | None],
                                 tuple[RequestMode, ...], tuple[str, ...], str]] = {
    "more-than-the-prompt-can-hold": (lambda i, n: [list(range(TOO_MANY))], lambda n: TOO_MANY,
                                      (RequestMode.SPLIT,), ("full", "stream"), "prompt_token_ids"),
    "usage-disagrees": (lambda i, n: [[5, 6, 7]], lambda n: 4, (RequestMode.SPLIT, RequestMode.N),
                        ("full", "stream"), "usage.prompt_tokens is 4"),
    "events-disagree": (lambda i, n: [[5, 6, 7], [5, 6, 8]], lambda n: 3, (RequestMode.SPLIT,), ("stream",),
                        "prompt_token_ids"),
}
PROMPT_CASES = [(var, api, mode, rm) for var, (_, _, rms, modes, _) in PROMPT_VARIANTS.items()
                for api, mode in ENDPOINTS if mode in modes for rm in rms]


@pytest.mark.parametrize(("variant", "api", "mode", "request_mode"), PROMPT_CASES,
                         ids=[f"{v}-{a}-{m}-{r.value}" for v, a, m, r in PROMPT_CASES])
def test_prompt_ids_that_cannot_be_the_prompt_are_a_bad_reply(variant: str, api: str, mode: str,
                                                              request_mode: RequestMode) -> None:
    per_choice, usage, _, _, reason = PROMPT_VARIANTS[variant]
    c = replace(cfg(mode == "stream", mode=request_mode), api=Api(api))
    with BadFake(custom=prompt_ids_reply(per_choice, usage, mode == "stream")) as bad, FakeServer() as good:
        batch, events = asyncio.run(one_step([bad.url, good.url], c))
    check_complete(batch)
    downs = [why for i, up, why in events if i == 0 and not up]
    assert downs and downs[0].startswith(f"{BAD}:") and reason in downs[0], events
    assert all(len(s.prompt_token_ids or ()) <= 3 for g in batch.groups for s in g.samples)


@pytest.mark.parametrize("stream", [False, True], ids=["full", "stream"])
@pytest.mark.parametrize(("returned", "ok"), [([1, 2, 3], True), ([1, 2, 4], False), ([1, 2], False),
                                              ([1, 2, 3, 3], False)], ids=["same", "other", "fewer", "more"])
def test_prompt_ids_of_a_prompt_sent_as_ids_are_the_ids_sent(returned: list[int], ok: bool, stream: bool) -> None:
    """A prompt sent as token ids (`TokenPrompt`) must come back as exactly those ids."""
    make = prompt_ids_reply(lambda i, n: [returned], lambda n: len(returned), stream)
    req = Request("r", TokenPrompt([1, 2, 3], "abc"))

    async def go() -> Any:
        async with EngineClient(ClientOptions(stream=stream)) as client:
            return await client.complete(Endpoint(bad.url), "m", req, SamplingParams(max_tokens=4))

    with BadFake(custom=make) as bad:
        if ok:
            assert asyncio.run(go()).choices[0].prompt_token_ids == (1, 2, 3)
        else:
            with pytest.raises(BadReply, match=r"prompt_token_ids differ from the 3 token ids sent"):
                asyncio.run(go())


@pytest.mark.parametrize("stream", [False, True], ids=["full", "stream"])
def test_choices_of_one_request_carry_one_prompt(stream: bool) -> None:
    """n = 3 choices of one prompt whose prompt ids differ (completions: ids per choice) are a bad reply."""
    make = prompt_ids_reply(lambda i, n: [[5, 6, 7 + i]], lambda n: 3, stream)

    async def go() -> Any:
        async with EngineClient(ClientOptions(stream=stream)) as client:
            return await client.complete(Endpoint(bad.url), "m", Request("r", "prompt", n=3),
                                         SamplingParams(max_tokens=4))

    with BadFake(custom=make) as bad, pytest.raises(BadReply, match=r"choice 1: prompt_token_ids differ from another "
                                                                    r"choice's \(one prompt\)"):
        asyncio.run(go())


def test_a_consistent_prompt_id_list_passes() -> None:
    """The control: ids as many as usage says, the same on every choice and event, are kept."""
    make = prompt_ids_reply(lambda i, n: [[5, 6, 7], [5, 6, 7]], lambda n: 3, True)
    with BadFake(custom=make) as fine, FakeServer() as good:
        batch, events = asyncio.run(one_step([fine.url, good.url], cfg(True, mode=RequestMode.N)))
    assert not events
    assert {s.prompt_token_ids for g in batch.groups for s in g.samples if s.replica == 0} == {(5, 6, 7)}
