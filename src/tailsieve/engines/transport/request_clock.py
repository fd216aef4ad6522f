"""One request's timers (`engines/transport/engine_client.py`): the stall limit, restarted by progress with a slack
so that a streamed reply does not reschedule a timer per token chunk, and the optional total deadline."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tailsieve.engines.transport.types import FaultKind, ReplicaFault

__all__ = ["STALL_SLACK", "RequestClock"]

STALL_SLACK = 1 / 16  # the stall timer is moved at most once per this share of the stall timeout


@dataclass(slots=True)
class RequestClock:
    """One request's timers: the stall limit (restarted by progress) and the optional total deadline."""

    loop: asyncio.AbstractEventLoop
    stall_s: float
    deadline_s: float | None
    t0: float = 0.0
    armed: float = 0.0  # when the stall limit was last set

    def __post_init__(self) -> None:
        self.t0 = self.loop.time()

    def elapsed(self) -> float:
        """Seconds since the request started."""
        return self.loop.time() - self.t0

    def limit(self) -> float:
        """When the request times out if nothing more happens (loop time): the stall limit with its slack (see
        `progressed`), or the total deadline when that comes first."""
        self.armed = now = self.loop.time()
        stall = now + self.stall_s * (1.0 + STALL_SLACK)
        return stall if self.deadline_s is None else min(stall, self.t0 + self.deadline_s)

    def progressed(self, scope: asyncio.Timeout) -> None:
        """Tokens arrived: move the stall limit, at most once per `STALL_SLACK`·stall seconds (rescheduling a
        timer per token chunk cost more CPU than parsing it). The limit is armed with that slack, so a stall is
        reported between stall_s and (1 + STALL_SLACK)·stall_s after the last token, never early."""
        if self.loop.time() - self.armed > self.stall_s * STALL_SLACK:
            scope.reschedule(self.limit())

    def fault(self, url: str) -> ReplicaFault:
        """The fault of a request that timed out: past its deadline, or stalled."""
        if self.deadline_s is not None and self.elapsed() >= self.deadline_s - 1e-3:
            return ReplicaFault(url, FaultKind.DEADLINE, f"request not done within its {self.deadline_s:g}s deadline")
        return ReplicaFault(url, FaultKind.STALL, f"no tokens for {self.stall_s:g}s")
