"""A fake SGLang server (native `/generate`, `/abort_request`, `/health`, `/get_model_info`) and a fake
sglang-router (`GET /workers`, `GET /list_workers`) for the native backend and slime integration tests.

Lengths are a deterministic function of the prompt (token ids or text) and the member's `sampling_seed`, so the
same prompt is long every time it is drawn; `long_prompts` makes chosen prompts (by their first token id) run to
`max_new_tokens`. Token ids and logprobs are deterministic too. Streams are cumulative (SGLang's default) or
incremental (`incremental=True`, like `--incremental-streaming-output`). An `/abort_request` for a running rid
ends it with `finish_reason {"type": "abort"}`; a closed connection cancels it. `running` counts live requests.
`/model_info` (and `/get_model_info`) report `weight_version`; with `top_p_patch` the server answers slime's
`custom_params {"return_top_p_token_ids": true}` with `top_p_token_ids` (base64 int32) and `top_p_token_offsets`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from app_thread import AppThread, server_port


def token(prompt_key: str, t: int) -> int:
    """The t-th output token id for a prompt."""
    return (len(prompt_key) * 31 + t * 7) % 1000


def top_p_kept(prompt_key: str, t: int) -> list[int]:
    """The token ids top-p kept at the t-th output token (the sampled one first; 1 to 3 of them)."""
    return [token(prompt_key, t) + k for k in range(1 + t % 3)]


def logprob(t: int) -> float:
    """The t-th output token's logprob."""
    return -0.01 * (t % 10 + 1)


@dataclass
class FakeSGLang:
    """One SGLang server; see the module docstring."""

    tpot_s: float = 0.002
    incremental: bool = False
    weight_version: str = "7"
    top_p_patch: bool = False  # answer custom_params return_top_p_token_ids (slime's SGLang patch)
    long_prompts: set[int] = field(default_factory=set)  # first token ids whose samples run to max_new_tokens
    short_cap: int = 6
    port: int = field(default_factory=server_port)
    running: int = 0
    rids: list[str] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    cancelled: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    _abort_set: set[str] = field(default_factory=set)
    _server: AppThread = field(default_factory=lambda: AppThread("fake sglang"))

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://127.0.0.1:{self.port}"

    def length(self, body: dict[str, Any]) -> int:
        sp = body.get("sampling_params") or {}
        cap = int(sp.get("max_new_tokens", 16))
        ids = body.get("input_ids")
        if ids and int(ids[0]) in self.long_prompts:
            return cap
        key = json.dumps(ids if ids is not None else body.get("text"))
        h = hashlib.blake2b(f"{key}|{sp.get('sampling_seed')}".encode(), digest_size=4).digest()
        return min(cap, 1 + int.from_bytes(h, "little") % self.short_cap)

    def _meta(self, body: dict[str, Any], rid: str, n_out: int, first: int, finish: Any) -> dict[str, Any]:
        key = json.dumps(body.get("input_ids") or body.get("text"))
        meta: dict[str, Any] = {"id": rid, "finish_reason": finish, "weight_version": self.weight_version,
                                "prompt_tokens": len(body.get("input_ids") or []) or 3, "completion_tokens": n_out}
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[logprob(t), token(key, t), "x"] for t in range(first, n_out)]
        custom = (body.get("sampling_params") or {}).get("custom_params") or {}
        if self.top_p_patch and custom.get("return_top_p_token_ids"):  # slime's patch: the whole response's
            ids = [k for t in range(n_out) for k in top_p_kept(key, t)]
            offsets = [0]
            for t in range(n_out):
                offsets.append(offsets[-1] + len(top_p_kept(key, t)))
            meta["top_p_token_ids"] = base64.b64encode(struct.pack(f"<{len(ids)}i", *ids)).decode("ascii")
            meta["top_p_token_offsets"] = offsets  # SGLang may send either form
        return meta

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        rid = str(body.get("rid"))
        self.rids.append(rid)
        n = self.length(body)
        cap = int((body.get("sampling_params") or {}).get("max_new_tokens", 16))
        self.running += 1
        try:
            if body.get("stream"):
                return await self._stream(request, body, rid, n, cap)
            done = await self._tick(rid, n)
            finish = {"type": "abort"} if done < n else {"type": "length" if n == cap else "stop", "matched": 2}
            key = json.dumps(body.get("input_ids") or body.get("text"))
            return web.json_response({"text": "x" * done, "output_ids": [token(key, t) for t in range(done)],
                                      "meta_info": self._meta(body, rid, done, 0, finish)})
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1

    async def _tick(self, rid: str, n: int) -> int:
        """Generate up to n tokens (non-streamed); returns how many before an abort."""
        for t in range(n):
            if rid in self._abort_set:
                return t
            await asyncio.sleep(self.tpot_s * (1 + self.running / 16))
        return n

    async def _stream(self, request: web.Request, body: dict[str, Any], rid: str, n: int,
                      cap: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        key = json.dumps(body.get("input_ids") or body.get("text"))
        for t in range(n):
            await asyncio.sleep(self.tpot_s * (1 + self.running / 16))
            aborted = rid in self._abort_set
            finish: Any = None
            if aborted:
                finish = {"type": "abort"}
            elif t == n - 1:
                finish = {"type": "length" if n == cap else "stop"}
            first = t if self.incremental else 0
            upto = t if aborted else t + 1
            event = {"text": "x" * (upto - first), "output_ids": [token(key, k) for k in range(first, upto)],
                     "meta_info": self._meta(body, rid, upto, first, finish)}
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
            if aborted:
                break
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _abort(self, request: web.Request) -> web.Response:
        rid = str((await request.json()).get("rid"))
        self.aborts.append(rid)
        self._abort_set.add(rid)
        return web.Response()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": "fake/model", "weight_version": self.weight_version})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/abort_request", self._abort)
        app.router.add_get("/health", self._health)
        app.router.add_get("/get_model_info", self._info)
        app.router.add_get("/model_info", self._info)
        return app

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """Wait until no request is running."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.running:
            time.sleep(0.01)
        return self.running == 0


@dataclass
class FakeFleet:
    """Several fake SGLang servers and a fake sglang-router listing them, served from one thread."""

    servers: list[FakeSGLang]
    router_port: int = field(default_factory=server_port)
    _thread: AppThread = field(default_factory=lambda: AppThread("fake sglang fleet"))

    async def _workers(self, request: web.Request) -> web.Response:
        return web.json_response({"workers": [{"id": str(i), "url": s.url, "model_id": "fake", "is_healthy": True}
                                              for i, s in enumerate(self.servers)], "total": len(self.servers)})

    async def _list_workers(self, request: web.Request) -> web.Response:
        return web.json_response({"urls": [s.url for s in self.servers]})

    def start(self) -> FakeFleet:
        router = web.Application()
        router.router.add_get("/workers", self._workers)
        router.router.add_get("/list_workers", self._list_workers)
        self._thread.start([(router, self.router_port), *((s.app(), s.port) for s in self.servers)])
        return self

    def stop(self) -> None:
        self._thread.stop()

    @property
    def running(self) -> int:
        return sum(s.running for s in self.servers)

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        return all(s.wait_idle(timeout_s) for s in self.servers)
