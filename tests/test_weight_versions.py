"""Weight versions against fake vLLM servers: `Rollout.update_weights` in place, the restart fallback, a framework's
push hook, stale replicas never used until refreshed, versions saved with the state, and the trainer-ready view
(prompt/response ids, logprobs, version, group) of every consumed sample."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine_fake import FAKE_PROMPT_IDS, FakeServer, fake_logprob
from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.rollout.state import RolloutState
from tailsieve.engines.rollout.weight_sync import StaleBatch, StaleReplicas, UpdateMethod
from tailsieve.engines.transport.engine_client import Api, Endpoint, EngineError, SamplingParams
from tailsieve.errors import ConfigError, TailSieveError

PROMPTS = tuple(PromptRecord(f"p{i}", f"prompt number {i}") for i in range(60))


@pytest.fixture
def servers() -> Iterator[list[FakeServer]]:
    with FakeServer() as a, FakeServer() as b, FakeServer() as c:
        yield [a, b, c]


def config(**kw: object) -> RolloutConfig:
    base = RolloutConfig(groups=4, group_size=4, rho=0.5, policy="static", q=1, m=1,
                         sampling=SamplingParams(max_tokens=40), logprobs=True)
    return replace(base, **kw)  # type: ignore[arg-type]


def ckpt(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def test_in_place_update_versions_every_later_sample(servers: list[FakeServer], tmp_path: Path) -> None:
    async def run() -> tuple[list[int], list[set[int]], RolloutState, list[UpdateMethod]]:
        async with Rollout([s.url for s in servers], config(), PROMPTS) as r:
            versions, seen, methods = [], [], []
            for t in range(4):
                b = await r.step()
                versions.append(b.weight_version)
                seen.append({s.weight_version for g in b.groups for s in g.samples})
                assert b.stale_samples == 0
                up = await r.update_weights(ckpt(tmp_path, f"step{t}"))
                methods = list(up.methods)
            return versions, seen, r.state(), methods

    versions, seen, state, methods = asyncio.run(run())
    assert versions == [0, 1, 2, 3] and seen == [{0}, {1}, {2}, {3}]
    assert methods == [UpdateMethod.IN_PLACE] * 3
    for s in servers:
        assert s.reloads == [str((tmp_path / f"step{t}").resolve()) for t in range(4)]
        assert s.cache_resets == 4 and s.version_label == "4"
    assert state.weight_version == 4
    assert RolloutState.from_json(state.to_json()).weight_version == 4


def test_restored_run_continues_the_version(servers: list[FakeServer], tmp_path: Path) -> None:
    async def run(state: RolloutState | None) -> tuple[int, RolloutState]:
        async with Rollout([s.url for s in servers], config(), PROMPTS, state=state) as r:
            if state is None:
                await r.step()
                await r.update_weights(ckpt(tmp_path, "a"))
            b = await r.step()
            return b.weight_version, r.state()

    v1, st = asyncio.run(run(None))
    v2, _ = asyncio.run(run(st))
    assert v1 == 1 and v2 == 1


def test_an_update_during_a_step_refuses_the_batch_and_keeps_its_groups(servers: list[FakeServer],
                                                                         tmp_path: Path) -> None:
    """update_weights while a step runs: that step's consumed samples predate the new version, so the batch is
    refused with one StaleBatch line, and the state has not moved: the next step is the same step number and the
    refused step's groups are consumed then, exactly once (consumed ∪ waiting = every draw, none twice)."""
    for s in servers:
        s.tpot_s = 0.01  # a step of ~0.4 s: the update lands inside it

    async def run() -> tuple[list[Batch], BaseException | None, dict[str, Any], dict[str, Any], RolloutState]:
        async with Rollout([s.url for s in servers], config(), PROMPTS) as r:
            batches = [await r.step()]
            before = r.state().to_json()

            async def update_soon() -> None:
                await asyncio.sleep(0.05)
                await r.update_weights(ckpt(tmp_path, "mid"))

            refused, _ = await asyncio.gather(r.step(), update_soon(), return_exceptions=True)
            after = r.state().to_json()
            batches += [await r.step(), await r.step()]
            return batches, refused if isinstance(refused, BaseException) else None, before, after, r.state()

    batches, refused, before, after, state = asyncio.run(run())
    assert isinstance(refused, StaleBatch) and isinstance(refused, TailSieveError)
    assert len(str(refused).splitlines()) == 1 and str(refused).startswith("step 1: ")
    assert "update_weights ran during the step" in str(refused)
    assert {k: after[k] for k in ("router", "control", "generation")} == {
        k: before[k] for k in ("router", "control", "generation")}
    assert after["weight_version"] == 1 and before["weight_version"] == 0
    assert [b.step for b in batches] == [0, 1, 2] and [b.weight_version for b in batches] == [0, 1, 1]
    assert all(b.stale_samples == 0 for b in batches)
    consumed = [g.uid for b in batches for g in b.groups]
    waiting = [ref.uid for ref in state.router.waiting]
    assert state.router.stream is not None
    assert len(consumed) == len(set(consumed)) == 3 * 4 == state.router.consumed
    assert sorted(consumed + waiting) == list(range(state.router.stream.position))


