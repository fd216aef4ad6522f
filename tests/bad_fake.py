"""A fake server that misbehaves in one chosen way (`reply`): the fault matrix of tests/test_reply_faults.py.

Every kind replaces the completion reply (or the /v1/models reply, `models-*`); `/health` stays 200 so that only the
reply itself can reveal the fault. Hanging kinds give up after `HANG_S` so that a broken client fails the test's
time bound instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from engine_fake import FakeServer

HANG_S = 20.0
TICK_S = 0.05

# a non-streamed body per kind (raw text: `Infinity` is not JSON, which is the point)
FULL: dict[str, str] = {
    "choices-string": '{"choices": "abc"}',
    "index-null": '{"choices": [{"index": null, "text": "x", "finish_reason": "stop"}]}',
    "tokens-inf": '{"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}], '
                  '"usage": {"prompt_tokens": 3, "completion_tokens": Infinity}}',
    "tokens-huge": '{"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}], '
                   '"usage": {"prompt_tokens": 3, "completion_tokens": 1000000000000000000000000000000}}',
    "tokens-negative": '{"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}], '
                       '"usage": {"prompt_tokens": 3, "completion_tokens": -5}}',
    "choices-empty": '{"choices": []}',
    "empty-choice": '{"choices": [{}]}',
    "not-json": "<html>502 Bad Gateway</html>",
    "list": "[1, 2, 3]",
}

# the `data:` events of a streamed reply per kind (then `[DONE]`)
STREAM: dict[str, list[str]] = {
    "chunk-list": ["[1, 2]"],
    "choices-string": ['{"choices": "abc"}'],
    "index-null": ['{"choices": [{"index": null, "text": "x"}]}'],
    "tokens-inf": ['{"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}], '
                   '"usage": {"prompt_tokens": 3, "completion_tokens": Infinity}}'],
    "tokens-huge": ['{"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}], '
                    '"usage": {"prompt_tokens": 3, "completion_tokens": 1000000000000000000000000000000}}'],
    "tokens-negative": ['{"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}], '
                        '"usage": {"prompt_tokens": 3, "completion_tokens": -5}}'],
    "empty-choice": ["{\"choices\": [{}]}"],
    "index-out-of-range": ['{"choices": [{"index": 7, "text": "x", "finish_reason": "stop"}]}'],
    "not-json": ["{not json"],
}

HANGS = ("keepalive", "empty-events", "drip", "endless", "shutdown")


@dataclass
class BadFake(FakeServer):
    """A `FakeServer` whose completion (or /v1/models) reply is the misbehaviour `reply` names."""

    reply: str = "ok"
    echo: int = 0  # an HTTP status: answer every completion with it, its body echoing the request headers
    # a generated reply (tests/test_reply_classes.py): request body -> the non-streamed body, or the `data:` events
    custom: Callable[[dict[str, Any]], str | list[str]] | None = None
    shutting_down: bool = False  # `shutdown`: set at the first request; /health then answers 503

    async def _custom(self, request: web.Request, make: Callable[[dict[str, Any]], str | list[str]]) \
            -> web.StreamResponse:
        body = await request.json()
        self.started += 1
        out = make(body)
        if isinstance(out, str):
            return web.Response(text=out, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            await resp.prepare(request)
            for event in out:
                await resp.write(f"data: {event}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionError, RuntimeError):  # the client closed the connection (a capped reply)
            pass
        return resp

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        if self.custom is not None:
            return await self._custom(request, self.custom)
        if self.echo:
            self.started += 1
            heads = {k: v for k, v in request.headers.items()}
            return web.json_response({"error": {"message": f"unauthorized; you sent {heads}"}}, status=self.echo)
        if self.reply == "ok" or self.reply.startswith("models-"):
            return await super()._completions(request)
        body = await request.json()
        self.started += 1
        if self.reply in HANGS:
            return await self._hang(request, body)
        few = [{"index": i, "text": "x", "token_ids": [1], "finish_reason": "stop"}
               for i in range(int(body.get("n", 1)) - 1)]  # few-choices: n − 1 finished choices
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            events = [json.dumps({"choices": [c]}) for c in few] if self.reply == "few-choices" else STREAM[self.reply]
            for event in events:
                await resp.write(f"data: {event}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            return resp
        text = json.dumps({"choices": few}) if self.reply == "few-choices" else FULL[self.reply]
        return web.Response(text=text, content_type="application/json")

    async def _hang(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        """keepalive: SSE comments forever; empty-events: `data: {"choices": []}` forever; drip: a non-streamed
        body that never ends (a space at a time); endless: one real token per tick, never finishing; shutdown: a
        server shutting down after SIGTERM (vLLM): one token, then the stream stays open and silent while /health
        fails."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream" if body.get("stream") else
                                           "application/json"})
        await resp.prepare(request)
        if self.reply == "shutdown":
            if body.get("stream"):
                await resp.write(f"data: {json.dumps({'choices': [{'index': 0, 'text': 'x'}]})}\n\n".encode())
            self.shutting_down = True
            await asyncio.sleep(HANG_S)
            return resp
        line = {"keepalive": b": keep-alive\n\n", "empty-events": b'data: {"choices": []}\n\n', "drip": b" ",
                "endless": f"data: {json.dumps({'choices': [{'index': 0, 'text': 'x'}]})}\n\n".encode()}[self.reply]
        loop = asyncio.get_running_loop()
        end = loop.time() + HANG_S
        while loop.time() < end:
            await resp.write(line)
            await asyncio.sleep(TICK_S)
        return resp

    async def _health(self, request: web.Request) -> web.Response:
        if self.shutting_down:
            return web.Response(status=503, text="shutting down")
        return await super()._health(request)

    async def _models(self, request: web.Request) -> web.Response:
        if self.reply == "models-bad":
            return web.Response(text='{"data": "fake"}', content_type="application/json")
        if self.reply == "models-500":
            return web.json_response({"error": {"message": "model registry down"}}, status=500)
        if self.reply == "models-empty":
            return web.json_response({"data": []})
        return await super()._models(request)

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.reply == "metrics-bad":
            return web.Response(text="vllm:num_requests_running{model_name=\"fake\" 3\n")
        return await super()._metrics(request)
