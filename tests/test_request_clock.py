"""`RequestClock`: the stall limit with its slack, the total deadline, and which fault a timed-out request reports."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from tailsieve.engines.transport.request_clock import STALL_SLACK, RequestClock
from tailsieve.engines.transport.types import FaultKind


@dataclass
class _Loop:
    """A loop whose time is set by the test (the clock reads only `time()`)."""

    now: float = 100.0

    def time(self) -> float:
        return self.now


@dataclass
class _Scope:
    """Records every `reschedule` the clock asks of its timeout scope."""

    moves: list[float] = field(default_factory=list)

    def reschedule(self, when: float) -> None:
        self.moves.append(when)


def _clock(loop: _Loop, stall_s: float, deadline_s: float | None) -> RequestClock:
    return RequestClock(cast(asyncio.AbstractEventLoop, loop), stall_s, deadline_s)


def test_the_stall_limit_carries_its_slack_and_the_deadline_caps_it() -> None:
    loop = _Loop()
    clock = _clock(loop, 16.0, None)
    assert clock.limit() == 100.0 + 16.0 * (1 + STALL_SLACK)
    capped = _clock(loop, 16.0, 5.0)
    loop.now = 103.0
    assert capped.limit() == 105.0  # t0 + deadline comes before now + stall
    assert capped.elapsed() == 3.0


def test_progress_moves_the_limit_at_most_once_per_slack() -> None:
    loop = _Loop()
    clock = _clock(loop, 16.0, None)
    clock.limit()  # armed at 100
    scope = _Scope()
    loop.now = 100.0 + 16.0 * STALL_SLACK  # exactly one slack later: not yet
    clock.progressed(cast(Any, scope))
    assert scope.moves == []
    loop.now = 101.5
    clock.progressed(cast(Any, scope))
    assert scope.moves == [101.5 + 16.0 * (1 + STALL_SLACK)]
    clock.progressed(cast(Any, scope))  # same instant: the limit was just armed
    assert len(scope.moves) == 1


@pytest.mark.parametrize(("elapsed", "kind", "text"), [
    (4.0, FaultKind.STALL, "no tokens for 2s"),
    (9.9995, FaultKind.DEADLINE, "request not done within its 10s deadline"),
    (12.0, FaultKind.DEADLINE, "request not done within its 10s deadline"),
])
def test_a_timed_out_request_says_whether_it_stalled_or_ran_past_its_deadline(
        elapsed: float, kind: FaultKind, text: str) -> None:
    loop = _Loop()
    clock = _clock(loop, 2.0, 10.0)
    loop.now += elapsed
    fault = clock.fault("http://r0")
    assert fault.kind is kind
    assert text in str(fault)


def test_without_a_deadline_a_timeout_is_a_stall() -> None:
    loop = _Loop()
    clock = _clock(loop, 2.0, None)
    loop.now += 1e6
    assert clock.fault("http://r0").kind is FaultKind.STALL
