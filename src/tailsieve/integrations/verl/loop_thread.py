"""`LoopThread`: runs coroutines from synchronous code, whether or not the calling thread runs an event loop.

A synchronous hook (verl's `on_sample_end`) that needs to await something cannot use `asyncio.run` when its thread
already runs an event loop (RuntimeError), and `loop.run_until_complete` on that loop deadlocks. `LoopThread` owns
one event loop in a daemon thread, started on first use and kept (so clients bound to it stay valid); `run(coro)`
submits the coroutine there and blocks the caller until it is done. The calling thread's own loop, if any, is
paused meanwhile, so the coroutine must not need it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """One background event loop; `run(coro, timeout_s)` from any thread (see the module docstring)."""

    def __init__(self, name: str = "tailsieve-loop") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the background loop and return its result (TimeoutError after `timeout_s`, the
        coroutine then cancelled)."""
        loop = self._start()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop thread (await the coroutine instead)")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        """Cancel what still runs there, stop the loop and join its thread (a later `run` starts a new one)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop, self._thread = None, None
        if loop is not None and thread is not None:
            async def drain() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(drain(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()
