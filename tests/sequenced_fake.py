"""A deterministic fake OpenAI-compatible server for the sim/real equivalence test: virtual time, played in order.

Every replica is one aiohttp app on its own port, all served by ONE background thread and event loop, so one
*sequencer* sees every open stream of every replica. A request's length is its `max_tokens` (replay-style
requests: `ignore_eos`, per-request `max_tokens` = the workload's draw). Per step the test says how many requests
are coming (`begin`); once they have all arrived the sequencer plays a flat-τ replica's virtual time forward, one
event per distinct length L, ascending:

1. every open stream gets one chunk bringing it to min(its length, L) tokens (L − 1 for the one ending at L);
2. the sequencer waits until the *client* has parsed those chunks (or has cancelled the stream);
3. the stream of length L gets its last token with `finish_reason: "length"`, the usage chunk and `[DONE]`;
4. the sequencer waits until the client's request has returned and the client's event loop has run the
   executor's reaction (a bulk cutoff cancels, and snapshots the progress of, the other bulk streams).

Steps 2 and 4 are acknowledgements, not sleeps: `ObservedClient` (an `EngineClient` whose `complete` registers
each request's caller-owned progress list and notes when the request returns) lets the sequencer read what the
client has parsed, and `ClientObserver.settle` runs a chain of `sleep(0)` rounds on the client's loop (asyncio
runs ready callbacks FIFO, one round per iteration, so a completed task's waiter and the coroutine awaiting it
have run before the chain ends). Hence a bulk group cut at the quota-th completion L_cut has streamed exactly
min(L_j, L_cut) tokens per member, as in the simulator, however loaded the machine is. Nothing here depends on
wall-clock gaps; the timeouts only turn a hang into an error message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiohttp import web

from app_thread import AppThread, server_port
from tailsieve.engines.transport.engine_client import (
    ClientOptions,
    Completion,
    Endpoint,
    EngineClient,
    Request,
    SamplingParams,
)

WAIT_S = 20.0  # an acknowledgement that takes longer than this is a bug, not a slow machine
SETTLE_ROUNDS = 24  # sleep(0) rounds on the client loop after a completion (a handful suffice)


class ClientObserver:
    """What the client has parsed: per request id its progress list (shared with the executor) and whether its
    `complete` call has returned (finished, failed or cancelled). Written on the client's loop, read by the
    sequencer's thread (single list/set operations under the GIL)."""

    def __init__(self) -> None:
        self.progress: dict[str, list[int]] = {}
        self.ended: set[str] = set()
        self.loop: asyncio.AbstractEventLoop | None = None

    def reset(self) -> None:
        """Forget the last step's requests (call between steps, with no request in flight)."""
        self.progress = {}
        self.ended = set()

    def tokens(self, rid: str) -> int:
        """Tokens the client has parsed for request `rid` (n = 1 requests)."""
        prog = self.progress.get(rid)
        return prog[0] if prog else 0

    def returned(self, rid: str) -> bool:
        """Whether the client's `complete` call for `rid` has returned (finished, failed or cancelled)."""
        return rid in self.ended

    async def settle(self) -> None:
        """Let the client loop run `SETTLE_ROUNDS` iterations (called from the server's loop)."""
        assert self.loop is not None

        async def spin() -> None:
            for _ in range(SETTLE_ROUNDS):
                await asyncio.sleep(0)

        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(spin(), self.loop))


class ObservedClient(EngineClient):
    """`EngineClient` that reports every request's progress list and return to a `ClientObserver`."""

    def __init__(self, observer: ClientObserver, options: ClientOptions | None = None) -> None:
        super().__init__(options)
        self.observer = observer

    async def complete(
        self, endpoint: Endpoint, model: str, req: Request, params: SamplingParams, progress: list[int] | None = None
    ) -> Completion:
        """As `EngineClient.complete`, observed."""
        prog = progress if progress is not None else [0] * req.n
        self.observer.loop = asyncio.get_running_loop()
        self.observer.progress[req.rid] = prog
        try:
            return await super().complete(endpoint, model, req, params, prog)
        finally:
            self.observer.ended.add(req.rid)


