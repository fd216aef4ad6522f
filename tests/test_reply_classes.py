"""Replies that look complete but are not (issue 23), generated: classes × variants × stream/full × split/n request
mode, each one misbehaving fake server beside a healthy one (the harness: `reply_harness.py`; the fixed fault matrix
of issue 15: `test_reply_faults.py`). Finish reasons that are not `stop`/`length` (`abort`, unknown words), token ids
that do not match the text or the counts, and replies over the byte cap (refused before parsing; the healthy
replica's stall timer never fires); plus a replica shutting down (down after `liveness_s`, not the stall timeout).
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from bad_fake import BadFake
from engine_fake import FakeServer
from reply_harness import BAD, BOUND_S, POLICY, cfg, check_complete, one_step
from tailsieve.engines.rollout.engine_executor import RequestMode

# ---- issue 23: generated classes of replies that look complete but are not -------------------------------------
# Each class is a list of variants; a variant builds, from the request body, the non-streamed body (`full`) and/or
# the streamed `data:` events (`stream`). Every (class, variant, mode) is one case of the matrix test above: the bad
# replica is marked down as `bad-reply`, its work re-dispatched, and the step completes on the healthy replica.
HUGE = 32 << 20  # bytes: far over the cap of a 20-token request (about 1.1 MB), and slow to parse if it were read
Make = Callable[[dict[str, Any]], str | list[str]]


def _choice(i: int, text: str, ids: list[int] | None, finish: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"index": i, "text": text, "finish_reason": finish}
    if ids is not None:
        out["token_ids"] = ids
    return out


def _n(body: dict[str, Any]) -> int:
    return int(body.get("n", 1))


def finish_full(reason: str) -> Make:
    return lambda b: json.dumps({"choices": [_choice(i, "xx", [1, 2], reason) for i in range(_n(b))],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": 2 * _n(b)}})


def finish_stream(reason: str) -> Make:
    """Two tokens, then the (partial output's) finish event with `reason`."""
    return lambda b: [json.dumps({"choices": [_choice(i, "x", [1], None)]}) for i in range(_n(b)) for _ in (0, 1)] \
        + [json.dumps({"choices": [_choice(i, "", [], reason)]}) for i in range(_n(b))]


def ids_full(text: str, ids: list[int] | None, usage: int | None) -> Make:
    def make(b: dict[str, Any]) -> str:
        doc: dict[str, Any] = {"choices": [_choice(i, text, ids, "stop") for i in range(_n(b))]}
        if usage is not None:
            doc["usage"] = {"prompt_tokens": 3, "completion_tokens": usage * _n(b)}
        return json.dumps(doc)

    return make


def ids_stream(chunks: list[tuple[str, list[int] | None]], usage: int | None) -> Make:
    """Token events (text, ids or None) per choice, the last one finishing it, then a usage-only event."""
    def make(b: dict[str, Any]) -> list[str]:
        events = [json.dumps({"choices": [_choice(i, t, ids, "stop" if k == len(chunks) - 1 else None)]})
                  for i in range(_n(b)) for k, (t, ids) in enumerate(chunks)]
        if usage is not None:
            usage_doc = {"prompt_tokens": 3, "completion_tokens": usage * _n(b)}
            events.append(json.dumps({"choices": [], "usage": usage_doc}))
        return events

    return make


def _huge(*choices: dict[str, Any]) -> str:
    """A document of 32 MB claiming one finished token per choice (built once per shape: dumping it per request
    would hold the GIL that the client's loop shares with the fake's thread for longer than the stall timeout)."""
    text = json.dumps({"choices": list(choices), "pad": ""})
    return text[:-2] + " " * HUGE + '"}'


@functools.cache
def _huge_n(n: int) -> str:
    """`_huge` with n choices (`--request-mode n`), cached: a CI run once failed when it was dumped per request
    (the healthy replica's stall timer fired while the fake's thread held the GIL)."""
    return _huge(*(_choice(i, "x", [1], "stop") for i in range(n)))


HUGE_FULL = _huge(_choice(0, "x", [1], "stop"))
HUGE_EVENTS = [_huge(_choice(i, "x", [1], "stop")) for i in range(3)]
PAD = "p" * 100_000


def _padded(i: int, finish: str | None) -> str:
    return json.dumps({"choices": [_choice(i, "x", [1], finish)], "pad": PAD})


def huge_full(b: dict[str, Any]) -> str:
    return HUGE_FULL if _n(b) == 1 else _huge_n(_n(b))


def huge_line(b: dict[str, Any]) -> list[str]:
    """One `data:` line of 32 MB per choice (each arrives in many reads)."""
    return HUGE_EVENTS[:_n(b)]


def many_events(b: dict[str, Any]) -> list[str]:
    """max_tokens well-formed token events per choice, the last one finishing it (`length`), each padded to 100 kB:
    every count is right, only the whole stream is past the cap (about 1.1 MB for 20 tokens)."""
    cap = int(b.get("max_tokens", 20))
    return [_padded(i, "length" if t == cap - 1 else None) for i in range(_n(b)) for t in range(cap)]


CLASSES: dict[str, dict[str, dict[str, Make]]] = {
    "finish-reason": {r: {"full": finish_full(r), "stream": finish_stream(r)}
                      for r in ("abort", "banana", "error", "tool_calls", "Stop")},
    "ids-vs-text": {
        "text-empty-ids": {"full": ids_full("xxxxx", [], None), "stream": ids_stream([("x", [])] * 5, None)},
        "text-empty-ids-usage": {"full": ids_full("xxxxx", [], 5), "stream": ids_stream([("x", [])] * 5, 5)},
        "ids-below-usage": {"full": ids_full("xxx", [1, 2, 3], 5), "stream": ids_stream([("x", [1])] * 3, 5)},
        "ids-above-usage": {"full": ids_full("xxx", [1, 2, 3], 1), "stream": ids_stream([("x", [1])] * 3, 1)},
        "ids-on-some-events": {"stream": ids_stream([("x", [1]), ("x", None), ("x", None)], None)},
    },
    "size": {"huge": {"full": huge_full, "stream": huge_line}, "many-events": {"stream": many_events}},
}
GENERATED = [(cls, var, mode, make) for cls, variants in CLASSES.items() for var, modes in variants.items()
             for mode, make in modes.items()]


@pytest.mark.parametrize(("cls", "variant", "mode", "make"), GENERATED,
                         ids=[f"{c}-{v}-{m}" for c, v, m, _ in GENERATED])
@pytest.mark.parametrize("request_mode", [RequestMode.SPLIT, RequestMode.N], ids=["split", "n"])
def test_generated_incomplete_replies_are_bad_replies(cls: str, variant: str, mode: str, make: Make,
                                                      request_mode: RequestMode) -> None:
    """Only stop/length complete a sample; ids must match text and counts; a reply over its byte cap is refused
    before it is parsed, so the healthy replica's stall timer never fires while the bad one is read. That timer is
    0.5 s, and 2 s for the replies of tens of megabytes: the fake servers share the test's process, and on a loaded
    2-core machine their threads writing 32 MB held the GIL past 0.5 s (a CI-like run failed so, once in a
    thousand-test suite), which tests the machine, not the byte cap."""
    stall = 2.0 if cls == "size" else POLICY.stall_timeout_s
    with BadFake(custom=make) as bad, FakeServer() as good:
        t0 = time.monotonic()
        batch, events = asyncio.run(one_step([bad.url, good.url], cfg(mode == "stream", mode=request_mode,
                                                                       stall_s=stall)))
        assert time.monotonic() - t0 < BOUND_S
    check_complete(batch)
    downs = [why for i, up, why in events if i == 0 and not up]
    # a huge reply is refused at its byte cap, before it is parsed; on a loaded 2-core machine its first megabyte
    # can take longer than the 0.5 s stall timer to arrive (the fake server shares the process), and then the timer
    # refuses it first: either way it is not a sample. Every other class must be a bad reply.
    reasons = (f"{BAD}:", "stall:") if cls == "size" else (f"{BAD}:",)
    assert downs and downs[0].startswith(reasons), events
    assert all(i == 0 for i, _, _ in events)  # the healthy replica never went down (no starved stall timer)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "full"])
def test_a_replica_shutting_down_is_down_without_waiting_for_the_stall_timeout(stream: bool) -> None:
    """Issue 23: vLLM keeps streams open while it shuts down after SIGTERM; its /health fails. With a 30 s stall
    timeout, the quiet replica's /health is asked after `liveness_s` (0.3 s) and the step ends within seconds."""
    c = replace(cfg(stream), faults=replace(POLICY, stall_timeout_s=30.0, liveness_s=0.3))
    with BadFake(reply="shutdown") as bad, FakeServer() as good:
        t0 = time.monotonic()
        batch, events = asyncio.run(one_step([bad.url, good.url], c))
        took = time.monotonic() - t0
    check_complete(batch)
    assert took < 5.0, took
    downs = [why for i, up, why in events if i == 0 and not up]
    assert downs and downs[0].startswith("disconnect:") and "/health fails while its requests made no progress for " \
        "0.3s" in downs[0], events
