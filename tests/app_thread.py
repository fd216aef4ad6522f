"""Serve aiohttp apps for tests from one background thread and event loop (the fake servers share this)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from aiohttp import web


class AppThread:
    """`start([(app, port), …])` serves each app on 127.0.0.1:port until `stop()`; `loop` is the serving loop."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, apps: Sequence[tuple[web.Application, int]]) -> None:
        """Serve every app (handler cancellation on, short shutdown) and return once they all listen."""
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self.loop = loop
            runners = []
            for app, port in apps:
                runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.2, access_log=None)
                loop.run_until_complete(runner.setup())
                loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
                runners.append(runner)
            ready.set()
            loop.run_forever()
            for runner in runners:
                loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=main, name=self.name, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"{self.name} did not start")

    def stop(self) -> None:
        """Stop serving (connections are then refused)."""
        if self.loop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop = None