def test_unsupported_server_falls_back_to_the_restart_hook(servers: list[FakeServer], tmp_path: Path) -> None:
    servers[1].reload = "404"
    calls: list[tuple[str, list[int]]] = []

    def reload(path: str, ids: Sequence[int]) -> float:
        calls.append((path, list(ids)))
        return 0.0

    async def run() -> list[UpdateMethod]:
        async with Rollout([s.url for s in servers], config(), PROMPTS, reload=reload) as r:
            up = await r.update_weights(ckpt(tmp_path, "w"))
            b = await r.step()
            assert {s.replica for g in b.groups for s in g.samples} <= {0, 1, 2}
            return list(up.methods)

    assert asyncio.run(run()) == [UpdateMethod.IN_PLACE, UpdateMethod.RESTART, UpdateMethod.IN_PLACE]
    assert calls == [(str((tmp_path / "w").resolve()), [1])]


def test_a_stale_replica_is_never_used_until_refreshed(servers: list[FakeServer], tmp_path: Path) -> None:
    servers[0].reload = "500"
    cfg = config(policy="uniform", q=None, m=None)

    async def run() -> tuple[set[int], set[int], tuple[str, ...]]:
        async with Rollout([s.url for s in servers], cfg, PROMPTS) as r:
            await r.step()
            before = servers[0].started
            up = await r.update_weights(ckpt(tmp_path, "w"))
            assert up.methods[0] is UpdateMethod.STALE and up.updated == 2
            b = await r.step()
            assert servers[0].started == before  # nothing sent to the stale replica
            used_stale = {s.replica for g in b.groups for s in g.samples}
            servers[0].reload = "ok"  # fixed: the next step's refresh updates it first
            b2 = await r.step()
            assert {s.weight_version for g in b2.groups for s in g.samples} == {1}
            return used_stale, {s.replica for g in b2.groups for s in g.samples}, up.errors

    used_stale, used_after, errors = asyncio.run(run())
    assert 0 not in used_stale and 0 in used_after
    assert len(errors) == 1 and "reload_weights failed: HTTP 500" in errors[0]
    assert servers[0].reloads == [str((tmp_path / "w").resolve())]


def test_failure_everywhere_is_one_line_and_keeps_the_version(servers: list[FakeServer], tmp_path: Path) -> None:
    for s in servers:
        s.reload = "404"

    async def run() -> int:
        async with Rollout([s.url for s in servers], config(), PROMPTS) as r:
            with pytest.raises(EngineError, match=r"failed on every replica: .*VLLM_SERVER_DEV_MODE=1") as e:
                await r.update_weights(ckpt(tmp_path, "w"))
            assert "\n" not in str(e.value)
            with pytest.raises(ConfigError, match="does not exist"):
                await r.update_weights(tmp_path / "missing")
            with pytest.raises(ConfigError, match="must increase: 0 after 0"):
                await r.update_weights(ckpt(tmp_path, "v"), version=0)
            with pytest.raises(ConfigError, match="exactly one"):
                await r.update_weights()
            return r.weight_version

    assert asyncio.run(run()) == 0


def test_push_hook_is_called_per_replica(servers: list[FakeServer]) -> None:
    pushed: list[tuple[int, str, int]] = []

    async def push(i: int, ep: Endpoint, version: int) -> None:
        pushed.append((i, ep.url, version))

    async def run() -> int:
        async with Rollout([s.url for s in servers], config(), PROMPTS) as r:
            up = await r.update_weights(push=push, version=7)
            assert up.methods == (UpdateMethod.PUSH,) * 3 and up.path is None
            b = await r.step()
            return b.weight_version

    assert asyncio.run(run()) == 7
    assert sorted(pushed) == [(i, s.url, 7) for i, s in enumerate(servers)]
    assert all(not s.reloads for s in servers)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("api", [Api.COMPLETIONS, Api.CHAT])
