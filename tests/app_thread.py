"""Serve aiohttp apps for tests from one background thread and event loop (the fake servers share this)."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

_GIVEN: set[int] = set()
_RNG = random.Random(os.getpid())  # spreads the picks of parallel test processes; results never depend on it


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections (Linux's default where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def server_port() -> int:
    """A free port on 127.0.0.1 for a fake server, below the kernel's range for outgoing connections. A port picked
    by binding port 0 comes from that range, and one of the tests' own client connections could take it between the
    pick and the fake's bind (seen in CI as "address already in use"); never one handed out before in this process."""
    lo, hi = 10000, min(_ephemeral_low(), 65536) - 1
    while True:
        port = _RNG.randint(lo, hi) if hi > lo else 0
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        _GIVEN.add(port)
        return port


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
