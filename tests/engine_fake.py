"""A small fake OpenAI-compatible server (aiohttp, own thread and loop) for engine tests: deterministic lengths,
concurrency-dependent per-token delay, streaming with token ids, and switchable faults (5xx, 4xx, stall, drop)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from app_thread import AppThread, server_port


def fake_length(prompt: str, seed: int | None, index: int, cap: int) -> int:
    """Length of a non-ignore_eos sample: a deterministic function of prompt, seed and choice index."""
    h = hashlib.blake2b(f"{prompt}|{seed}|{index}".encode(), digest_size=4).digest()
    return 1 + int.from_bytes(h, "little") % cap


@dataclass
class FakeServer:
    """Serves /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, /abort_request."""

    tpot_s: float = 0.0005  # per-token delay at concurrency 1
    slope: float = 1 / 16  # delay grows by this fraction per extra running request
    mode: str = "ok"  # ok | 500 | 400 | 401 | stall | drop
    fail_after: int | None = None  # requests answered normally before switching to `then`
    then: str = "500"
    port: int = field(default_factory=server_port)
    running: int = 0
    started: int = 0
    finished: int = 0
    aborted: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    sglang_aborts: list[str] = field(default_factory=list)
    reload: str = "ok"  # weight reload: ok | 404 (no dev-mode endpoints) | 500
    reloads: list[str] = field(default_factory=list)  # weights_path of each reload_weights RPC
    cache_resets: int = 0
    version_label: str = "default"  # what `GET /weight_info` reports (vLLM's label before any update)
    version_info: bool = True  # False: no `/weight_info` (vLLM without VLLM_SERVER_DEV_MODE=1): 404
    takes_label: bool = True  # False: `/update_weight_version` answers success but the label stays
    _server: AppThread = field(default_factory=lambda: AppThread("fake server"))

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://127.0.0.1:{self.port}"

    def _mode(self) -> str:
        if self.fail_after is not None and self.started > self.fail_after:
            return self.then
        return self.mode

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        self.started += 1
        mode = self._mode()
        refusal = await _refusal(mode)
        if refusal is not None:
            return refusal
        n = int(body.get("n", 1))
        cap = int(body.get("max_tokens", 16))
        prompt = json.dumps(body.get("prompt", body.get("messages")))
        lengths = [cap if body.get("ignore_eos") else fake_length(prompt, body.get("seed"), i, cap) for i in range(n)]
        self.running += n
        live = [n]
        try:
            if body.get("stream"):
                return await self._stream(request, mode, lengths, cap, body, live)
            await asyncio.sleep(self.tpot_s * max(lengths) * (1 + self.slope * (self.running - 1)))
            if mode == "drop":
                assert request.transport is not None
                request.transport.close()
                return web.Response()
            self.finished += 1
            return web.json_response(_full_reply(lengths, cap, body))
        except asyncio.CancelledError:
            self.aborted += 1
            raise
        finally:
            self.running -= live[0]

    async def _stream(self, request: web.Request, mode: str, lengths: list[int], cap: int, body: dict[str, Any],
                      live: list[int]) -> web.StreamResponse:
        """One token chunk per running choice per tick (concurrency-dependent delay); `live[0]` counts the
        choices still running."""
        chat = "messages" in body
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for t in range(max(lengths)):
            await asyncio.sleep(self.tpot_s * (1 + self.slope * (self.running - 1)))
            if mode == "drop" and t == 2:
                assert request.transport is not None
                request.transport.close()
                return resp
            for i, ln in enumerate(lengths):
                if t >= ln:
                    continue
                fin = "length" if t == ln - 1 and ln == cap else ("stop" if t == ln - 1 else None)
                if fin is not None:
                    self.running -= 1
                    live[0] -= 1
                ch: dict[str, Any] = {"index": i, "finish_reason": fin, "token_ids": [t % 97]}
                ch |= {"delta": {"content": "x"}} if chat else {"text": "x"}
                ch |= _extras(body, [t], first=t == 0)
                await resp.write(f"data: {json.dumps({'choices': [ch]})}\n\n".encode())
        usage = {"prompt_tokens": fake_prompt_tokens(body), "completion_tokens": sum(lengths)}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        self.finished += 1
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=500 if self._mode() == "500" else 200)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f"# HELP x\nvllm:num_requests_running{{model_name=\"fake\"}} {self.running}\n")

    async def _rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.reload != "ok":
            return web.json_response({"detail": "reload failed"}, status=int(self.reload))
        if body.get("method") != "reload_weights":
            return web.json_response({"detail": f"unknown method {body.get('method')}"}, status=400)
        self.reloads.append(str(body["kwargs"]["weights_path"]))
        return web.json_response({"results": [None]})

    async def _reset(self, request: web.Request) -> web.Response:
        self.cache_resets += 1
        return web.Response()

    async def _version(self, request: web.Request) -> web.Response:
        new = str((await request.json())["new_version"])
        if self.takes_label:
            self.version_label = new
        return web.json_response({"success": True, "new_version": new})

    async def _weight_info(self, request: web.Request) -> web.Response:
        if not self.version_info:
            return web.Response(status=404)
        return web.json_response({"weight_version": self.version_label})

    async def _abort(self, request: web.Request) -> web.Response:
        self.sglang_aborts.append(str((await request.json()).get("rid")))
        return web.Response()

    def start(self) -> FakeServer:
        """Serve in a background thread until `stop()`."""
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/abort_request", self._abort)
        app.router.add_post("/collective_rpc", self._rpc)
        app.router.add_post("/reset_prefix_cache", self._reset)
        app.router.add_post("/update_weight_version", self._version)
        app.router.add_get("/weight_info", self._weight_info)
        self._server.start([(app, self.port)])
        return self

    def stop(self) -> None:
        """Stop serving (connections are then refused)."""
        self._server.stop()

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """Wait until no request is running (aborts have landed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.running == 0:
                return True
            time.sleep(0.01)
        return self.running == 0

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _refusal(mode: str) -> web.Response | None:
    """The reply of a failing mode (500, 400, 401; stall never replies), or None to serve normally."""
    if mode == "500":
        return web.json_response({"error": {"message": "engine dead"}}, status=500)
    if mode == "400":
        return web.json_response({"error": {"message": "max_tokens is too large"}}, status=400)
    if mode == "401":
        return web.json_response({"error": "Unauthorized"}, status=401)
    if mode == "stall":
        await asyncio.sleep(3600)
    return None


FAKE_PROMPT_IDS = [5, 6, 7]


def fake_logprob(t: int) -> float:
    """The fake's log-probability of the token at position t."""
    return -0.1 * (t % 7) - 0.05


def _extras(body: dict[str, Any], positions: list[int], first: bool) -> dict[str, Any]:
    """Per-choice logprobs (when asked for, vLLM's completions/chat shapes) and prompt ids (on the first chunk)."""
    ids = [FAKE_PROMPT_IDS[0] + k for k in range(fake_prompt_tokens(body))]  # as many as usage.prompt_tokens says
    out: dict[str, Any] = {"prompt_token_ids": ids} if first and "messages" not in body else {}
    if body.get("logprobs") is not None and body.get("logprobs") is not False:
        lps = [fake_logprob(t) for t in positions]
        out["logprobs"] = ({"content": [{"token": "x", "logprob": x} for x in lps]} if "messages" in body
                           else {"token_logprobs": lps})
    return out


def _full_reply(lengths: list[int], cap: int, body: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed reply: every choice with its token ids and finish reason, and the usage."""
    chat = "messages" in body
    choices = [{"index": i, "finish_reason": "length" if ln == cap else "stop",
                **({"message": {"content": "x" * ln}} if chat else {"text": "x" * ln}),
                "token_ids": [0] * ln, **_extras(body, list(range(ln)), True)} for i, ln in enumerate(lengths)]
    return {"choices": choices, "usage": {"prompt_tokens": fake_prompt_tokens(body), "completion_tokens": sum(lengths)}}


def fake_prompt_tokens(body: dict[str, Any]) -> int:
    """Prompt tokens: 3 for a short prompt, one per word for a long one (`profile --contexts` sizes its prompts)."""
    words = len(str(body.get("prompt", body.get("messages"))).split())
    return 3 if words < 16 else words


def write_prompts(root: Any, count: int = 40) -> Any:
    """`root/p.jsonl`: `count` prompts q0, q1, … for the small rollouts the output tests run."""
    path = root / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"what is {i}?"}) + "\n" for i in range(count)))
    return path


def small_rollout(servers: list[FakeServer], root: Any, steps: int, *extra: str, policy: str = "static") -> list[str]:
    """`tailsieve rollout` argv of N = 2 groups of 2 on `servers` into `root/out` (static: q = m = 1)."""
    fixed = ["--q", "1", "--m", "1"] if policy == "static" else []
    return ["rollout", "--endpoints", ",".join(s.url for s in servers), "--prompts", str(root / "p.jsonl"),
            "--groups", "2", "--group-size", "2", "--rho", "0.5", "--max-tokens", "20", "--policy", policy, *fixed,
            "--steps", str(steps), "--out", str(root / "out"), "--give-up-after", "0", *extra]