def test_trainer_samples_carry_ids_logprobs_version_and_group(servers: list[FakeServer], stream: bool,
                                                              api: Api) -> None:
    async def run() -> None:
        async with Rollout([s.url for s in servers], config(stream=stream, api=api), PROMPTS) as r:
            b = await r.step()
            rows = b.trainer_samples()
            assert len(rows) == 4 * 4
            assert [x.group_uid for x in rows] == [g.uid for g in b.groups for _ in range(4)]
            for x in rows:
                assert x.response_token_ids is not None and x.logprobs is not None
                assert len(x.logprobs) == len(x.response_token_ids)
                assert list(x.logprobs) == pytest.approx([fake_logprob(t) for t in range(len(x.logprobs))])
                assert x.prompt_token_ids == (None if api is Api.CHAT else tuple(FAKE_PROMPT_IDS))
                assert x.weight_version == 0 and x.finish_reason in ("stop", "length")
                assert x.to_json()["pool"] in ("tail", "bulk")
            assert all(b["logprobs"] == (True if api is Api.CHAT else 0) for s in servers for b in s.bodies)

    asyncio.run(run())


def saved_at(version: int, servers: list[FakeServer], cfg: RolloutConfig) -> RolloutState:
    """A state saved at `version` by a run of this shape (what a trainer's checkpoint holds)."""
    async def run() -> RolloutState:
        async with Rollout([s.url for s in servers], cfg, PROMPTS) as r:
            await r.step()
            return replace(r.state(), weight_version=version)

    return asyncio.run(run())


def test_restoring_onto_servers_that_never_got_the_weights_reports_stale_replicas(servers: list[FakeServer],
                                                                                    tmp_path: Path) -> None:
    """A state saved at version 5 resumed on freshly started servers (they report vLLM's initial label "default"):
    every replica is stale, a step is one `StaleReplicas` line instead of samples labelled 5, and nothing moves;
    once `update_weights` has pushed version 6 the servers report "6" and the step runs on-policy."""
    cfg = config(policy="uniform", q=None, m=None)
    state = saved_at(5, servers, cfg)
    for s in servers:
        s.version_label = "default"  # restarted: they serve their initial weights again

    async def run() -> None:
        async with Rollout([s.url for s in servers], cfg, PROMPTS, state=state) as r:
            check = r.version_check
            assert check is not None and check.version == 5
            assert check.reported == ("default",) * 3 and check.stale == (0, 1, 2)
            started = [s.started for s in servers]
            with pytest.raises(StaleReplicas) as e:
                await r.step()
            assert str(e.value) == ("no replica serves weight version 5 (" + ", ".join(
                f"{s.url} reports 'default'" for s in servers) + "): push the weights with update_weights before "
                "stepping")
            assert isinstance(e.value, TailSieveError) and [s.started for s in servers] == started
            assert r.state().to_json() == state.to_json()  # nothing moved
            up = await r.update_weights(ckpt(tmp_path, "w6"))
            assert up.version == 6 and up.methods == (UpdateMethod.IN_PLACE,) * 3 and up.reported == ("6",) * 3
            b = await r.step()
            assert b.step == state.router.step and b.weight_version == 6 and b.stale_samples == 0
            assert {s.weight_version for g in b.groups for s in g.samples} == {6}

    asyncio.run(run())


def test_only_the_replicas_reporting_the_saved_version_serve(servers: list[FakeServer]) -> None:
    cfg = config(policy="uniform", q=None, m=None)
    state = saved_at(5, servers, cfg)
    servers[0].version_label, servers[1].version_label, servers[2].version_label = "default", "5", "4"

    async def run() -> set[int]:
        async with Rollout([s.url for s in servers], cfg, PROMPTS, state=state) as r:
            assert r.version_check is not None and r.version_check.stale == (0, 2)
            b = await r.step()
            assert b.weight_version == 5 and b.stale_samples == 0
            return {s.replica for g in b.groups for s in g.samples}

    before = [s.started for s in servers]
    assert asyncio.run(run()) == {1}
    assert servers[0].started == before[0] and servers[2].started == before[2]


