"""A fake HTTP server that answers every request with one body, whole or chunked: the reply-cap tests share it
(tests/test_reply_sizes.py, tests/test_reply_caps_integrations.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from app_thread import AppThread

CHUNK = 1 << 16


class BodyFake:
    """`reply(path) -> (status, body, content type)` for every request; `chunked`: sent without a Content-Length, in
    64 KiB chunks (a client that stops reading at its cap ends the stream). Subclasses hold `chunked`, `port` and
    `_server` (an `AppThread`)."""

    chunked: bool
    port: int
    _server: AppThread

    def reply(self, path: str) -> tuple[int, bytes, str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _any(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        status, body, kind = self.reply(request.path)
        if not self.chunked:
            return web.Response(status=status, body=body, content_type=kind)
        resp = web.StreamResponse(status=status, headers={"Content-Type": kind})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            for k in range(0, len(body), CHUNK):
                await resp.write(body[k:k + CHUNK])
            await resp.write_eof()
        except (ConnectionError, RuntimeError):  # the client stopped reading at its cap
            pass
        return resp

    def __enter__(self) -> Any:
        app = web.Application(client_max_size=1 << 20)
        app.router.add_route("*", "/{tail:.*}", self._any)
        self._server.start([(app, self.port)])
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
