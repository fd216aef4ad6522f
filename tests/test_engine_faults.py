"""Replica faults on fake servers: refused, 5xx, stall, dropped connection → marked down, work re-dispatched
(same pool first), probed and taken back; no healthy replica → a clear error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from engine_fake import FakeServer
from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.transport.engine_client import EngineError, NoHealthyReplica, SamplingParams
from tailsieve.engines.transport.health import FaultPolicy
from tailsieve.policy.step import GroupStatus

PROMPTS = tuple(PromptRecord(f"p{i}", f"prompt number {i}") for i in range(60))
# stall timer 1.5 s: a healthy fake replica on a machine loaded by other jobs can pause 0.4 s between tokens
FAST = FaultPolicy(stall_timeout_s=1.5, backoff_s=0.01, probe_interval_s=0.1, probe_max_s=0.2, no_healthy_wait_s=0.3)


@pytest.fixture
def three() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b, FakeServer() as c:
        yield [a, b, c]


def cfg(**kw: object) -> RolloutConfig:
    base = RolloutConfig(groups=6, group_size=4, rho=0.5, policy="static", q=1, m=1,
                         sampling=SamplingParams(max_tokens=40), faults=FAST)
    return replace(base, **kw)  # type: ignore[arg-type]


async def run_steps(urls: list[str], c: RolloutConfig, k: int, between: object = None) -> list[Batch]:
    out = []
    async with Rollout(urls, c, PROMPTS) as r:
        for i in range(k):
            if callable(between):
                between(i)
            out.append(await r.step())
    return out


def check(batches: list[Batch], n: int = 6, g: int = 4) -> None:
    seen: set[int] = set()
    for b in batches:
        assert len(b.groups) == n and all(len(x.samples) == g for x in b.groups)
        uids = {x.uid for x in b.groups}
        assert not uids & seen
        seen |= uids
        assert sum(o.status is GroupStatus.DONE for o in b.outcomes) == n


@pytest.mark.parametrize("mode", ["500", "stall", "drop"])
def test_fault_mid_step_redispatches_and_completes(three: list[FakeServer], mode: str) -> None:
    three[0].fail_after, three[0].then = 3, mode  # replica 0 (bulk pool) fails after 3 requests
    batches = asyncio.run(run_steps([s.url for s in three], cfg(), 2))
    check(batches)
    assert batches[0].redispatched > 0
    moved = [s for b in batches for g in b.groups for s in g.samples if s.attempts > 1]
    assert moved and all(s.replica != 0 for s in moved)
    # same pool first: step 1's bulk pool is replicas {0, 1}, so re-dispatched bulk work lands on 1
    assert all(s.replica == 1 for g in batches[1].groups if g.pool.value == "bulk" for s in g.samples
               if s.attempts > 1)


def test_refused_at_start_runs_on_the_rest(three: list[FakeServer]) -> None:
    three[1].stop()
    batches = asyncio.run(run_steps([s.url for s in three], cfg(), 2))
    check(batches)
    assert all(s.replica != 1 for b in batches for g in b.groups for s in g.samples)
    assert batches[-1].down == (1,)


def test_down_replica_is_probed_and_taken_back(three: list[FakeServer]) -> None:
    three[2].mode = "500"

    def heal(i: int) -> None:
        if i == 1:
            three[2].mode = "ok"
            time.sleep(0.5)  # probes (every ≤ 0.2 s) see /health answer again

    batches = asyncio.run(run_steps([s.url for s in three], cfg(), 3, between=heal))
    check(batches)
    assert batches[0].down == (2,)
    assert batches[-1].down == ()
    assert any(s.replica == 2 for g in batches[-1].groups for s in g.samples)


def test_no_healthy_replica_is_a_clear_error(three: list[FakeServer]) -> None:
    for s in three:
        s.stop()
    t0 = time.monotonic()
    with pytest.raises(NoHealthyReplica, match="no endpoint answers"):
        asyncio.run(run_steps([s.url for s in three], cfg(), 1))
    assert time.monotonic() - t0 < 10


def test_all_fail_mid_step_gives_up(three: list[FakeServer]) -> None:
    for s in three:
        s.fail_after, s.then = 2, "500"
    with pytest.raises(EngineError, match="no healthy replica|failed"):
        asyncio.run(run_steps([s.url for s in three], cfg(), 1))


def test_retries_are_bounded(three: list[FakeServer]) -> None:
    for s in three:
        s.mode = "drop"
    with pytest.raises(EngineError):
        asyncio.run(run_steps([s.url for s in three], cfg(faults=replace(FAST, retries=1)), 1))