def test_a_server_that_does_not_report_its_version_is_trusted(servers: list[FakeServer]) -> None:
    """vLLM without VLLM_SERVER_DEV_MODE=1 has no /weight_info: its version cannot be read back, so it is used
    (docs/engines.md says so); the ones that do report are still checked."""
    cfg = config(policy="uniform", q=None, m=None)
    state = saved_at(5, servers, cfg)
    servers[0].version_info = False
    servers[1].version_label = "5"

    async def run() -> tuple[tuple[str | None, ...], tuple[int, ...]]:
        async with Rollout([s.url for s in servers], cfg, PROMPTS, state=state) as r:
            assert r.version_check is not None
            return r.version_check.reported, r.version_check.stale

    assert asyncio.run(run()) == ((None, "5", "default"), (2,))


def test_a_replica_whose_weights_change_behind_the_run_is_caught_and_refreshed(servers: list[FakeServer],
                                                                                tmp_path: Path) -> None:
    """After an update, a replica that restarts (its label back to "default") is found stale by `verify()` and not
    used; the next step's `refresh` reloads the run's checkpoint into it, reads "1" back and uses it again."""
    cfg = config(policy="uniform", q=None, m=None)

    async def run() -> tuple[set[int], set[int]]:
        async with Rollout([s.url for s in servers], cfg, PROMPTS) as r:
            await r.update_weights(ckpt(tmp_path, "w1"))
            servers[2].version_label = "default"
            assert r.weights is not None
            check = await r.weights.verify()
            assert check.reported == ("1", "1", "default") and check.stale == (2,)
            servers[2].reload = "500"  # the refresh fails: still excluded
            b1 = await r.step()
            servers[2].reload = "ok"
            b2 = await r.step()
            assert b1.stale_samples == b2.stale_samples == 0
            return {s.replica for g in b1.groups for s in g.samples}, {s.replica for g in b2.groups for s in g.samples}

    used1, used2 = asyncio.run(run())
    assert 2 not in used1 and 2 in used2 and servers[2].version_label == "1"


def test_an_update_the_server_does_not_take_is_stale(servers: list[FakeServer], tmp_path: Path) -> None:
    """A server that answers the update but still reports its old version afterwards is stale in the update's own
    report (method, version read back, one error line naming it) and is not used."""
    servers[0].takes_label = False

    async def run() -> tuple[Any, set[int]]:
        async with Rollout([s.url for s in servers], config(policy="uniform", q=None, m=None), PROMPTS) as r:
            up = await r.update_weights(ckpt(tmp_path, "w1"))
            b = await r.step()
            return up, {s.replica for g in b.groups for s in g.samples}

    up, used = asyncio.run(run())
    assert up.methods == (UpdateMethod.STALE, UpdateMethod.IN_PLACE, UpdateMethod.IN_PLACE) and up.updated == 2
    assert up.reported == ("default", "1", "1")
    assert up.errors == (f"{servers[0].url} reports weight version 'default' after the update to 1",)
    assert 0 not in used


def test_a_sample_its_server_labels_with_another_version_is_stale() -> None:
    """`Batch.stale_samples` counts samples sent under an older version and samples whose server reported (SGLang's
    meta_info.weight_version) another version than the one they were sent under; version 0 and unreported
    versions are never stale."""
    from tailsieve.engines.rollout.batch import GroupResult
    from tailsieve.engines.rollout.engine_executor import Sample
    from tailsieve.loop import StepRecord
    from tailsieve.policy.step import Pool

    def s(sent: int, served: str | None) -> Sample:
        return Sample("x", 1, "stop", (1,), 0, 0.0, 1, weight_version=sent, served_version=served)

    samples = (s(3, "3"), s(3, "2"), s(3, None), s(2, "2"), s(0, "default"))
    record = StepRecord(step=0, makespan_s=1.0, tail_s=0.0, bulk_s=1.0, q=0, m=0, candidates=0, wasted_tokens=0,
                        batch_mean_length=1.0)
    b = Batch(0, (GroupResult(0, "p", "p", Pool.BULK, 1.0, samples),), record, (), 0, 0.0, (), weight_version=3)
    assert b.served_stale == 1  # s(3, "2")
    assert b.stale_samples == 3  # s(3, "2"), and the two sent under versions 2 and 0


@pytest.mark.parametrize(("exc", "line"), [
    (OSError(), "OSError"),
    (TimeoutError("   "), "TimeoutError"),
    (ConnectionError("reset by peer\nsecond line"), "reset by peer"),
    (OSError("x" * 400), "x" * 300),
])
def test_an_update_error_is_one_short_line(exc: BaseException, line: str) -> None:
    """Update errors are listed by their first line (300 characters at most), an empty message by its type: an
    `OSError()` used to stop the update with an IndexError."""
    from tailsieve.engines.rollout.weight_sync import _first_line

    assert _first_line(exc) == line
