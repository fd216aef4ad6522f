"""`RunWeights` (engines/rollout/run_weights.py) on fake servers (real HTTP, tests/engine_fake.py): the run's weight
version before and after `attach` (stamped on the executor, which then excludes replicas reporting another), the
verification of a resumed run's servers, an update in place, the refusal before `attach`, the stale replicas that
stop a step (`before_step`), and `refuse_stale`'s two one-line refusals. The same through `Rollout`:
tests/test_weight_versions.py and tests/test_weight_verify.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_fake import FakeServer
from tailsieve.engines.rollout.batch import Batch, GroupResult
from tailsieve.engines.rollout.engine_executor import EngineExecutor, Sample
from tailsieve.engines.rollout.run_weights import RunWeights, refuse_stale
from tailsieve.engines.rollout.weight_sync import StaleBatch, StaleReplicas, UpdateMethod
from tailsieve.engines.transport.engine_client import ClientOptions, Endpoint, EngineClient, SamplingParams
from tailsieve.engines.transport.health import FaultPolicy, Replicas
from tailsieve.errors import ConfigError
from tailsieve.loop import StepRecord
from tailsieve.policy.step import Pool


@pytest.fixture
def two() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b:
        yield [a, b]


async def attached(servers: list[FakeServer], weights: RunWeights) -> tuple[EngineExecutor, Replicas, EngineClient]:
    client = EngineClient(ClientOptions(api_key_env=None))
    client.open()
    replicas = Replicas([Endpoint(s.url) for s in servers], client, FaultPolicy())
    ex = EngineExecutor(replicas, "fake", SamplingParams(max_tokens=8), 2)
    await weights.attach(replicas, ex)
    return ex, replicas, client


def test_the_version_is_a_number_until_attached_then_the_executor_stamps_it(two: list[FakeServer],
                                                                             tmp_path: Path) -> None:
    w = RunWeights()
    w.restore(0)
    assert (w.version, w.check, w.sync) == (0, None, None)

    async def go() -> tuple[int, bool, int, int, list[UpdateMethod]]:
        ex, replicas, client = await attached(two, w)
        try:
            stamped = ex.weight_version, ex.exclude_other_versions
            done = await w.update(ex, tmp_path)
            return stamped[0], stamped[1], done.version, ex.weight_version, list(done.methods)
        finally:
            await replicas.close()
            await client.close()

    assert asyncio.run(go()) == (0, True, 1, 1, [UpdateMethod.IN_PLACE] * 2)
    assert w.version == 1 and w.check is None  # a fresh run (version 0) verifies nothing at attach
    assert [s.reloads for s in two] == [[str(tmp_path.resolve())]] * 2


def test_an_update_before_attach_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^Rollout is not open: use `async with Rollout\(\.\.\.\) as r`$"):
        asyncio.run(RunWeights().update(None, tmp_path))


def test_a_resumed_version_is_verified_and_stale_replicas_stop_the_step(two: list[FakeServer]) -> None:
    two[0].version_label, two[1].version_label = "3", "2"  # replica 1 never got version 3
    w = RunWeights(version=3)

    async def go() -> tuple[int, tuple[str | None, ...], set[int], str]:
        ex, replicas, client = await attached(two, w)
        try:
            check = w.check
            assert check is not None
            await w.before_step()  # replica 0 serves version 3: the step may run
            two[0].version_label = "2"  # its weights change behind the run
            assert w.sync is not None
            await w.sync.verify()
            with pytest.raises(StaleReplicas) as err:
                await w.before_step()
            await w.before_step(require_fresh=False)  # a peer steps on what it has (april-partial is off-policy)
            return ex.weight_version, check.reported, set(replicas.stale), str(err.value)
        finally:
            await replicas.close()
            await client.close()

    version, reported, stale, err = asyncio.run(go())
    assert (version, reported, stale) == (3, ("3", "2"), {0, 1})
    assert err == (f"no replica serves weight version 3 ({two[0].url} reports '2', {two[1].url} reports '2'): push the "
                   "weights with update_weights before stepping")


def sample(version: int, served: str | None = None) -> Sample:
    return Sample("x", 1, "stop", None, 0, 0.1, 1, weight_version=version, served_version=served)


def batch(version: int, *samples: Sample) -> Batch:
    group = GroupResult(0, "p0", "p", Pool.BULK, 0.1, samples)
    record = StepRecord(step=4, makespan_s=0.1, tail_s=0.0, bulk_s=0.1, q=0, m=0, candidates=0, wasted_tokens=0,
                        batch_mean_length=1.0)
    return Batch(4, (group,), record, (), 0, 0.0, (), weight_version=version)


def test_a_batch_with_samples_older_than_its_weights_is_refused() -> None:
    refuse_stale(batch(2, sample(2), sample(2, "2")))  # on-policy: nothing happens
    with pytest.raises(StaleBatch, match=r"^step 4: 1 consumed sample\(s\) predate weight version 2 \(update_weights "
                                         r"ran during the step\); the step was not consumed, run it again$"):
        refuse_stale(batch(2, sample(1), sample(2)))
    with pytest.raises(StaleBatch, match=r"^step 4: 1 consumed sample\(s\) predate weight version 2 \(1 were served "
                                         r"under another version than the run's"):
        refuse_stale(batch(2, sample(2, "1"), sample(2)))