@dataclass(eq=False)
class _Stream:
    rid: str
    replica: int
    length: int
    resp: web.StreamResponse
    release: asyncio.Future[None]
    sent: int = 0
    finished: bool = False
    disconnected: bool = False  # the server saw the client close the connection (or a write failed)


@dataclass(frozen=True)
class StepLog:
    """What the server saw in one step: request id → (replica, length), the finished ids, and per request cut
    by the client (disconnected before its end) the tokens it had been sent."""

    requests: dict[str, tuple[int, int]]
    finished: frozenset[str]
    cut: dict[str, int]
    events: int


class SequenceError(AssertionError):
    """The client and the sequencer disagree (a request never arrived, a chunk was never parsed, ...)."""


@dataclass
class SequencedFake:
    """`replicas` fake endpoints played by one sequencer; use `begin(step, requests)` before each step."""

    replicas: int
    observer: ClientObserver = field(default_factory=ClientObserver)
    ports: list[int] = field(default_factory=list)
    _server: AppThread = field(default_factory=lambda: AppThread("sequenced fake"))
    _step: int | None = None
    _arrived: list[_Stream] = field(default_factory=list)
    _stray: list[str] = field(default_factory=list)

    @property
    def endpoints(self) -> list[Endpoint]:
        """One vLLM-flavoured endpoint per replica, in replica order."""
        return [Endpoint(f"http://127.0.0.1:{p}", model="fake") for p in self.ports]

    def client(self, options: ClientOptions | None = None) -> ObservedClient:
        """A client whose requests the sequencer can follow."""
        return ObservedClient(self.observer, options)

    # ------------------------------------------------------------------------------------------------ HTTP side

    def _handler(self, replica: int) -> Callable[[web.Request], Any]:
        async def completions(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            rid = request.headers.get("X-Request-Id", "")
            step = int(rid.split("-")[1]) if rid.startswith("ts-") else -1
            if step != self._step:
                self._stray.append(rid)
                return web.json_response({"error": {"message": f"unexpected request {rid!r}"}}, status=400)
            ok = body.get("stream") and body.get("ignore_eos") and int(body.get("n", 1)) == 1
            if not ok or not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
                self._stray.append(rid)
                return web.json_response({"error": {"message": f"not a replay request: {body}"}}, status=400)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            s = _Stream(rid, replica, int(body["max_tokens"]), resp, asyncio.get_running_loop().create_future())
            self._arrived.append(s)
            try:
                await s.release  # the sequencer wrote the end of the stream
            except asyncio.CancelledError:  # the client closed the connection (handler cancellation)
                s.disconnected = True
                raise
            return resp

        return completions

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

    def start(self) -> SequencedFake:
        """Serve every replica from one background thread until `stop()`."""
        self.ports = [server_port() for _ in range(self.replicas)]
        apps = []
        for i, port in enumerate(self.ports):
            app = web.Application()
            app.router.add_post("/v1/completions", self._handler(i))
            app.router.add_post("/v1/chat/completions", self._handler(i))
            app.router.add_get("/v1/models", self._models)
            app.router.add_get("/health", self._health)
            apps.append((app, port))
        self._server.start(apps)
        return self

    def stop(self) -> None:
        """Stop serving."""
        self._server.stop()

    def __enter__(self) -> SequencedFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------------ sequencer

    def begin(self, step: int, requests: int) -> concurrent.futures.Future[StepLog]:
        """Expect `requests` requests of step `step` and play them once they have all arrived (call with no
        request in flight, before the executor sends them); the future resolves when every stream has ended."""
        assert self._server.loop is not None
        self.observer.reset()
        return asyncio.run_coroutine_threadsafe(self._sequence(step, requests), self._server.loop)

    async def _until(self, ok: Callable[[], bool], what: Callable[[], str]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not ok():
            if time.monotonic() > deadline:
                raise SequenceError(f"waited {WAIT_S:g}s for {what()}")
            await asyncio.sleep(0.0005)

    def _client_gone(self, s: _Stream) -> bool:
        """The client stopped reading `s` before its end (it was cancelled at the cutoff)."""
        return s.disconnected or (self.observer.returned(s.rid) and not s.finished)

    def _acked(self, moved: list[tuple[_Stream, int]]) -> bool:
        return all(self.observer.tokens(s.rid) >= t or self._client_gone(s) for s, t in moved)

    def _unacked(self, moved: list[tuple[_Stream, int]]) -> str:
        return "progress acks: " + ", ".join(f"{s.rid} {self.observer.tokens(s.rid)}/{t}" for s, t in moved
                                             if self.observer.tokens(s.rid) < t and not self._client_gone(s))

    async def _write(self, s: _Stream, data: bytes) -> None:
        try:
            await s.resp.write(data)
        except (ConnectionError, RuntimeError):
            s.disconnected = True

    @staticmethod
    def _chunk(rid: str, start: int, count: int, finish: str | None) -> bytes:
        ids = [(start + k) % 50_000 for k in range(count)]
        ch = {"index": 0, "text": "x" * count, "token_ids": ids, "finish_reason": finish}
        return f"data: {json.dumps({'id': rid, 'object': 'text_completion', 'choices': [ch]})}\n\n".encode()

    async def _sequence(self, step: int, requests: int) -> StepLog:
        self._step, self._arrived, self._stray = step, [], []
        obs = self.observer
        try:
            await self._until(lambda: len(self._arrived) >= requests,
                              lambda: f"{requests} requests of step {step} ({len(self._arrived)} arrived)")
            streams = list(self._arrived)
            if len(streams) != requests or len({s.length for s in streams}) != len(streams):
                raise SequenceError(f"step {step}: {len(streams)} requests for {requests} expected, or two of the "
                                    f"same length: {sorted(s.length for s in streams)}")
            events = 0
            for s_end in sorted(streams, key=lambda s: s.length):
                live = [s for s in streams if not s.finished and not self._client_gone(s)]
                if not live:
                    break
                L = s_end.length
                moved: list[tuple[_Stream, int]] = []
                for s in live:  # 1. progress up to L (L - 1 for the stream that ends at L)
                    target = L - 1 if s is s_end else min(s.length, L)
                    if target > s.sent:
                        await self._write(s, self._chunk(s.rid, s.sent, target - s.sent, None))
                        s.sent = target
                        moved.append((s, target))
                # 2. the client has parsed them (or cancelled the stream)
                await self._until(partial(self._acked, moved), partial(self._unacked, moved))
                if s_end not in live or self._client_gone(s_end):
                    continue
                usage = {"prompt_tokens": 3, "completion_tokens": L}
                tail = f"data: {json.dumps({'id': s_end.rid, 'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"
                await self._write(s_end, self._chunk(s_end.rid, s_end.sent, L - s_end.sent, "length") + tail.encode())
                s_end.sent = L
                s_end.finished = True  # 3. ended; 4. the client has returned and reacted
                await self._until(partial(obs.returned, s_end.rid),
                                  partial("the client to finish {}".format, s_end.rid))
                if not s_end.release.done():
                    s_end.release.set_result(None)
                await obs.settle()
                events += 1
            cut = [s for s in streams if not s.finished]
            await self._until(lambda: all(s.disconnected for s in cut),  # cut streams really were closed
                              lambda: "disconnects of " + ", ".join(s.rid for s in cut if not s.disconnected))
            extra = [s.rid for s in self._arrived[len(streams):]] + self._stray
            if extra:
                raise SequenceError(f"step {step}: unexpected requests {extra}")
            return StepLog({s.rid: (s.replica, s.length) for s in streams},
                           frozenset(s.rid for s in streams if s.finished), {s.rid: s.sent for s in cut}, events)
        finally:
            for s in self._arrived:  # on an error, end every stream so that nothing hangs
                if not s.release.done():
                    s.release.set_result(None)
            self._step = None


def member_of(rid: str) -> tuple[int, int, int, int]:
    """(step, uid, member, attempt) of an executor request id `ts-{step}-{uid}-{member}-{attempt}`."""
    _, step, uid, member, attempt = rid.split("-")
    return int(step), int(uid), int(member), int(attempt)

