"""Replica health: a faulty replica is marked down, probed with exponential backoff, and taken back when it answers;
`reprobe_down` checks every down replica once more right before each step's dispatch.

`Replicas` maps the router's replica indices to endpoints and picks a healthy substitute for a down one (the same
pool first, least loaded). `FaultPolicy` holds every timeout, retry and backoff constant.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tailsieve.engines.transport.engine_client import Endpoint, EngineClient, EngineError, FaultKind
from tailsieve.engines.transport.types import check_seconds


@dataclass(frozen=True, slots=True)
class FaultPolicy:
    """Timeouts, retries and backoff of a real run (seconds)."""

    connect_timeout_s: float = 5.0
    stall_timeout_s: float = 60.0  # streaming: time without a new token that marks a replica down; else whole request
    retries: int = 4  # re-dispatches of one request before the step fails
    backoff_s: float = 0.25  # delay before retry k is backoff_s · 2^(k−1), capped
    backoff_max_s: float = 8.0
    probe_interval_s: float = 1.0  # first probe of a down replica; doubles up to probe_max_s
    probe_max_s: float = 15.0
    no_healthy_wait_s: float = 10.0  # how long to wait for any replica to come back before giving up
    deadline_s: float | None = None  # total seconds one request may take (None: only the stall timeout)
    liveness_s: float = 2.0  # requests quiet this long (at most stall/2): ask the replica's /health, fault it if down

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise EngineError(f"fault policy: retries must be >= 0, got {self.retries}")
        for what, v in (("connect timeout", self.connect_timeout_s), ("stall timeout", self.stall_timeout_s),
                        ("probe interval", self.probe_interval_s), ("probe max", self.probe_max_s),
                        ("liveness", self.liveness_s)):
            check_seconds(f"fault policy: {what}", v)
        for what, v in (("backoff", self.backoff_s), ("backoff max", self.backoff_max_s),
                        ("no-healthy wait", self.no_healthy_wait_s)):
            check_seconds(f"fault policy: {what}", v, zero=True)
        if self.deadline_s is not None:
            check_seconds("fault policy: request deadline", self.deadline_s)

    def backoff(self, attempt: int) -> float:
        """Delay before the `attempt`-th retry (attempt 0 = first try: no delay)."""
        return 0.0 if attempt <= 0 else min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """One change of a replica's state (for reports)."""

    t: float
    replica: int
    up: bool
    reason: str


class Replicas:
    """Endpoints by router replica index, their up/down state, and the probes of the down ones."""

    def __init__(self, endpoints: Sequence[Endpoint], client: EngineClient, policy: FaultPolicy) -> None:
        if not endpoints:
            raise EngineError("no endpoints given")
        self.endpoints = tuple(endpoints)
        self.client = client
        self.policy = policy
        self.up = [True] * len(endpoints)
        self.stale: set[int] = set()  # up or not, these serve older weights than the run: never picked
        self.down_kind: dict[int, str] = {}  # why each down replica went down (FaultKind value)
        self.events: list[HealthEvent] = []
        self._probes: dict[int, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self.endpoints)

    def healthy(self) -> list[int]:
        """Indices of replicas currently up and serving the run's weights."""
        return [i for i, u in enumerate(self.up) if u and i not in self.stale]

    def mark_down(self, i: int, kind: FaultKind | str, detail: str = "") -> None:
        """Mark replica i down (once) and start probing it."""
        if not self.up[i]:
            return
        self.up[i] = False
        self.down_kind[i] = str(kind)
        self.events.append(HealthEvent(time.time(), i, False, f"{kind}: {detail}"[:200]))
        if i not in self._probes or self._probes[i].done():
            self._probes[i] = asyncio.get_running_loop().create_task(self._probe(i))

    def mark_stale(self, i: int, detail: str) -> None:
        """Replica i serves other weights than the run's (its samples say so): never picked until `WeightSync`
        updates it again; it stays up (nothing to probe)."""
        if i in self.stale:
            return
        self.stale.add(i)
        self.events.append(HealthEvent(time.time(), i, False, f"{FaultKind.STALE_VERSION}: {detail}"[:200]))

    def _mark_up(self, i: int, reason: str = "probe answered") -> None:
        self.up[i] = True
        self.down_kind.pop(i, None)
        self.events.append(HealthEvent(time.time(), i, True, reason))
        self._changed.set()
        self._changed = asyncio.Event()

    async def _probe(self, i: int) -> None:
        delay = self.policy.probe_interval_s
        while not self.up[i]:
            await asyncio.sleep(delay)
            if await self.client.health(self.endpoints[i], timeout_s=min(5.0, self.policy.connect_timeout_s)):
                self._mark_up(i)
                return
            delay = min(self.policy.probe_max_s, delay * 2)

    async def reprobe_down(self) -> list[int]:
        """Health-check every replica that went down because it could not be reached (refused, disconnected: a
        server that died and may have been restarted) once, now, and mark up those that answer. Called right before
        a step's dispatch, so a replica that came back while its probe was backing off serves this step. A replica
        down for what it answered (bad reply, 5xx, stall) waits for its probe's back-off: /health answering says
        nothing about those. Returns the readmitted ones."""
        unreachable = (FaultKind.REFUSED.value, FaultKind.DISCONNECT.value)
        down = [i for i, u in enumerate(self.up) if not u and self.down_kind.get(i) in unreachable]
        if not down:
            return []
        timeout = min(5.0, self.policy.connect_timeout_s)
        answers = await asyncio.gather(*(self.client.health(self.endpoints[i], timeout_s=timeout) for i in down))
        back = [i for i, ok in zip(down, answers, strict=True) if ok and not self.up[i]]
        for i in back:
            self._mark_up(i, "re-probed before dispatch")
        return back

    async def check_all(self) -> None:
        """Probe every replica now (at run start): the ones that do not answer are marked down."""
        results = await asyncio.gather(*(self.client.health(e) for e in self.endpoints))
        for i, ok in enumerate(results):
            if not ok:
                self.mark_down(i, FaultKind.REFUSED, "health check failed")

    def pick(self, planned: int, pool: Iterable[int], load: Sequence[int]) -> int | None:
        """`planned` if up and not stale; else the least-loaded usable replica of its pool; else of any; else None."""
        if self.up[planned] and planned not in self.stale:
            return planned
        same = [i for i in pool if self.up[i] and i not in self.stale]
        cands = same or self.healthy()
        if not cands:
            return None
        return min(cands, key=lambda i: (load[i], i))

    async def wait_any(self, timeout_s: float) -> bool:
        """Wait until some replica is up (True) or the timeout passes (False)."""
        if self.healthy():
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        return bool(self.healthy())

    async def close(self) -> None:
        """Stop the probes."""
        for t in self._probes.values():
            t.cancel()
        await asyncio.gather(*self._probes.values(), return_exceptions=True)
        self._probes.clear()
